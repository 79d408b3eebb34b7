"""`flashsim calibrate`: the calibration loop in one verb (docs/calibrate-and-validate.md):

    0. checks         --path exists, is a writable folder with room for the bench file and its
                      stores; --out can be written; --device cuda has a GPU: before any work
    1. bench flash    direct-I/O random-read grid on a file created in --path (removed afterwards),
                      with the CPU cost of one read request (flash.request_cpu_s)
    2. bench compute  GEMV per dtype, gather, DRAM bandwidth, per-op overhead (at --threads), on
                      the CPU; on a CUDA host also on the GPU (real/bench/bench_cuda.py)
    3. the profile    both sections merged into PROFILE.yaml with provenance (real.validation.profile_writer);
                      on a CUDA host also PROFILE-cuda.yaml: the same flash, the GPU's compute
    4. validate       `flashsim validate --quick` with the CPU profile (validate's real runs
                      compute on the CPU): the simulator's error per metric

It only orchestrates: steps 1-3 are real.validation.calibration.calibrate (the functions behind `flashsim
bench flash|compute` and real/validation/profile_writer.py) and real.bench.bench_cuda, step 4
real.validation.validate.run_validation. Units: bytes, seconds, bytes/s.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from devices.errors import FlashsimError
from devices.units import format_bytes, format_rate, parse_bytes
from flashsim.output import print_json


def register(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("calibrate", help="bench flash -> bench compute -> device profile -> validate --quick, in one go")
    c.add_argument("--path", default=".", help="an existing, writable folder on the disk that will hold the weights: "
                                               "a temporary bench file (--size) and validation's store are created "
                                               "there and removed; refused before any work without room for them "
                                               "(default: the current directory)")
    c.add_argument("--name", default="this-host", help="profile name (default this-host)")
    c.add_argument("--out", help="profile file to write (default devices/profiles/NAME.yaml)")
    c.add_argument("--quick", action="store_true", help="the benches' quick grids (64 MiB file, 3 chunk sizes x 2 "
                                                        "depths, small GEMV); validation is always --quick")
    c.add_argument("--size", help="size of the bench file (default 2GiB; --quick 64MiB)")
    c.add_argument("--threads", type=int, default=1, help="compute threads: bench compute measures with this many and "
                                                         "validate runs with as many (default 1)")
    c.add_argument("--modes", default="shape,model", help="validation modes (default shape,model)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--workdir", help="folder for validation's temporary store and traces (default: a temporary "
                   "folder in --path, so that validation's real runs read the disk just measured)")
    c.add_argument("--keep", metavar="DIR", help="keep the validation grid (executed traces and the real runs' "
                   "records) in this new folder, for `flashsim validate --rescore` elsewhere")
    c.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="where compute is measured "
                   "besides the CPU: auto (the GPU too when torch sees one; default), cpu, cuda")
    c.add_argument("--json", action="store_true", help="print one JSON object: flash, compute, profile, validate")
    c.set_defaults(func=_calibrate)


def _say(args: argparse.Namespace, text: str) -> None:
    if not args.json:
        print(text, file=sys.stderr, flush=True)


@contextlib.contextmanager
def quiet_third_party() -> Iterator[None]:
    """Silence third-party progress bars while calibrating (transformers' "Loading weights", the GGUF
    reader's "Converting and de-quantizing" bar, huggingface_hub's downloads): one model load drew
    about 30 redraws into a log, and the stage lines already say what runs. The environment reaches
    libraries imported later and child processes; tqdm, already imported by then, is told directly
    (every bar it makes is disabled until the block ends)."""
    import functools

    env = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    saved_env = {k: os.environ.get(k) for k in env}
    for k, v in env.items():
        os.environ.setdefault(k, v)
    import tqdm.std

    init = tqdm.std.tqdm.__dict__["__init__"]          # as stored (tqdm wraps it in a partialmethod)
    tqdm.std.tqdm.__init__ = functools.partialmethod(tqdm.std.tqdm.__init__, disable=True)  # type: ignore[method-assign]
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        tqdm.std.tqdm.__init__ = init  # type: ignore[method-assign]
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class WarningTee:
    """stderr as it was, keeping every line that warns (`WARNING: ...`, Python's `...Warning: ...`) for
    the printed summary: warnings must not scroll away with the progress lines."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.lines, self._part = stream, [], ""

    def write(self, text: str) -> int:
        self._part += text
        *done, self._part = self._part.split("\n")
        self.lines += [line.strip() for line in done if "WARNING" in line or "Warning:" in line]
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _calibrate(args: argparse.Namespace) -> int:
    tee = WarningTee(sys.stderr)
    sys.stderr = tee
    try:
        with quiet_third_party():
            return _calibrate_teed(args, tee)
    finally:
        sys.stderr = tee.stream


def _calibrate_teed(args: argparse.Namespace, tee: WarningTee) -> int:
    from flashsim.validation_output import print_validation, validate_progress
    from real.validation.calibration import calibrate
    from real.validation.profile_writer import default_path
    from real.validation.validate import run_validation
    from real.validation.validate_grid import parse_modes

    if args.threads < 1:
        raise FlashsimError(f"--threads {args.threads}: must be >= 1")
    modes = parse_modes(args.modes)
    folder = Path(args.path)
    target = Path(args.out) if args.out else default_path(args.name)
    size = parse_bytes(args.size, "--size") if args.size else (64 << 20 if args.quick else 2 << 30)
    check_bench_folder(folder, size + (VALIDATE_BYTES if args.workdir is None else 0), args.path)
    check_writable(target.parent, f"--out {target}")
    if args.keep is not None:
        from real.validation.validate_keep import check_keep_target

        check_keep_target(args.keep)
        check_writable(Path(args.keep).parent, f"--keep {args.keep}")
    from real.runtime.device import choose_device
    from real.validation.profile_writer import record_calibration
    from real.validation.verdict import calibration_verdict, verdict_line

    dev = choose_device(args.device) if args.device != "cpu" else None
    t0 = time.perf_counter()
    mode = "quick" if args.quick else "full"

    # 1-3. bench flash, bench compute, the profile (real.validation.calibration; written atomically, read back)
    _say(args, f"[1/4] bench flash, [2/4] bench compute ({args.threads} thread(s)) on "
               f"{format_bytes(size)} in {folder}")
    cal = calibrate(folder, target, args.name, threads=args.threads, seed=args.seed, quick=args.quick,
                    size_bytes=size, say=lambda text: _say(args, f"      {text}"))
    profile, flash, comp, flash_cmd, comp_cmd = (cal.profile, cal.flash, cal.compute, cal.flash_command,
                                                 cal.compute_command)
    # recorded before validating: a validation that does not finish leaves the profile saying so
    profile = record_calibration(target, mode, "not validated",
                                 next_step="validation did not finish: rerun flashsim calibrate")
    _say(args, f"[3/4] profile {profile.name!r} written: {target} (source: {profile.source.kind}, {mode} calibration)")
    cuda = None
    if dev is not None and dev.kind == "cuda":
        _say(args, f"      bench compute on the GPU ({dev.name})")
        cuda = _cuda_profile(args, profile, target, dev)
        _say(args, f"      profile {cuda['name']!r} written: {cuda['path']} (flash as above, the GPU's compute)")

    # 4. validate --quick against it
    _say(args, f"[4/4] validate --quick ({', '.join(modes)}) with profile {target}")
    report = run_validation(profile, quick=True, seed=args.seed, workdir=args.workdir or args.path,
                            progress=validate_progress(args.json), threads=args.threads, modes=modes,
                            keep=args.keep)
    flash_summary = {"direct_io": flash["direct_io"], "sequential_bytes_per_s": flash["sequential"]["bytes_per_s"],
                     "latency_4k_qd1_s": flash["latency_4k_qd1"]["mean_s"],
                     "request_cpu_s": profile.flash.request_cpu_s, "request_cpu": flash.get("request_cpu"),
                     "max_random_bytes_per_s": max(max(r) for r in flash["grid"]["bytes_per_s"]),
                     "grid": flash["grid"], "command": flash_cmd}
    fp32 = comp["per_dtype"].get("fp32", next(iter(comp["per_dtype"].values())))
    compute_summary = {"framework": comp["framework"], "threads": comp["threads"],
                       "fp32_gemv_flops_per_s": profile.compute.flops_per_s("fp32"),   # as written (row cost removed)
                       "dense_gemv_flops_per_s": fp32["dense_gemv_flops_per_s"],
                       "gemv_row_s": profile.compute.gemv_row_s,
                       "transpose_bytes_per_s": profile.compute.transpose_bytes_per_s,
                       "dram_bytes_per_s": comp["memory"]["stream_copy_bytes_per_s"],
                       "op_overhead_s": comp["op_overhead_s"], "command": comp_cmd}
    from real.validation.profile_writer import measured_fields

    verdict = calibration_verdict(report, args.quick, str(target))
    record = {k: verdict[k] for k in ("detail", "next_step")}
    profile = record_calibration(target, mode, verdict["verdict"], **record)
    if cuda:   # validated with the CPU profile: the GPU's profile carries the same verdict, said so
        record_calibration(Path(cuda["path"]), mode, verdict["verdict"], next_step=verdict["next_step"],
                           detail=f"validated with the CPU profile {target}: {verdict['detail']}")
    # the validation's own warnings are in its report (printed with it); the rest were seen on stderr
    warnings = [w for w in dict.fromkeys(tee.lines) if w not in verdict["warnings"]]
    measured, carried = measured_fields(profile.model_dump(mode="json", exclude_none=True))
    if args.json:
        print_json({"profile": {"name": profile.name, "path": str(target), "measured": measured, "carried_over": carried},
                    "cuda_profile": cuda, "kept": args.keep, "flash": flash_summary, "compute": compute_summary, "validate": report,
                    "verdict": {**verdict, "warnings": [*verdict["warnings"], *warnings]}, "wall_s": time.perf_counter() - t0})
        return 0
    print(f"profile {profile.name!r}: {target}")
    print(f"  measured here: {', '.join(measured)}; carried over: {', '.join(carried)}")
    req = flash_summary["request_cpu_s"]
    print(f"  flash: sequential {format_rate(flash_summary['sequential_bytes_per_s'])}, best random "
          f"{format_rate(flash_summary['max_random_bytes_per_s'])}, 4 KiB latency "
          f"{flash_summary['latency_4k_qd1_s'] * 1e6:.0f} us ({'direct I/O' if flash['direct_io'] else 'buffered'})"
          + (f", CPU per read request {req * 1e6:.1f} us" if req is not None else ""))
    print(f"  compute: fp32 GEMV {compute_summary['fp32_gemv_flops_per_s'] / 1e9:.1f} GFLOP/s at "
          f"{compute_summary['threads']} thread(s), DRAM {format_rate(compute_summary['dram_bytes_per_s'])}, "
          f"per-op overhead {compute_summary['op_overhead_s'] * 1e6:.2f} us")
    if cuda:
        print(f"profile {cuda['name']!r} (the GPU's compute, {cuda['device']}): {cuda['path']}; fp16 GEMV "
              f"{cuda['fp16_gemv_flops_per_s'] / 1e9:.1f} GFLOP/s, GPU memory {format_rate(cuda['dram_bytes_per_s'])}; "
              "plan and replay with this one (validate ran the CPU profile: its real runs compute on the CPU)")
    print_validation(report, False, None)
    for w in warnings:
        print(f"warning: {w.removeprefix('WARNING: ')}")
    print(f"calibrated in {time.perf_counter() - t0:.0f} s ({mode}); the profile records the verdict and date")
    print(verdict_line(verdict))
    return 0


# the bench's own stores beside its file: real.bench.bench_reader's one-layer store (16 MiB) and the
# FFN-step probe's (about 60 MB), with room to spare
STORES_BYTES = 128 << 20
# validate --quick's shape-mode store (4 layers of d_model 1024 x d_ff 2048 fp32 in both layouts,
# ~200 MB) and its traces, when they go into --path (no --workdir)
VALIDATE_BYTES = 512 << 20


def check_bench_folder(folder: Path, size_bytes: int, given: str) -> None:
    """FlashsimError (one line) unless `folder` is an existing, writable directory with room for
    size_bytes (the bench file, and validation's store when it goes there), the bench's stores and
    real.weights.store_writer's headroom."""
    from real.weights.store_writer import HEADROOM_BYTES

    if not folder.exists():
        raise FlashsimError(f"--path {given}: does not exist; give a folder on the disk that will hold the weights "
                            "(create it first)")
    if not folder.is_dir():
        raise FlashsimError(f"--path {given}: not a directory; give a folder on the disk to measure")
    check_writable(folder, f"--path {given}")
    need = size_bytes + STORES_BYTES + HEADROOM_BYTES
    free = shutil.disk_usage(folder).free
    if free < need:
        raise FlashsimError(f"--path {given}: {format_bytes(free)} free, calibration needs {format_bytes(need)} (the "
                            "test file, the benches' and validation's stores, headroom); free space or give a "
                            "smaller --size")


def check_writable(folder: Path, what: str) -> None:
    """FlashsimError unless a file can be created in `folder` (or, when it does not exist yet, in
    its nearest existing parent): tried, not guessed from permission bits (root passes those)."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        fd, name = tempfile.mkstemp(prefix=".flashsim-write-check-", dir=probe)
    except OSError as e:
        raise FlashsimError(f"{what}: cannot write in {probe} ({e.strerror}); choose a writable folder") from None
    os.close(fd)
    os.unlink(name)


def _cuda_profile(args: argparse.Namespace, profile: Any, target: Path, dev: Any) -> dict[str, Any]:
    """PROFILE-cuda.yaml: the CPU profile just written (its flash, its host-side compute terms) with
    the GPU's compute and memory bandwidth (real/bench/bench_cuda.py); returns what the summary prints."""
    import datetime as dt

    import torch

    from devices.schema import DeviceProfile
    from real.bench.bench_cuda import (
        cuda_compute_sections,
        measured_cpu_compute,
        run_cuda_compute_bench,
    )
    from real.runtime.torch_threads import torch_threads
    from real.validation.profile_writer import (
        host_description,
        profile_yaml,
        write_profile,
        write_profile_text,
    )

    name = f"{args.name}-cuda"
    path = target.with_name(f"{target.stem}-cuda{target.suffix}")
    data = profile.model_dump(mode="json", exclude_none=True)
    data.update(name=name, description=f"Measured by flashsim calibrate on {host_description()}: flash in "
                                       f"{args.path}, compute on the GPU ({dev.name})")
    write_profile_text(path, profile_yaml(DeviceProfile.model_validate(data), "the CPU calibration, before the GPU's "
                                                                               "compute is written"))
    with torch_threads(torch, args.threads):
        result = run_cuda_compute_bench(torch, dev, quick=args.quick, seed=args.seed)
    command = (f"flashsim bench compute --device cuda --seed {args.seed}" + (" --quick" if args.quick else "")
               + f" --threads {args.threads} (via flashsim calibrate)")
    compute, memory = cuda_compute_sections(result, measured_cpu_compute(profile), dt.date.today().isoformat(),
                                            command, profile.memory.source)
    written = write_profile(path, name, compute=compute, memory=memory, command=command)
    return {"name": name, "path": str(path), "device": result["framework"],
            "fp16_gemv_flops_per_s": written.compute.flops_per_s("fp16"),
            "dram_bytes_per_s": written.memory.bandwidth_bytes_per_s,
            "h2d_bytes_per_s": result["memory"]["h2d_bytes_per_s"], "op_overhead_s": result["op_overhead_s"]}
