"""Entry point of the `flashsim` console script: builds the parser from the verb modules and turns
user errors into one line on stderr with exit code 2 (a traceback only with --debug).

Start-up is lazy: `flashsim VERB ...` imports only VERB's module, and `flashsim --help` imports none
(the verbs' one-line help is `VERBS`, checked against what each module registers by
tests/test_cli_startup.py), so help answers before NumPy, pandas or matplotlib are loaded."""

from __future__ import annotations

import argparse
import errno
import importlib
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

STARTED_S = time.perf_counter()   # the command's clock when /proc cannot say when the process started

# Each module defines `register(subparsers)`; its sub-commands set `func(args) -> int`.
COMMAND_MODULES = (
    "flashsim.commands.catalog",   # devices, models
    "flashsim.commands.capture",   # capture
    "flashsim.commands.trace",     # trace stats|synth|profile
    "flashsim.commands.replay",    # replay
    "flashsim.commands.real",      # real convert|info|verify|read|mmap|train-predictor (+ run, predictor-errors, quant-quality)
    "flashsim.commands.validate",  # validate
    "flashsim.commands.calibrate", # calibrate (bench flash -> bench compute -> profile -> validate --quick)
    "flashsim.commands.bench",     # bench flash|compute
    "flashsim.commands.demo",      # demo
    "flashsim.commands.plan",      # plan
    "flashsim.commands.sweep",     # sweep
    "flashsim.commands.plot",      # plot
    "flashsim.commands.report",    # report
    "flashsim.commands.adapt",     # adapt gsi
)
# verb -> (its module, its one-line help as the module registers it)
VERBS: dict[str, tuple[str, str]] = {
    "devices": ("flashsim.commands.catalog", "list device profiles, or show one"),
    "models": ("flashsim.commands.catalog", "list bundled model specs, or show one"),
    "capture": ("flashsim.commands.capture", "capture FFN activations of a real model into a trace"),
    "trace": ("flashsim.commands.trace", "trace statistics, synthetic traces and the offline neuron profiler"),
    "replay": ("flashsim.commands.replay", "simulate a trace on a device under a policy preset"),
    "real": ("flashsim.commands.real", "real backend: weight stores, direct-I/O reads, mmap baseline"),
    "validate": ("flashsim.commands.validate", "run a grid of configurations on the real backend and report the "
                                               "simulator's error against it"),
    "calibrate": ("flashsim.commands.calibrate", "bench flash -> bench compute -> device profile -> validate --quick, "
                                                 "in one go"),
    "bench": ("flashsim.commands.bench", "microbenchmarks of flash and compute -> a device profile"),
    "demo": ("flashsim.commands.demo", "the main job: trace, replay every preset, plan, report"),
    "plan": ("flashsim.commands.plan", "what-if: feasibility, best policy, minimum DRAM for a target"),
    "sweep": ("flashsim.commands.sweep", "run a grid of simulations from a sweep file (resumable)"),
    "plot": ("flashsim.commands.plot", "draw one figure (PNG and SVG) from results"),
    "report": ("flashsim.commands.report", "write a self-contained HTML report of sweep results"),
    "adapt": ("flashsim.commands.adapt", "runtime adaptation to a memory budget (GSI block importance)"),
}


class _Parser(argparse.ArgumentParser):
    """argparse already exits 2 on usage errors; keep its message to one line plus the usage hint."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")

    def _check_value(self, action: argparse.Action, value: object) -> None:
        """A value outside an option's choices (or an unknown verb) names the closest choices too."""
        if action.choices is not None and value not in action.choices:
            from devices.suggest import did_you_mean

            choices = [str(c) for c in action.choices]
            suggestion = did_you_mean(str(value), choices)
            if suggestion:
                raise argparse.ArgumentError(
                    action, f"invalid choice: {value!r}; {suggestion} (choose from {', '.join(choices)})")
        super()._check_value(action, value)


def _verb(argv: Sequence[str] | None) -> str | None:
    """The verb of a command line (its first word that is not an option), or None."""
    for a in (sys.argv[1:] if argv is None else argv):
        if not a.startswith("-"):
            return a
    return None


def build_parser(argv: Sequence[str] | None = None, *, lazy: bool = False) -> argparse.ArgumentParser:
    """The full parser; `lazy`: only the verb of `argv` is imported (the others get their one-line help)."""
    parser = _Parser(
        prog="flashsim",
        description="Will this LLM run on that device, from flash, fast enough? "
        "A trace-driven discrete-event simulator of flash, memory and compute, plus a real backend.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    verb = _verb(argv) if lazy else None
    if lazy and verb in VERBS:
        importlib.import_module(VERBS[verb][0]).register(sub)
    if not lazy:
        for name in COMMAND_MODULES:
            importlib.import_module(name).register(sub)
    else:
        for name, (_, text) in VERBS.items():      # the rest: listed in --help, loaded when used
            if name not in sub.choices:
                sub.add_parser(name, help=text)
    return parser


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so that every writer's cleanup (context managers,
    `finally`) runs before the process exits with 143."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(argv, lazy=True)
    args = parser.parse_args(argv)
    from devices.errors import FlashsimError
    from devices.progress import quiet_third_party
    from flashsim.allocator import tune_allocator

    if not getattr(args, "func", None):
        parser.print_help()
        return 2 if args.command is None else 0
    quiet_third_party()   # model-loading libraries' bars: none in logs (devices/progress.py)
    tune_allocator()      # large temporaries reused from the heap (flashsim/allocator.py)
    previous = _install_sigterm()
    try:
        check_thread_counts(args)
        return int(args.func(args) or 0)
    except FlashsimError as e:
        if args.debug:
            raise
        print(f"flashsim: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        _remove_temporaries()
        print("flashsim: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        _remove_temporaries()
        print("flashsim: terminated (SIGTERM); partial outputs removed", file=sys.stderr)
        return 143
    except BrokenPipeError:
        return 0
    except Exception as e:       # the environment or a user's policy, not flashsim's input checks
        line = environment_error(e)
        if line is None or args.debug:
            raise
        _remove_temporaries()
        print(f"flashsim: error: {line}", file=sys.stderr)
        return 2
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _install_sigterm() -> Any:
    """SIGTERM -> Terminated in the main thread; returns the handler to restore (None elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        return signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):
        return None


def _remove_temporaries() -> None:
    """Temporaries a writer of this process left (an interrupt between its write and its cleanup)."""
    from traces.outputs import live_temporaries, remove_path

    for p in live_temporaries():
        remove_path(p)


ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.EFBIG,
                      errno.ENAMETOOLONG, errno.EIO, errno.EMFILE, errno.ENFILE, errno.ENOMEM}


def environment_error(e: BaseException) -> str | None:
    """One line for an error of the machine rather than of flashsim: a full disk, a denied or
    read-only path, a file-size limit, memory exhaustion, a path that is not UTF-8, or an exception
    raised inside an out-of-tree policy (its class and hook); None for anything else (a bug: traceback)."""
    from sim.policies.external import policy_error

    line = policy_error(e)
    if line is not None:
        return line
    if isinstance(e, MemoryError):
        return "out of memory; free memory, or use a smaller model, fewer tokens or a smaller grid"
    if isinstance(e, UnicodeEncodeError) and "surrogate" in str(e.reason):
        return "a path or value is not valid UTF-8 text; rename it"
    if isinstance(e, OSError) and e.errno in ENVIRONMENT_ERRNOS:
        from traces.outputs import os_error_text

        where = f"{e.filename}: " if e.filename else ""
        return f"{where}{os_error_text(e)}"
    return None


MAX_THREADS = 1024  # no on-device decoder runs more compute threads; far beyond the core count OpenMP crashes


def check_thread_counts(args: argparse.Namespace) -> None:
    """Every verb's thread-count option (--threads, --compute-threads) is a whole number in
    [1, MAX_THREADS], checked before any work."""
    from devices.errors import FlashsimError

    for flag in ("threads", "compute_threads"):
        n = getattr(args, flag, None)
        if n is not None and not 1 <= n <= MAX_THREADS:
            raise FlashsimError(f"--{flag.replace('_', '-')} {n}: must be >= 1 and <= {MAX_THREADS} threads "
                                "(use the core count the real runs will use)")


if __name__ == "__main__":
    sys.exit(main())
