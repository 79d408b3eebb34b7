"""`flashsim calibrate`: the calibration loop in one verb (README "Calibrating on this host"):

    1. bench flash    direct-I/O random-read grid on a file created in --path (removed afterwards)
    2. bench compute  GEMV per dtype, gather, DRAM bandwidth, per-op overhead (at --threads)
    3. the profile    both sections merged into PROFILE.yaml with provenance (real.profile_writer)
    4. validate       `flashsim validate --quick` with that profile: the simulator's error per metric

It only orchestrates the functions behind `flashsim bench flash|compute` and `flashsim validate`
(real/bench_flash.py, real/bench_compute.py, real/profile_writer.py, real/validate.py), called by
keyword; optional parameters those functions may not have (compute threads) are passed only when
their signature takes them. Units: bytes, seconds, bytes/s.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import inspect
import os
import sys
import time
from pathlib import Path
from typing import Any

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


def _accepts(fn: Any, name: str) -> bool:
    return name in inspect.signature(fn).parameters


def _say(args: argparse.Namespace, text: str) -> None:
    if not args.json:
        print(text, file=sys.stderr, flush=True)


def _calibrate(args: argparse.Namespace) -> int:
    from devices.schema import load_profile
    from real import bench_compute, bench_flash
    from real.profile_writer import MEASURED_PREFIX, default_path, write_profile
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
    today = dt.date.today().isoformat()
    t0 = time.perf_counter()

    # 1. flash
    cfg_kw: dict[str, Any] = dict(
        chunks=tuple(bench_flash.QUICK_CHUNKS if args.quick else bench_flash.DEFAULT_CHUNKS),
        in_flight=tuple(bench_flash.QUICK_IN_FLIGHT if args.quick else bench_flash.DEFAULT_IN_FLIGHT),
        duration_s=0.2 if args.quick else 1.0, seed=args.seed, direct=None, passes=1 if args.quick else 3)
    if "compute_threads" in {f.name for f in dataclasses.fields(bench_flash.FlashBenchConfig)}:
        cfg_kw["compute_threads"] = args.threads
    cfg = bench_flash.FlashBenchConfig(**cfg_kw)
    bench_file = folder / f"flashsim-calibrate-{os.getpid()}.dat"
    if bench_file.exists():
        raise FlashsimError(f"{bench_file}: already exists; remove it or choose another --path")
    flash_cmd = (f"flashsim bench flash --path {bench_file} --size {size} --chunks "
                 + ",".join(str(c) for c in cfg.chunks) + " --in-flight " + ",".join(map(str, cfg.in_flight))
                 + f" --duration-s {cfg.duration_s:g} --passes {cfg.passes} --seed {cfg.seed} (via flashsim calibrate)")
    _say(args, f"[1/4] bench flash: {len(cfg.chunks)} chunk sizes x {len(cfg.in_flight)} reads in flight on "
               f"{format_bytes(size)} in {folder}")
    flash = bench_flash.run_flash_bench(path=bench_file, size_bytes=size, cfg=cfg, keep_file=False, progress=None)
    how = (f"{'direct I/O' if flash['direct_io'] else 'BUFFERED reads, page cache dropped per point'}, python threads + "
           f"os.preadv, {format_bytes(flash['file_bytes'])} file, {cfg.duration_s:g} s per point")
    section = bench_flash.flash_section(result=flash, source=f"{MEASURED_PREFIX} flash ({today}): {how}; `{flash_cmd}`")
    write_profile(path=target, name=args.name, flash=section, command=flash_cmd)

    # 2. compute
    _say(args, f"[2/4] bench compute ({'quick, ' if args.quick else ''}{args.threads} thread(s))")
    ckw: dict[str, Any] = dict(quick=args.quick, framework="auto", seed=args.seed)
    if _accepts(bench_compute.run_compute_bench, "threads"):
        ckw["threads"] = args.threads
    comp = bench_compute.run_compute_bench(**ckw)
    comp_cmd = (f"flashsim bench compute --framework auto --seed {args.seed}" + (" --quick" if args.quick else "")
                + (f" --threads {args.threads}" if "threads" in ckw else "") + " (via flashsim calibrate)")
    base = load_profile(target)
    compute, memory = bench_compute.compute_sections(result=comp, date=today, command=comp_cmd,
                                                     old_memory_source=base.memory.source)
    # 3. the profile (written atomically and read back by write_profile)
    profile = write_profile(path=target, name=args.name, compute=compute, memory=memory, command=comp_cmd)
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
