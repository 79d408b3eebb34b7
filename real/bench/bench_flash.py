"""`flashsim bench flash`: random-read throughput over chunk size x reads in flight, sequential
bandwidth and 4 KiB queue-depth-1 latency of the disk holding a file, the costs around the reads,
and the profile's `flash` section from them (bytes, seconds, bytes/s).

The reads themselves (method, destinations, staged and segmented reads) are real/bench/bench_io.py's; the
host CPU probe is real/bench/bench_host_cpu.py's. Here: the grid and the order things are measured in.
Each grid point runs for `duration_s`; the grid is swept `passes` times (default 5, directions
alternating, each point duration_s / passes per sweep) and each point's value is the mean over
sweeps of its time per byte (the harmonic mean of the sweeps' throughputs). This host's virtio disk
switches between states for seconds to a minute at a time, at small reads deep in the queue only
(4 KiB x 32 in flight: 174 MB/s in one calibration, 340 MB/s steadily for the next minute, while 64
KiB and 256 KiB stayed within 3% of the same profile), so a single sweep records whichever state it
hits. A run of minutes meets the states in proportion and its latency adds read times, so the mean
time per byte is what predicts it; a median would keep whichever state
most sweeps hit (one calibration kept 731 MB/s at 16 KiB x 32 in flight, two of three sweeps in a
slow state, where 15 s of the same reads right after ran at 1040-1105 MB/s). The JSON keeps every
sweep's value (`grid.bytes_per_s_per_pass`). Offsets come from a seeded generator per grid point.

Batch overhead and reader planning (the profile's `flash.batch_overhead_s`, `plan_s_per_batch`,
`plan_s_per_neuron`): timed through real.io.reader itself on a small store written next to the bench
file before the grid (real/bench/bench_reader.py). The planning is timed in one round after each sweep
of the grid, and the profile keeps each value's median over the rounds
(`bench_reader.median_of_rounds`, `_cpu_round`): each is a fraction of a second of CPU work that
moves with the host's state (a single 0.3 s measurement of the planning moved 2.5x between
calibrations five minutes apart), so the rounds sample it across the whole calibration. The batch
overhead, which needs the finished read table, is timed after the grid.

Every grid point also records the process CPU time (getrusage, user + system, all threads) per
read and its reads; their fit over the grid is the CPU cost of one read request through the I/O
path (`flash.request_cpu_s`, real/bench/bench_request_cpu.py), written on every host. The host CPU probe (`--no-host-cpu` skips it) runs three kinds of compute against batches of
reads, one round after each sweep (real/bench/bench_host_cpu.py).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from devices.errors import FlashsimError
from devices.units import format_bytes
from real.bench.bench_host_cpu import (
    PROBE_CHUNK_BYTES,
    PROBE_KINDS,
    PROBE_LONG_DIM,
    PROBE_SLICE_S,
    PROBE_SLICES,
    probe_samples,
    probe_summary,
)
from real.bench.bench_io import (
    BenchFile,
    latency_4k_qd1,
    random_read_bytes_per_s,
    segment_cost,
    sequential_bytes_per_s,
    staged_read_cost,
)
from real.bench.bench_reader import (
    batch_overhead,
    bench_store,
    median_of_rounds,
    read_plan_cost,
)
from real.bench.bench_request_cpu import request_cpu_fit, request_cpu_source
from real.io.buffers import ALIGN_BYTES, round_down
from real.validation.profile_writer import host_description, sig4, tool_version

SEQ_CHUNK_BYTES = 1 << 20
DEFAULT_CHUNKS = tuple(4096 << i for i in range(9))          # 4 KiB .. 1 MiB
DEFAULT_IN_FLIGHT = (1, 2, 4, 8, 16, 32, 64)
QUICK_CHUNKS = (4096, 65536, 1 << 20)
QUICK_IN_FLIGHT = (1, 4)
STAGED_CHUNK_BYTES = 4096     # staged reads: a padded row of an unaligned unit (SmolLM2 fp32: 2304 B)


@dataclass(frozen=True)
class FlashBenchConfig:
    chunks: tuple[int, ...] = DEFAULT_CHUNKS
    in_flight: tuple[int, ...] = DEFAULT_IN_FLIGHT
    duration_s: float = 1.0
    seed: int = 0
    direct: bool | None = None     # None: O_DIRECT if the filesystem allows it
    host_cpu: bool = True          # also measure the reads' host CPU cost (probe_samples)
    compute_threads: int = 1       # threads of the compute probe (the real runs' compute threads)
    passes: int = 5                # sweeps over the grid, each point duration_s / passes per sweep (mean time)

    def __post_init__(self) -> None:
        if self.passes < 1:
            raise FlashsimError(f"--passes must be >= 1, got {self.passes}")
        if not self.chunks or any(c <= 0 or c % ALIGN_BYTES for c in self.chunks):
            raise FlashsimError(f"--chunks: every chunk must be a positive multiple of {ALIGN_BYTES} bytes "
                                f"(direct I/O alignment), got {list(self.chunks)}")
        if list(self.chunks) != sorted(set(self.chunks)) or list(self.in_flight) != sorted(set(self.in_flight)):
            raise FlashsimError("--chunks and --in-flight must be strictly increasing lists")
        if not self.in_flight or any(q < 1 or q > 1024 for q in self.in_flight):
            raise FlashsimError(f"--in-flight: values must be in [1, 1024], got {list(self.in_flight)}")
        if not self.duration_s > 0:
            raise FlashsimError(f"--duration-s must be > 0, got {self.duration_s}")


def _cpu_round(bf: BenchFile, store: Any, cfg: FlashBenchConfig, r: int, rounds: dict[str, list]) -> None:
    """One round of the CPU work around I/O waits, after sweep r of the grid: the reader's planning
    on `store` (None: a folder without room for it), then the host CPU
    probe's slices for this round, kernel and framework, and long kernels. Each is a fraction of a second of CPU work that moves
    with the host's state, so the rounds are spread over the whole grid, one after each sweep, and
    the profile keeps the median of each."""
    q = max(cfg.in_flight)
    if store is not None:
        rounds["plan"].append(read_plan_cost(store, q, cfg.seed + r, min(0.3, cfg.duration_s)))
    if cfg.host_cpu:
        chunk = PROBE_CHUNK_BYTES if PROBE_CHUNK_BYTES in cfg.chunks else min(cfg.chunks)
        for kind in PROBE_KINDS:
            raw = probe_samples(bf, chunk, q, slices=max(2, PROBE_SLICES // cfg.passes),
                                slice_s=min(PROBE_SLICE_S, cfg.duration_s), compute_threads=cfg.compute_threads,
                                seed=cfg.seed, kind=kind, round_=r)
            if raw is not None:
                rounds[kind].append(raw)


def run_flash_bench(path: Path, size_bytes: int, cfg: FlashBenchConfig, *, keep_file: bool = False,
                    progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The whole benchmark; returns the results (JSON-ready)."""
    bf = BenchFile(path, size_bytes, cfg.seed, cfg.direct, keep_file)
    try:
        if bf.size_bytes < max(cfg.chunks):
            raise FlashsimError(f"{path}: {format_bytes(bf.size_bytes)} is smaller than the largest chunk "
                                f"{format_bytes(max(cfg.chunks))}; use a bigger --size or file")
        ss = np.random.SeedSequence(cfg.seed)
        point_rngs = [np.random.default_rng(s) for s in ss.spawn(len(cfg.chunks) * len(cfg.in_flight) + 1)]
        shape = (cfg.passes, len(cfg.chunks), len(cfg.in_flight))
        sweeps, cpus, reads = np.zeros(shape), np.zeros(shape), np.zeros(shape)
        points = [(i, j) for i in range(len(cfg.chunks)) for j in range(len(cfg.in_flight))]
        batches = plan = None
        skipped = None
        rounds: dict[str, list[dict[str, Any]]] = {k: [] for k in ("plan", *PROBE_KINDS)}
        with contextlib.ExitStack() as stack:
            try:
                store = stack.enter_context(bench_store(path.resolve().parent, cfg.seed))
            except (OSError, FlashsimError) as e:   # a read-only folder, or no room for its 16 MiB
                store = None
                why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
                skipped = (f"batch overhead and reader planning not measured: cannot write a store in "
                           f"{path.resolve().parent} ({why}); the profile gets no batch terms")
            for k in range(cfg.passes):   # alternate the sweep's direction: a slow spell of the disk hits few points twice
                for i, j in (points if k % 2 == 0 else points[::-1]):
                    c, q = cfg.chunks[i], cfg.in_flight[j]
                    st: dict[str, float] = {}
                    sweeps[k, i, j] = random_read_bytes_per_s(bf, c, q, cfg.duration_s / cfg.passes,
                                                              point_rngs[i * len(cfg.in_flight) + j], stats=st)
                    cpus[k, i, j] = st["cpu_s"] / max(st["reads"], 1.0)
                    reads[k, i, j] = st["reads"]
                    if progress:
                        progress(f"{format_bytes(c)} x {q}" + (f" (pass {k + 1}/{cfg.passes})" if cfg.passes > 1 else ""))
                _cpu_round(bf, store, cfg, k, rounds)
                if progress and cfg.host_cpu:
                    progress(f"host CPU (round {k + 1}/{cfg.passes})")
            # mean time per byte over the sweeps (module doc: the disk's states; latency adds times)
            grid, cpu = cfg.passes / np.sum(1.0 / sweeps, axis=0), np.median(cpus, axis=0)
            seq_chunk = min(max(SEQ_CHUNK_BYTES, max(cfg.chunks)), round_down(bf.size_bytes))
            # 1 and 4 in flight, and the grid's deepest: a virtio disk here streamed 1 MiB reads at
            # 1.5 GB/s with 4 in flight and 2.1 GB/s with 64
            seq = {q: sequential_bytes_per_s(bf, seq_chunk, q, cfg.duration_s)
                   for q in sorted({1, 4, max(cfg.in_flight)})}
            if progress:
                progress("sequential")
            lat = latency_4k_qd1(bf, cfg.duration_s, point_rngs[-1])
            if progress:
                progress("latency")
            staged = staged_read_cost(bf, STAGED_CHUNK_BYTES if STAGED_CHUNK_BYTES in cfg.chunks else min(cfg.chunks),
                                      max(cfg.in_flight), cfg.duration_s, point_rngs[-1])
            segments = segment_cost(bf, max(cfg.in_flight), 2 * cfg.duration_s, point_rngs[-1],
                                    rounds=max(2, cfg.passes))
            if progress:
                progress("staged reads")
            from devices.curves import TableReadCurve

            curve = TableReadCurve(tuple(cfg.chunks), tuple(cfg.in_flight), tuple(tuple(r) for r in grid.tolist()))
            if store is not None:
                steady_rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, 0x5EAD]))
                batches = batch_overhead(store, curve, cfg.in_flight, cfg.duration_s, point_rngs[-1],
                                         lambda c, q, s: random_read_bytes_per_s(bf, c, q, s, steady_rng))
                plan = median_of_rounds(rounds["plan"])
        if progress:
            progress("batch overhead")
        host = probe_summary(rounds["host"]) if rounds["host"] else None
        for kind in PROBE_KINDS[1:]:
            if host is not None and rounds[kind]:
                host[kind] = probe_summary(rounds[kind])
    finally:
        bf.close()
    return {
        "path": str(path), "filesystem": bf.filesystem, "file_bytes": bf.size_bytes, "file_created": bf.created,
        "direct_io": bf.direct_io,
        "note": "; ".join(n for n in (bf.note, skipped) if n),
        "method": "python threads, os.preadv, one thread per read in flight",
        "duration_s_per_point": cfg.duration_s, "seed": cfg.seed,
        "grid": {"chunk_bytes": list(cfg.chunks), "in_flight": list(cfg.in_flight),
                 "bytes_per_s": grid.tolist(), "cpu_s_per_read": cpu.tolist(), "passes": cfg.passes,
                 "bytes_per_s_per_pass": sweeps.tolist(), "reads": reads.sum(axis=0).tolist()},
        "request_cpu": {**request_cpu_fit(cfg.chunks, cfg.in_flight, cpu, reads.sum(axis=0)),
                        "date": dt.date.today().isoformat(), "host": host_description(), "tool": tool_version()},
        "sequential": {"chunk_bytes": seq_chunk, **{f"in_flight_{q}_bytes_per_s": v for q, v in seq.items()},
                       "bytes_per_s": max(seq.values())},
        "latency_4k_qd1": lat,
        "staged": staged,
        "segments": segments,
        "batches": batches,
        "read_plan": plan,
        "host_cpu": host,
        "load_average_1min": os.getloadavg()[0],
    }


def compute_runs_on_cpu() -> bool:
    """True when the compute shares the CPU with the reader threads: no CUDA device (a CPU-only host)."""
    try:
        import torch
    except ImportError:
        return True
    return not torch.cuda.is_available()


def flash_section(result: dict[str, Any], source: str, shares_cpu: bool | None = None) -> dict[str, Any]:
    """The profile's `flash` mapping (devices/schema.py FlashSpec) from a bench result.

    `shares_cpu` (default: `compute_runs_on_cpu()`): the compute runs on the cores that submit the
    reads, so the measured host CPU cost of a read is written (`host_cpu_s_per_read`,
    `compute_lost_s_per_read`); otherwise it stays 0 (reads cost the compute nothing)."""
    g = result["grid"]
    host = result.get("host_cpu")
    if shares_cpu is None:
        shares_cpu = compute_runs_on_cpu()
    extra: dict[str, Any] = {}
    staged = result.get("staged")
    if staged:   # the reader stages unaligned units on any host
        extra["staged_s_per_read"] = sig4(staged["staged_s_per_read"])
        source += (f"; staged reads: {format_bytes(staged['chunk_bytes'])} x {staged['in_flight']} in flight with "
                   "and without the staging copy")
    seg = result.get("segments")
    if seg and result.get("direct_io", True):
        extra["segment_s"] = sig4(seg["segment_s"])
        source += (f"; segment cost: {format_bytes(seg['chunk_bytes'])} x {seg['in_flight']} in flight read into one "
                   f"buffer and into {seg['segments']} discontiguous 4 KiB buffers")
    batches = result.get("batches")
    if batches and [int(q) for q in batches["in_flight"]] == [int(q) for q in g["in_flight"]]:
        ratios = batches["reads_per_thread"]
        extra["batch_overhead_reads_per_thread"] = [float(r) for r in ratios]
        extra["batch_overhead_by_ratio_s"] = [[sig4(x) for x in row] for row in batches["overhead_s"]]
        names = [f"{r:g}q" if r != 1 else "q" for r in ratios]
        sizes = ", ".join(names[:-1]) + " and " + names[-1]
        source += (f"; batch overhead: real.io.reader's batches of {sizes} {format_bytes(batches['bundle_bytes'])} bundles "
                   "at each depth q less the read table's time for their reads, scaled by the disk's state "
                   "(steady reads of the same chunks at q around each slice of batches)")
    plan = result.get("read_plan")
    if plan:
        extra["plan_s_per_batch"] = sig4(plan["per_batch_s"])
        extra["plan_s_per_neuron"] = sig4(plan["per_neuron_s"])
        source += (f"; reader planning: real.io.reader's work besides the reads for {plan['batch_neurons']} neurons "
                   "on a one-layer store")
    req = result.get("request_cpu")
    if req and req["reads"] > 0:   # the I/O path's own cost, on any host (real/bench/bench_request_cpu.py)
        extra["request_cpu_s"] = sig4(req["request_cpu_s"])
        cited = request_cpu_source(req, req["date"], req["host"], req["tool"], result.get("direct_io", True))
        extra["request_cpu_source"] = {"kind": "measured", "source": cited}
        source += "; " + cited
    if shares_cpu and host and host["cpu_s_per_read"] > 0:
        keys = ("compute_lost_s_per_read", "read_delay_s_per_read", "compute_lost_s_per_batch", "read_delay_s_per_batch")
        extra["host_cpu_s_per_read"] = sig4(host["cpu_s_per_read"])
        extra.update({k: sig4(host[k]) for k in keys})
        if host.get("framework"):
            extra.update({f"framework_{k}": sig4(host["framework"][k]) for k in keys})
            source += "; the framework_ terms with a tiny transformers llama as the compute"
        long = host.get("long")
        if host.get("framework") and long and all(p.get("op_s") for p in (host, host["framework"], long)) \
                and host["framework"]["op_s"] < host["op_s"] < long["op_s"]:
            extra.update({f"long_kernel_{k}": sig4(long[k]) for k in keys})
            extra.update({"framework_probe_op_s": sig4(host["framework"]["op_s"]), "kernel_probe_op_s": sig4(host["op_s"]),
                          "long_kernel_probe_op_s": sig4(long["op_s"])})
            source += (f"; the long_kernel_ terms with a {PROBE_LONG_DIM} x {PROBE_LONG_DIM} fp32 GEMV as the compute; "
                       "each probe's seconds per torch call counted with a TorchFunctionMode")
        source += (f"; host CPU per read and compute lost per read measured at {format_bytes(host['chunk_bytes'])} x "
                   f"{host['in_flight']} in flight, batches of {host['batch_reads']} reads, with a "
                   f"{host['compute_threads']}-thread compute probe "
                   f"(load average {host['load_average_1min']:.1f})")
    return {
        "sequential_read_bytes_per_s": sig4(result["sequential"]["bytes_per_s"]),
        "read_latency_s": sig4(result["latency_4k_qd1"]["mean_s"]),
        "max_in_flight": int(max(g["in_flight"])),
        "read_table": {"chunk_bytes": [int(c) for c in g["chunk_bytes"]], "in_flight": [int(q) for q in g["in_flight"]],
                       "bytes_per_s": [[sig4(v) for v in row] for row in g["bytes_per_s"]]},
        **extra,
        "source": source,
    }


def parse_list(text: str, parse: Callable[[str], int], what: str) -> tuple[int, ...]:
    """'4KiB,16KiB' -> (4096, 16384); FlashsimError names the option."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise FlashsimError(f"{what}: give a comma-separated list")
    return tuple(parse(t) for t in items)


def table_rows(grid: dict[str, Sequence]) -> list[list[str]]:
    """Rows for printing: chunk, then MiB/s per in-flight count."""
    return [[format_bytes(c)] + [f"{v / 2**20:.0f}" for v in row]
            for c, row in zip(grid["chunk_bytes"], grid["bytes_per_s"])]
