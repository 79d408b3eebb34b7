"""Entry point of the `flashsim` console script: builds the parser from the verb modules and turns
user errors into one line on stderr with exit code 2 (a traceback only with --debug)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from devices.errors import FlashsimError
from devices.progress import quiet_third_party
from devices.suggest import did_you_mean

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


class _Parser(argparse.ArgumentParser):
    """argparse already exits 2 on usage errors; keep its message to one line plus the usage hint."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")

    def _check_value(self, action: argparse.Action, value: object) -> None:
        """A value outside an option's choices (or an unknown verb) names the closest choices too."""
        if action.choices is not None and value not in action.choices:
            choices = [str(c) for c in action.choices]
            suggestion = did_you_mean(str(value), choices)
            if suggestion:
                raise argparse.ArgumentError(
                    action, f"invalid choice: {value!r}; {suggestion} (choose from {', '.join(choices)})")
        super()._check_value(action, value)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="flashsim",
        description="Will this LLM run on that device, from flash, fast enough? "
        "A trace-driven discrete-event simulator of flash, memory and compute, plus a real backend.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2 if args.command is None else 0
    quiet_third_party()   # model-loading libraries' bars: none in logs (devices/progress.py)
    try:
        check_thread_counts(args)
        return int(args.func(args) or 0)
    except FlashsimError as e:
        if args.debug:
            raise
        print(f"flashsim: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("flashsim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


MAX_THREADS = 1024  # no on-device decoder runs more compute threads; far beyond the core count OpenMP crashes


def check_thread_counts(args: argparse.Namespace) -> None:
    """Every verb's thread-count option (--threads, --compute-threads) is a whole number in
    [1, MAX_THREADS], checked before any work."""
    for flag in ("threads", "compute_threads"):
        n = getattr(args, flag, None)
        if n is not None and not 1 <= n <= MAX_THREADS:
            raise FlashsimError(f"--{flag.replace('_', '-')} {n}: must be >= 1 and <= {MAX_THREADS} threads "
                                "(use the core count the real runs will use)")


if __name__ == "__main__":
    sys.exit(main())
