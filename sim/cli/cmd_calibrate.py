"""`flashsim calibrate`: the calibration loop in one verb (README "Calibrating on this host"):

    1. bench flash    direct-I/O random-read grid on a file created in --path (removed afterwards)
    2. bench compute  GEMV per dtype, gather, DRAM bandwidth, per-op overhead (at --threads)
    3. the profile    both sections merged into PROFILE.yaml with provenance (real.profile_writer)
    4. validate       `flashsim validate --quick` with that profile: the simulator's error per metric

It only orchestrates: steps 1-3 are real.calibration.calibrate (the functions behind `flashsim
bench flash|compute` and real/profile_writer.py), step 4 real.validate.run_validation. Units:
bytes, seconds, bytes/s.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from devices.errors import FlashsimError
from devices.units import format_bytes, format_rate, parse_bytes
from sim.cli.output import print_json


def register(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("calibrate", help="bench flash -> bench compute -> device profile -> validate --quick, in one go")
    c.add_argument("--path", default=".", help="directory on the disk to measure: a temporary bench file is created "
                                               "there and removed (default: the current directory)")
    c.add_argument("--name", default="this-host", help="profile name (default this-host)")
    c.add_argument("--out", help="profile file to write (default devices/profiles/NAME.yaml)")
    c.add_argument("--quick", action="store_true", help="the benches' quick grids (64 MiB file, 3 chunk sizes x 2 "
                                                        "depths, small GEMV); validation is always --quick")
    c.add_argument("--size", help="size of the bench file (default 2GiB; --quick 64MiB)")
    c.add_argument("--threads", type=int, default=1, help="compute threads: bench compute measures with this many and "
                                                         "validate runs with as many (default 1)")
    c.add_argument("--modes", default="shape,model", help="validation modes (default shape,model)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--workdir", help="folder for validation's temporary store and traces")
    c.add_argument("--json", action="store_true", help="print one JSON object: flash, compute, profile, validate")
    c.set_defaults(func=_calibrate)


def _say(args: argparse.Namespace, text: str) -> None:
    if not args.json:
        print(text, file=sys.stderr, flush=True)


def _calibrate(args: argparse.Namespace) -> int:
    from real.calibration import calibrate
    from real.profile_writer import default_path
    from real.validate import parse_modes, run_validation
    from sim.cli.cmd_realrun import print_validation, validate_progress

    if args.threads < 1:
        raise FlashsimError(f"--threads {args.threads}: must be >= 1")
    modes = parse_modes(args.modes)
    folder = Path(args.path)
    if not folder.is_dir():
        raise FlashsimError(f"--path {args.path}: not a directory; give a folder on the disk to measure")
    target = Path(args.out) if args.out else default_path(args.name)
    size = parse_bytes(args.size, "--size") if args.size else (64 << 20 if args.quick else 2 << 30)
    t0 = time.perf_counter()

    # 1-3. bench flash, bench compute, the profile (real.calibration; written atomically, read back)
    _say(args, f"[1/4] bench flash, [2/4] bench compute ({args.threads} thread(s)) on "
               f"{format_bytes(size)} in {folder}")
    cal = calibrate(folder, target, args.name, threads=args.threads, seed=args.seed, quick=args.quick,
                    size_bytes=size, say=lambda text: _say(args, f"      {text}"))
    profile, flash, comp, flash_cmd, comp_cmd = (cal.profile, cal.flash, cal.compute, cal.flash_command,
                                                 cal.compute_command)
    _say(args, f"[3/4] profile {profile.name!r} written: {target} (source: {profile.source.kind})")

    # 4. validate --quick against it
    _say(args, f"[4/4] validate --quick ({', '.join(modes)}) with profile {target}")
    report = run_validation(profile, quick=True, seed=args.seed, workdir=args.workdir,
                            progress=validate_progress(args.json), threads=args.threads, modes=modes)
    flash_summary = {"direct_io": flash["direct_io"], "sequential_bytes_per_s": flash["sequential"]["bytes_per_s"],
                     "latency_4k_qd1_s": flash["latency_4k_qd1"]["mean_s"],
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
    if args.json:
        print_json({"profile": {"name": profile.name, "path": str(target)}, "flash": flash_summary,
                    "compute": compute_summary, "validate": report, "wall_s": time.perf_counter() - t0})
        return 0
    print(f"profile {profile.name!r}: {target}")
    print(f"  flash: sequential {format_rate(flash_summary['sequential_bytes_per_s'])}, best random "
          f"{format_rate(flash_summary['max_random_bytes_per_s'])}, 4 KiB latency "
          f"{flash_summary['latency_4k_qd1_s'] * 1e6:.0f} us ({'direct I/O' if flash['direct_io'] else 'buffered'})")
    print(f"  compute: fp32 GEMV {compute_summary['fp32_gemv_flops_per_s'] / 1e9:.1f} GFLOP/s at "
          f"{compute_summary['threads']} thread(s), DRAM {format_rate(compute_summary['dram_bytes_per_s'])}, "
          f"per-op overhead {compute_summary['op_overhead_s'] * 1e6:.2f} us")
    print_validation(report, False, None)
    print(f"calibrated in {time.perf_counter() - t0:.0f} s")
    return 0
