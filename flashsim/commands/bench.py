"""`flashsim bench flash|compute`: microbenchmarks that write a device profile.

    bench flash     random reads (chunk size x reads in flight, direct I/O), sequential bandwidth,
                    4 KiB latency, the reads' host CPU cost against a compute probe of
                    `--compute-threads` threads (`--no-host-cpu` skips it); or `--import-fio FIO.json`
                    -> the profile's `flash` section
    bench compute   dense and gathered GEMV per dtype, DRAM bandwidth, per-op overhead, at
                    `--threads` compute threads -> the profile's `compute` section (with
                    `threads`) and memory bandwidth/capacity
    bench merge     several such profiles of one host -> their mean (real/validation/profile_merge.py), for
                    calibrations spread over the hours a validation or a deployment runs in

By default the profile `this-host` in devices/profiles/ is updated (other sections kept);
`--out FILE` writes elsewhere, `--name` names the profile, `--no-write` only measures.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
from pathlib import Path
from typing import Any

from devices.errors import FlashsimError
from devices.progress import Stage, phase
from devices.units import format_bytes, format_rate, parse_bytes
from flashsim.output import print_json, print_table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="microbenchmarks of flash and compute -> a device profile")
    bsub = p.add_subparsers(dest="bench_cmd", metavar="SUBCOMMAND")
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])

    f = bsub.add_parser("flash", help="direct-I/O read throughput over chunk size x reads in flight")
    f.add_argument("--path", help="file on the disk to measure; created (random bytes) if missing and removed "
                   "afterwards unless --keep-file; an existing file is only read (default: a temporary file "
                   "in the current directory)")
    f.add_argument("--size", help="size of a created file (default 2GiB; --quick 64MiB)")
    f.add_argument("--chunks", help="comma-separated read sizes, multiples of 4KiB (default 4KiB,8KiB,...,1MiB)")
    f.add_argument("--in-flight", help="comma-separated reads in flight (default 1,2,4,8,16,32,64)")
    f.add_argument("--duration-s", type=float, help="seconds per grid point (default 1; --quick 0.2)")
    f.add_argument("--passes", type=int, help="sweeps over the grid, each point's seconds split between them and "
                                              "its mean time per byte over them kept (default 5; --quick 1): the "
                                              "disk's slow and fast spells then weigh in as a long run meets them")
    f.add_argument("--quick", action="store_true", help="small grid (4KiB,64KiB,1MiB x 1,4), short points")
    f.add_argument("--buffered", action="store_true", help="buffered reads with page-cache eviction, not O_DIRECT")
    f.add_argument("--keep-file", action="store_true", help="keep a file this command created")
    f.add_argument("--import-fio", help="build the flash section from fio --output-format=json results instead")
    f.add_argument("--seed", type=int, default=0, help="seed of the random offsets and file contents")
    f.add_argument("--compute-threads", type=int, default=1, help="threads of the host-CPU probe's compute (the "
                   "real runs' compute threads; default 1)")
    f.add_argument("--no-host-cpu", action="store_true", help="skip the host-CPU probe (reads' CPU cost and their "
                   "interference with a concurrent compute); the profile then gets no host-CPU terms")
    _profile_args(f)
    f.set_defaults(func=_flash)

    c = bsub.add_parser("compute", help="GEMV throughput per dtype, gather rate, DRAM bandwidth, per-op overhead")
    c.add_argument("--quick", action="store_true", help="smaller matrices and shorter timing")
    c.add_argument("--framework", choices=["auto", "torch", "numpy"], default="auto")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--threads", type=int, help="compute threads (torch) to measure with, recorded as the "
                   "profile's compute.threads; use the count the real runs will use (default: PyTorch's own)")
    c.add_argument("--device", choices=["cpu", "cuda", "auto"], default="cpu", help="where the kernels run: cpu "
                   "(default), cuda (the GPU, through the real backend's CUDA path: real/bench/bench_cuda.py), auto "
                   "(cuda when torch sees a GPU)")
    _profile_args(c)
    c.set_defaults(func=_compute)

    m = bsub.add_parser("merge", help="one profile from several calibrations of this host: rates as harmonic means, "
                                      "times as arithmetic means (real/validation/profile_merge.py)")
    m.add_argument("profiles", nargs="+", metavar="PROFILE", help="two or more profiles (YAML files or names) written "
                                                                  "by bench flash + bench compute with the same settings")
    m.add_argument("--name", default="this-host", help="name of the merged profile (default this-host)")
    m.add_argument("--out", help="profile file to write (default devices/profiles/NAME.yaml)")
    m.add_argument("--json", action="store_true", help="print what was merged as JSON")
    m.set_defaults(func=_merge)


def _profile_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--name", default="this-host", help="profile name (default this-host)")
    p.add_argument("--out", help="profile file to write (default devices/profiles/NAME.yaml)")
    p.add_argument("--no-write", action="store_true", help="measure and print only")
    p.add_argument("--json", action="store_true", help="print the results as JSON")


def _target(args: argparse.Namespace) -> Path:
    from real.validation.profile_writer import default_path

    return Path(args.out) if args.out else default_path(args.name)


# ---- flash ---------------------------------------------------------------------------------------------
def _flash(args: argparse.Namespace) -> int:
    from real.bench.bench_flash import (
        DEFAULT_CHUNKS,
        DEFAULT_IN_FLIGHT,
        QUICK_CHUNKS,
        QUICK_IN_FLIGHT,
        FlashBenchConfig,
        flash_section,
        parse_list,
        run_flash_bench,
    )

    today = dt.date.today().isoformat()
    if args.import_fio:
        from real.bench.fio_import import import_fio

        measuring = [f"--{k.replace('_', '-')}" for k in ("path", "size", "chunks", "in_flight", "duration_s", "passes")
                     if getattr(args, k) is not None] + [f"--{k.replace('_', '-')}" for k in
                                                          ("quick", "buffered", "keep_file", "no_host_cpu")
                                                          if getattr(args, k)]
        if args.compute_threads != 1:
            measuring.append("--compute-threads")
        if measuring:
            raise FlashsimError(f"--import-fio takes the whole table from fio; drop {', '.join(measuring)}")

        result = import_fio(Path(args.import_fio))
        command = f"flashsim bench flash --import-fio {args.import_fio}"
        how = f"imported from fio JSON {args.import_fio}"
    else:
        chunks = (parse_list(args.chunks, lambda t: parse_bytes(t, "--chunks"), "--chunks") if args.chunks
                  else QUICK_CHUNKS if args.quick else DEFAULT_CHUNKS)
        depths = (parse_list(args.in_flight, lambda t: _int(t, "--in-flight"), "--in-flight") if args.in_flight
                  else QUICK_IN_FLIGHT if args.quick else DEFAULT_IN_FLIGHT)
        duration = args.duration_s if args.duration_s is not None else 0.2 if args.quick else 1.0
        if args.compute_threads < 1:
            raise FlashsimError(f"--compute-threads {args.compute_threads}: must be >= 1")
        passes = args.passes if args.passes is not None else 1 if args.quick else 5
        cfg = FlashBenchConfig(chunks=tuple(chunks), in_flight=tuple(depths), duration_s=duration, seed=args.seed,
                               direct=False if args.buffered else None, host_cpu=not args.no_host_cpu,
                               compute_threads=args.compute_threads, passes=passes)
        size = parse_bytes(args.size, "--size") if args.size else (64 << 20 if args.quick else 2 << 30)
        path = Path(args.path) if args.path else Path.cwd() / f"flashsim-bench-{os.getpid()}.dat"
        command = ("flashsim bench flash --chunks " + ",".join(str(c) for c in cfg.chunks) + " --in-flight "
                   + ",".join(map(str, cfg.in_flight)) + f" --duration-s {cfg.duration_s:g} --passes {cfg.passes}"
                   + f" --seed {cfg.seed}"
                   + (f" --path {args.path}" if args.path else "") + (f" --size {size}" if not path.exists() else "")
                   + (" --buffered" if args.buffered else "")
                   + (" --no-host-cpu" if args.no_host_cpu else f" --compute-threads {cfg.compute_threads}"))
        n_steps = len(cfg.chunks) * len(cfg.in_flight) * cfg.passes + 4 + (0 if args.no_host_cpu else cfg.passes)
        with Stage("bench flash", n_steps, "points") as stage:
            def step(label: str) -> None:
                stage.set_postfix(label)
                stage.update(1)

            result = run_flash_bench(path, size, cfg, keep_file=args.keep_file, progress=step)
        how = (f"{'direct I/O' if result['direct_io'] else 'BUFFERED reads, page cache dropped per point'}, "
               f"python threads + os.preadv, {format_bytes(result['file_bytes'])} file, {cfg.duration_s:g} s per point")
    result["command"] = command
    if not args.no_write:
        from real.validation.profile_writer import MEASURED_PREFIX, write_profile

        target = _target(args)
        section = flash_section(result, f"{MEASURED_PREFIX} flash ({today}): {how}; `{command}`")
        write_profile(target, args.name, flash=section, command=command)
        result["profile"] = {"name": args.name, "path": str(target)}
    if args.json:
        print_json(result)
        return 0
    g = result["grid"]
    print(f"flash read throughput, MiB/s ({result.get('method', '')}; "
          f"{'direct I/O' if result['direct_io'] else 'buffered'}){'; ' + result['note'] if result.get('note') else ''}")
    from real.bench.bench_flash import table_rows

    print_table(["chunk"] + [f"q={q}" for q in g["in_flight"]], table_rows(g), align="r" * (len(g["in_flight"]) + 1))
    print(f"sequential: {format_rate(result['sequential']['bytes_per_s'])}; 4 KiB latency at q=1: "
          f"{result['latency_4k_qd1']['mean_s'] * 1e6:.0f} us (mean)")
    sg = result.get("segments")
    if sg:
        print(f"segmented reads: {format_bytes(sg['chunk_bytes'])} x {sg['in_flight']} in flight into {sg['segments']} "
              f"discontiguous 4 KiB buffers {sg['segmented_s_per_read'] * 1e6:.1f} us per read against "
              f"{sg['one_s_per_read'] * 1e6:.1f} into one: {sg['segment_s'] * 1e6:.2f} us per extra segment")
    b = result.get("batches")
    if b:
        print(f"batch overhead (real.io.reader, {format_bytes(b['bundle_bytes'])} bundles, us at "
              + "/".join(f"{r:g}" for r in b["reads_per_thread"]) + " reads per thread): "
              + ", ".join(f"q={q} " + "/".join(f"{x * 1e6:.0f}" for x in row)
                          for q, row in zip(b["in_flight"], b["overhead_s"], strict=True))
              + "; the disk meanwhile at " + ", ".join(f"{x:.2f}x" for x in b["disk_state"]) + " the table's time")
    req = result.get("request_cpu")
    if req:
        print(request_cpu_line(req))
    print(host_cpu_line(result.get("host_cpu")))
    if "profile" in result:
        print(f"profile {args.name!r} updated (flash section): {result['profile']['path']}")
    return 0


def request_cpu_line(req: dict[str, Any]) -> str:
    """One line with the CPU cost of a read request (real/bench/bench_request_cpu.py)."""
    per = ", ".join(f"q={p['in_flight']} {p['request_cpu_s'] * 1e6:.1f}" for p in req["per_in_flight"])
    return (f"CPU per read request: {req['request_cpu_s'] * 1e6:.1f} us + {req['cpu_s_per_byte'] * 1e9 * 1024:.3g} ns "
            f"per KiB (fit over {req['reads']:.0f} reads; per reads in flight, us: {per})")


def host_cpu_line(host: dict[str, Any] | None) -> str:
    """One line with the host-CPU probe's results (or why there are none)."""
    if not host:
        return "host CPU probe: not run (--no-host-cpu or imported results)"
    us = 1e6

    def terms(h: dict[str, Any]) -> str:
        call = f" at {h['op_s'] * us:.1f} us per torch call" if h.get("op_s") else ""
        return (f"compute lost {h['compute_lost_s_per_read'] * us:.1f} us/read + "
                f"{h['compute_lost_s_per_batch'] * 1e3:.3f} ms/batch; read delay {h['read_delay_s_per_read'] * us:.1f} "
                f"us/read + {h['read_delay_s_per_batch'] * 1e3:.3f} ms/batch{call}")

    others = "".join(f"; {name}: {terms(host[kind])}" for kind, name in (("framework", "tiny llama"),
                                                                          ("long", "long GEMV")) if host.get(kind))
    return (f"host CPU probe ({format_bytes(host['chunk_bytes'])} x {host['in_flight']} in flight, batches of "
            f"{'/'.join(map(str, host['batch_reads']))} reads, {host['compute_threads']}-thread compute, load "
            f"{host['load_average_1min']:.1f}): CPU {host['cpu_s_per_read'] * us:.1f} us/read; GEMV: {terms(host)}"
            + others)


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise FlashsimError(f"{what}: {text!r} is not an integer") from None


# ---- compute -------------------------------------------------------------------------------------------
def _print_sparse_ffn(tables: dict) -> None:  # type: ignore[type-arg]
    """The sparse-FFN kernel table at its largest width's middle neuron count, per dtype."""
    first = next(iter(tables.values()))
    i, j = len(first["d_model"]) - 1, len(first["neurons"]) // 2
    d, k = first["d_model"][i], first["neurons"][j]
    rows = [[dt, *(f"{v[key][i][j] * 1e3:.3f}" for key in ("gather_s", "input_gemv_s", "transpose_s", "down_gemv_s"))]
            for dt, v in tables.items()]
    print(f"sparse FFN kernels at d_model {d}, {k} neurons (ms per call; full table: --json or the profile):")
    print_table(["dtype", "gather", "gate/up GEMV", "transposed copy", "down GEMV"], rows, align="lrrrr")


def _print_dense_gemv(tables: dict) -> None:  # type: ignore[type-arg]
    """The dense GEMV table's largest out_features, per dtype and in_features, as streaming rates."""
    first = next(iter(tables.values()))
    j, m = len(first["out_features"]) - 1, first["out_features"][-1]
    from devices.model_spec import DTYPE_BITS

    rows = [[dt, *(format_rate(m * k * DTYPE_BITS[dt] / 8 / v["gemv_s"][i][j]) for i, k in enumerate(v["in_features"]))]
            for dt, v in tables.items()]
    print(f"dense GEMV [{m}, in_features] streaming rate (full table: --json or the profile):")
    print_table(["dtype", *(str(k) for k in first["in_features"])], rows, align="l" + "r" * len(first["in_features"]))


def _compute(args: argparse.Namespace) -> int:
    from devices.schema import load_profile
    from real.bench.bench_compute import compute_sections, run_compute_bench

    with phase(f"bench compute on {args.device}{' (quick)' if args.quick else ''}"):
        if args.device == "cpu":
            result = run_compute_bench(quick=args.quick, framework=args.framework, seed=args.seed, threads=args.threads)
        else:
            from real.bench.bench_cuda import run_on

            result = run_on(args.device, quick=args.quick, framework=args.framework, seed=args.seed,
                            threads=args.threads)
    command = (f"flashsim bench compute --framework {args.framework} --seed {args.seed}" + (" --quick" if args.quick else "")
               + (f" --threads {args.threads}" if args.threads is not None else "")
               + (f" --device {args.device}" if args.device != "cpu" else ""))
    result["command"] = command
    if not args.no_write:
        from real.validation.profile_writer import write_profile

        target = _target(args)
        base = load_profile(target) if target.is_file() else load_profile("this-host")
        if result.get("device", {}).get("kind") == "cuda":
            from real.bench.bench_cuda import cuda_compute_sections, measured_cpu_compute

            compute, memory = cuda_compute_sections(result, measured_cpu_compute(base), dt.date.today().isoformat(),
                                                    command, base.memory.source)
        else:
            compute, memory = compute_sections(result, dt.date.today().isoformat(), command, base.memory.source)
        write_profile(target, args.name, compute=compute, memory=memory, command=command)
        result["profile"] = {"name": args.name, "path": str(target)}
    if args.json:
        print_json(result)
        return 0
    print(f"compute ({result['framework']}, {result['threads']} threads, GEMV {result['dense_shape'][0]}x"
          f"{result['dense_shape'][1]}, gather {result['gather_fraction']:.0%} of rows)")
    def ms(v: dict[str, Any], key: str) -> str:
        return f"{v[key] * 1e3:.2f}" if key in v else "-"

    rows = [[k, f"{v['dense_gemv_flops_per_s'] / 1e9:.1f}", ms(v, "dense_gemv_s"), ms(v, "dense_gemv_min_s"),
             ms(v, "gathered_gemv_s"), format_rate(v["gather_bytes_per_s"]), ms(v, "gather_min_s")]
            for k, v in result["per_dtype"].items()]
    print_table(["dtype", "dense GFLOP/s", "dense ms", "(min)", "gathered ms", "gather", "gather min ms"], rows,
                align="lrrrrrr")
    mem = result["memory"]
    print(f"DRAM copy: {format_rate(mem['memcpy_bytes_per_s'])} copied = {format_rate(mem['stream_copy_bytes_per_s'])} "
          f"traffic; per-op overhead {result['op_overhead_s'] * 1e6:.2f} us")
    if "sparse_ffn" in result:
        _print_sparse_ffn(result["sparse_ffn"])
    if "dense_gemv" in result:
        _print_dense_gemv(result["dense_gemv"])
    if "profile" in result:
        print(f"profile {args.name!r} updated (compute section, memory bandwidth and capacity): {result['profile']['path']}")
    return 0


# ---- merge ---------------------------------------------------------------------------------------------
def _merge(args: argparse.Namespace) -> int:
    from real.validation.profile_merge import merge_profiles
    from real.validation.profile_writer import profile_yaml, write_profile_text

    profile = merge_profiles(args.profiles, args.name)
    target = _target(args)
    write_profile_text(target, profile_yaml(profile, f"Written by `flashsim bench merge {' '.join(args.profiles)}`: "
                                                     "the mean of these calibrations."))
    if args.json:
        print_json({"profile": {"name": profile.name, "path": str(target)}, "merged": list(args.profiles)})
    else:
        print(f"merged {len(args.profiles)} profiles into {target} (profile {profile.name!r})")
    return 0
