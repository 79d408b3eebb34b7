"""`flashsim bench flash`: random-read throughput over chunk size x reads in flight, sequential
bandwidth and 4 KiB queue-depth-1 latency of the disk holding a file (bytes, seconds, bytes/s).

Method (the same I/O path as the real backend's reader, so its numbers are comparable):
Python threads, one per read in flight, each issuing `os.preadv` at random offsets aligned to the
chunk size (as fio's `randread` does), with O_DIRECT so the page cache never serves a read, into
destinations that move through DEST_BYTES of huge-page memory (below). Each grid point runs for
`duration_s`; its throughput is the bytes completed divided by the time from the common start to
the last completion; the grid is swept `passes` times (default 5, directions alternating, each
point duration_s / passes per sweep) and each point's value is the mean over sweeps of its time per
byte (the harmonic mean of the sweeps' throughputs). This host's virtio disk switches between
states for seconds to a minute at a time, at small reads deep in the queue only (4 KiB x 32 in
flight: 174 MB/s in one calibration, 340 MB/s steadily for the next minute, while 64 KiB and 256
KiB stayed within 3% of the same profile), so a single sweep records whichever state it hits. A run
of minutes meets the states in proportion and its latency adds read times, so the mean time per
byte is what predicts it; a median (used until the seventh round) keeps whichever state most sweeps
hit (one calibration kept 731 MB/s at 16 KiB x 32 in flight, two of three sweeps in a slow state,
where 15 s of the same reads right after ran at 1040-1105 MB/s). The JSON keeps every sweep's value
(`grid.bytes_per_s_per_pass`). Offsets come from a seeded generator per grid point. Without
O_DIRECT (filesystems that refuse it) the file is opened buffered with readahead disabled and
dropped from the page cache before every point; results then say `direct_io: false`, since later
reads of the same pages may come from RAM.

Destinations: a read lands where the workload puts it. The real backend's reads land in a neuron
cache's rows, a different place in a region of megabytes (SmolLM2 at half its FFN: 5 MB per layer;
a 7B shape: 135 MB) on huge pages (real/buffers.py), so each thread here takes the next slot of its
own in one DEST_BYTES (64 MiB) huge-page region; until the eighth round each thread reread into one
buffer. On this VM the same random reads into one reused buffer per thread ran faster than into
slots across 64 MiB of huge pages: 5.72 vs 6.08 ms for 16 reads of 1 MiB at depth 1, 3.10 vs 3.25 ms
for 32 x 256 KiB at 4, 4.03 vs 4.27 ms for 128 x 64 KiB at 16, 3.97 vs 4.10 ms for 256 x 16 KiB at
32 (3-6%; presumably the host translating each new destination page for the device's transfer,
which a reused buffer keeps cached). Into 4 KiB pages the same reads took twice as long, which is
why the reader's cache is on huge pages. The staged-read point keeps one staging buffer per thread,
as real.reader does.

Sequential bandwidth: consecutive reads of max(1 MiB, largest chunk) with 1 and with 4 reads in
flight (threads taking the next offset), the better of the two. Latency: single 4 KiB reads at
queue depth 1 (mean, p50, p99).

Staged reads (`staged_read_cost`; the profile's `flash.staged_s_per_read`): real.reader reads units
that are not aligned for direct I/O (an unbundled SmolLM2 fp32 row is 2304 B; any packed store)
into a per-thread staging buffer and copies them out under the interpreter lock. The 4 KiB point at
the largest reads in flight is measured with and without that copy; the difference per read is
what the simulator adds to each staged read (measured here: 12-20 us on top of 12 us).

Segmented reads (`segment_cost`; the profile's `flash.segment_s`): real.reader reads a run of
unbundled rows that are 4 KiB multiples in place, one iovec per row (each lands in its own cache
row), so one read fills many discontiguous buffers. On this VM's virtio disk every extra buffer
costs device time: 64 KiB reads at 32 in flight ran at 2297 MB/s into one buffer and 1145 MB/s
into 16 (16 KiB into 4: 1035 vs 782; 256 KiB into 64 at 8 in flight: 2975 vs 1276), 1.7-1.9 us
of device time per extra buffer at every size and depth tried (the emulated device serves each
descriptor on its own). The point is read both ways, alternating, and segment_s is the difference
per read over the extra segments.

Batch overhead and reader planning (the profile's `flash.batch_overhead_s`, `plan_s_per_batch`,
`plan_s_per_neuron`) and the backend's cache index work (`flash.cache_index_s_per_layer`): timed
through real.reader itself on a small store written next to the bench file before the grid
(real/bench_reader.py). On a host whose CPU computes (host CPU probe on), the same store also times
compute after a read wait (`flash.cold_batch_reads`, `cold_compute_s`, `framework_cold_compute_s`;
real/bench_cold.py). The planning, the index work and the compute after a wait are timed in one
round after each sweep of the grid, and the profile keeps each value's median over the rounds
(`bench_reader.median_of_rounds`, `_cpu_round`): each is a fraction of a second of CPU work that
moves with the host's state (a single 0.3 s measurement of the planning moved 2.5x between
calibrations five minutes apart), so the rounds sample it across the whole calibration. The batch
overhead, which needs the finished read table, is timed after the grid.

Host CPU of the reads (`probe_samples` rounds, `probe_summary`; the profile's
`flash.host_cpu_s_per_read`, `compute_lost_s_per_read`, `read_delay_s_per_read` and their
`_per_batch` counterparts, see sim/components/compute.py `HostCpu`): every grid point also records the process CPU time
(getrusage, user + system, all threads) per read. Then, at PROBE_CHUNK_BYTES and the largest reads
in flight, reads are issued the way the real backend prefetches (a background thread handing
batches of B reads to a persistent pool of reader threads, real.reader's own `_Workers`, each
thread's reads landing in its next slot of the destination region, as the grid's do), for two
batch sizes B (2x and 8x the reads in flight), and short slices alternate: a decode-like compute
probe alone (a 1024 x 1024 fp32 GEMV and a normalisation, ~0.1-0.3 ms per iteration, on
`compute_threads` threads) | batches alone | both at once, PROBE_SLICES slices in all, in rounds
after each sweep of the grid like the planning above (how much reads and compute slow each other
moved by a quarter within five minutes here). Medians over all slices (bursts of load from
other processes hit the three alike) give, per batch size, the batch time alone and with the
probe, the probe's time lost per batch and the CPU per read; a straight line through the two batch
sizes splits each effect into a per-batch and a per-read part (clipped at 0):
  * cpu_s_per_read: CPU time per read, batches alone;
  * compute_lost_s_per_read / _per_batch: the probe's lost time;
  * read_delay_s_per_read / _per_batch: how much longer a batch takes while the probe runs.
The probe runs three times: with the GEMV compute (kernels, which release the interpreter lock),
with decode steps of a tiny transformers llama (framework code, which holds it: the profile's
framework_* terms; it interferes 3-4x more here, compute lost 16-19 vs 5 us per read) and with a
PROBE_LONG_DIM-wide GEMV (long kernels, about 1 ms per torch call: long_kernel_*). Each probe's
torch calls per iteration are counted once (a TorchFunctionMode, untimed), so the profile keeps
its seconds per call (`*_probe_op_s`): a Python decoder loop re-takes the interpreter lock after
every call, and the simulator places a loop between the probes by its own seconds per call
(sim/components/compute.py, "A Python decoder loop").
Without torch the probe is NumPy. The load average is recorded with the numbers.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import resource
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from devices.errors import FlashsimError
from devices.units import format_bytes
from real.bench_cold import COLD_SAMPLES, cold_compute
from real.bench_reader import (
    batch_overhead,
    bench_store,
    cache_index_cost,
    median_of_rounds,
    read_plan_cost,
)
from real.buffers import ALIGN_BYTES, AlignedBuffer, round_down
from real.fsinfo import RAM_FILESYSTEMS, filesystem_type
from real.profile_writer import sig4

SEQ_CHUNK_BYTES = 1 << 20
FILE_WRITE_BLOCK = 16 << 20
DEFAULT_CHUNKS = tuple(4096 << i for i in range(9))          # 4 KiB .. 1 MiB
DEFAULT_IN_FLIGHT = (1, 2, 4, 8, 16, 32, 64)
QUICK_CHUNKS = (4096, 65536, 1 << 20)
QUICK_IN_FLIGHT = (1, 4)
PROBE_CHUNK_BYTES = 16384     # near a bundle of a small model (12-24 KiB): the reads a prefetch issues
PROBE_SLICES = 20
PROBE_SLICE_S = 0.1
PROBE_DIM = 1024              # the probe GEMV: 4 MiB of fp32 weights, a decode layer's projection
PROBE_LONG_DIM = 4096         # the long-kernel probe: 64 MiB of fp32 weights, about 1 ms per torch call
PROBE_KINDS = ("host", "framework", "long")   # the kernel probe (profile's plain terms), framework_, long_kernel_
STAGED_CHUNK_BYTES = 4096     # staged reads: a padded row of an unaligned unit (SmolLM2 fp32: 2304 B)
SEGMENT_CHUNK_BYTES = 65536   # segment cost: a run of 16 unbundled 4 KiB rows, read as one iovec and as 16
STAGE_ROWS = 64               # destination rows of the staging copy (cycled)
STAGE_COL = 2304              # ... and the column it lands at (an unaligned one, as for a down row)
DEST_BYTES = 64 << 20         # reads land in turn across this much huge-page memory (module doc: destinations)


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


class BenchFile:
    """The file under test, opened for direct reads; created (random bytes) when it does not exist."""

    def __init__(self, path: Path, size_bytes: int, seed: int, direct: bool | None, keep: bool):
        self.path, self.created = path, False
        self.filesystem = filesystem_type(path)
        if self.filesystem in RAM_FILESYSTEMS:
            raise FlashsimError(f"--path {path}: on {self.filesystem}, which is RAM, not flash; put the file on the "
                                "disk the weight store will live on")
        if not path.exists():
            _create(path, size_bytes, seed)
            self.created = True
        elif not path.is_file():
            raise FlashsimError(f"--path {path}: not a regular file")
        self.keep = keep or not self.created
        self.size_bytes = round_down(path.stat().st_size)
        self.direct_io, self.note = True, ""
        self.fd = self._open(direct)
        self._dest: AlignedBuffer | None = None

    def destination(self, min_bytes: int) -> AlignedBuffer:
        """The huge-page region reads land in (DEST_BYTES, or min_bytes when larger); made once."""
        if self._dest is None or self._dest.nbytes < min_bytes:
            self._dest = None   # free the old region before the new one is touched
            self._dest = AlignedBuffer(max(DEST_BYTES, min_bytes), huge=True)
        return self._dest

    def _open(self, direct: bool | None) -> int:
        if direct is not False:
            try:
                return os.open(self.path, os.O_RDONLY | os.O_DIRECT)
            except OSError as e:
                if e.errno not in (errno.EINVAL, errno.EOPNOTSUPP) or direct:
                    raise FlashsimError(f"{self.path}: cannot open for direct I/O ({e.strerror})") from None
                self.note = f"O_DIRECT refused ({e.strerror}): buffered reads, page cache dropped before each point"
        self.direct_io = False
        fd = os.open(self.path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        return fd

    def drop_cache(self) -> None:
        if not self.direct_io:
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def close(self) -> None:
        os.close(self.fd)
        self._dest = None
        if not self.keep:
            self.path.unlink(missing_ok=True)


def _create(path: Path, size_bytes: int, seed: int) -> None:
    """Random (incompressible) bytes, so no drive compresses or deduplicates its way to speed."""
    from real.store_writer import check_disk_room

    size = round_down(size_bytes)
    if size < ALIGN_BYTES:
        raise FlashsimError(f"--size {size_bytes}: the bench file must be at least {ALIGN_BYTES} bytes")
    path.parent.mkdir(parents=True, exist_ok=True)
    check_disk_room(path.parent, size)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xF11E]))
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            done = 0
            while done < size:
                n = min(FILE_WRITE_BLOCK, size - done)
                f.write(rng.bytes(n))
                done += n
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise FlashsimError(f"{path}: cannot write the bench file ({e.strerror})") from None
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


def _read_or_fail(fd: int, bufs: list[memoryview], off: int, path: Path) -> int:
    try:
        got = os.preadv(fd, bufs, off)
    except OSError as e:
        raise FlashsimError(f"{path}: I/O error at offset {off} ({e.strerror})") from None
    want = sum(len(b) for b in bufs)
    if got != want:
        raise FlashsimError(f"{path}: short read at offset {off}: {got} of {want} bytes")
    return got


def process_cpu_s() -> float:
    """CPU seconds (user + system) of this process, all threads."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _thread_slots(dest: AlignedBuffer, k: int, in_flight: int, slot_bytes: int) -> list[memoryview]:
    """Thread k's destinations in `dest` (module doc, destinations): slots k, k + in_flight, ...
    of slot_bytes each, as many as fit."""
    mv = memoryview(dest.array)
    n = dest.nbytes // slot_bytes // in_flight
    return [mv[(m * in_flight + k) * slot_bytes: (m * in_flight + k + 1) * slot_bytes] for m in range(n)]


def random_read_bytes_per_s(bf: BenchFile, chunk: int, in_flight: int, duration_s: float,
                            rng: np.random.Generator, stats: dict[str, float] | None = None,
                            stage_copy: bool = False, segment_bytes: int | None = None) -> float:
    """Throughput of random chunk-aligned reads of `chunk` bytes with `in_flight` threads.
    `stats`, when given, receives `reads` and `cpu_s` (process CPU time over the point).
    `stage_copy`: after each read, copy its bytes into a row of a destination matrix the way
    real.reader does for units that cannot land in place (a reshaped view of the staging buffer
    assigned into a row slice). `segment_bytes`: each read lands in chunk / segment_bytes
    discontiguous buffers (iovecs of that size, one every 2 x segment_bytes), as real.reader's
    in-place reads of a run of unbundled rows land one row per cache row."""
    n_slots = (bf.size_bytes - chunk) // chunk + 1
    if n_slots < 1:
        raise FlashsimError(f"{bf.path}: {format_bytes(bf.size_bytes)} is smaller than a {format_bytes(chunk)} chunk")
    seeds = rng.spawn(in_flight)
    bf.drop_cache()
    # where the reads land (module doc, destinations): slots of one huge-page region, thread k
    # taking slots k, k + in_flight, ... in turn; a segmented read spans 2 x chunk
    slot_bytes = 2 * chunk if segment_bytes else chunk
    dest = None if stage_copy else bf.destination(in_flight * slot_bytes)

    def worker(k: int, out: list[float], start: threading.Barrier | None) -> None:
        if dest is None:   # real.reader's small per-thread staging buffer (4 KiB pages), then a copy
            buf = AlignedBuffer(chunk, huge=False)
            iovs = [[memoryview(buf.array)[:chunk]]]
        elif segment_bytes:
            iovs = [[slot[o: o + segment_bytes] for o in range(0, 2 * chunk, 2 * segment_bytes)]
                    for slot in _thread_slots(dest, k, in_flight, slot_bytes)]
        else:
            iovs = [[slot] for slot in _thread_slots(dest, k, in_flight, slot_bytes)]
        dst = np.empty((STAGE_ROWS, chunk + ALIGN_BYTES), np.uint8) if stage_copy else None
        offs = (seeds[k].integers(0, n_slots, 4096) * chunk).tolist()
        if start is not None:
            start.wait()
        t_end = time.perf_counter() + duration_s
        done, i = 0, 0
        while True:
            done += _read_or_fail(bf.fd, iovs[n_reads[k] % len(iovs)], offs[i], bf.path)
            if dst is not None:   # real.reader's copy out of the staging buffer (one unit per read)
                r = i % STAGE_ROWS
                dst[r: r + 1, STAGE_COL: STAGE_COL + chunk] = buf.array[:chunk].reshape(1, chunk)[:, :chunk]
            i += 1
            n_reads[k] += 1
            if i == len(offs):
                offs, i = (seeds[k].integers(0, n_slots, 4096) * chunk).tolist(), 0
            if time.perf_counter() >= t_end:
                break
        out[k] = done
        out[in_flight + k] = time.perf_counter()

    n_reads = [0] * in_flight
    c0 = process_cpu_s()
    rate = _run_threads(worker, in_flight)
    if stats is not None:
        stats.update(reads=float(sum(n_reads)), cpu_s=process_cpu_s() - c0)
    return rate


def sequential_bytes_per_s(bf: BenchFile, chunk: int, in_flight: int, duration_s: float) -> float:
    """Consecutive reads of `chunk` bytes, `in_flight` threads taking the next offset in turn."""
    n_chunks = bf.size_bytes // chunk
    if n_chunks < 1:
        raise FlashsimError(f"{bf.path}: smaller than one {format_bytes(chunk)} sequential read")
    lock = threading.Lock()
    nxt = [0]
    bf.drop_cache()
    dest = bf.destination(chunk * in_flight)   # as for random reads: a layer's worth of destinations

    def worker(k: int, out: list[float], start: threading.Barrier | None) -> None:
        iovs = [[slot] for slot in _thread_slots(dest, k, in_flight, chunk)]
        if start is not None:
            start.wait()
        t_end = time.perf_counter() + duration_s
        done, i = 0, 0
        while time.perf_counter() < t_end:
            with lock:
                j = nxt[0] % n_chunks
                nxt[0] += 1
            done += _read_or_fail(bf.fd, iovs[i % len(iovs)], j * chunk, bf.path)
            i += 1
        out[k] = done
        out[in_flight + k] = time.perf_counter()

    return _run_threads(worker, in_flight)


def _run_threads(worker: Callable[[int, list[float], threading.Barrier | None], None], n: int) -> float:
    out = [0.0] * (2 * n)
    errors: list[BaseException] = []
    if n == 1:
        t0 = time.perf_counter()
        worker(0, out, None)
        return out[0] / (out[1] - t0)
    start = threading.Barrier(n + 1)

    def guarded(k: int) -> None:
        try:
            worker(k, out, start)
        except BaseException as e:  # handed to the caller
            errors.append(e)
            start.abort()

    threads = [threading.Thread(target=guarded, args=(k,), daemon=True) for k in range(n)]
    for t in threads:
        t.start()
    with contextlib.suppress(threading.BrokenBarrierError):  # a worker failed: its error is raised below
        start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return sum(out[:n]) / (max(out[n:]) - t0)


def latency_4k_qd1(bf: BenchFile, duration_s: float, rng: np.random.Generator) -> dict[str, float]:
    """Single 4 KiB reads at random aligned offsets, one at a time."""
    bf.drop_cache()
    buf = AlignedBuffer(ALIGN_BYTES)
    mv = [memoryview(buf.array)[:ALIGN_BYTES]]
    n_slots = bf.size_bytes // ALIGN_BYTES
    lat: list[float] = []
    t_end = time.perf_counter() + duration_s
    while time.perf_counter() < t_end or len(lat) < 16:
        offs = (rng.integers(0, n_slots, 256) * ALIGN_BYTES).tolist()
        for off in offs:
            t = time.perf_counter()
            _read_or_fail(bf.fd, mv, off, bf.path)
            lat.append(time.perf_counter() - t)
    a = np.asarray(lat)
    return {"mean_s": float(a.mean()), "p50_s": float(np.median(a)), "p99_s": float(np.quantile(a, 0.99)),
            "reads": len(a)}


class TorchCallCounter:
    """Counts torch calls made from Python (a TorchFunctionMode) while active."""

    def __init__(self, torch: Any):
        class Mode(torch.overrides.TorchFunctionMode):
            def __torch_function__(mode, func, types, args=(), kwargs=None):  # noqa: N805
                self.calls += 1
                return func(*args, **(kwargs or {}))

        self.calls, self.mode = 0, Mode()


def calls_per_iteration(probe: Callable[[float], int], duration_s: float = 0.05) -> float | None:
    """Mean torch calls per iteration of a probe (None without torch): one short untimed run under
    a counting mode (the probes' op rhythm: FlashSpec.framework_probe_op_s etc.)."""
    try:
        import torch
    except ImportError:
        return None
    counter = TorchCallCounter(torch)
    with counter.mode:
        n = probe(time.perf_counter() + duration_s)
    return counter.calls / n if n and counter.calls else None


def _compute_probe(threads: int, seed: int, dim: int = PROBE_DIM) -> Callable[[float], int]:
    """A decode-like compute loop on `threads` threads: run(until_perf_counter) -> iterations
    (a dim x dim GEMV and a normalisation per iteration)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((dim, dim), dtype=np.float32)
    try:
        import torch
    except ImportError:
        x = [rng.standard_normal(dim, dtype=np.float32)]

        def run_np(until: float) -> int:
            n = 0
            while time.perf_counter() < until:
                y = w @ x[0]
                x[0] = y / np.linalg.norm(y)
                n += 1
            return n

        return run_np
    torch.set_num_threads(threads)
    wt, xt = torch.from_numpy(w), [torch.from_numpy(rng.standard_normal(dim, dtype=np.float32))]

    def run_torch(until: float) -> int:
        n = 0
        with torch.no_grad():
            while time.perf_counter() < until:
                y = torch.mv(wt, xt[0])
                xt[0] = y / y.norm()
                n += 1
        return n

    return run_torch


def _framework_probe(threads: int, seed: int) -> Callable[[float], int] | None:
    """Framework-code compute: decode steps of a tiny random llama in transformers (Python module
    code holding the interpreter lock most of the time, like model mode's attention), restarted
    every 64 steps; None without transformers."""
    try:
        import torch
    except ImportError:
        return None
    from real.bench_compute import tiny_llama
    from real.model_mode import _decode_step

    torch.set_num_threads(threads)
    tiny = tiny_llama(torch, 4, seed)
    if tiny is None:
        return None
    model, arg, ids = tiny
    state: dict[str, Any] = {"past": None, "steps": 0}

    def run(until: float) -> int:
        n = 0
        with torch.no_grad():
            while time.perf_counter() < until:
                if state["steps"] % 64 == 0:
                    state["past"] = None
                _, state["past"] = _decode_step(model, ids, state["past"], arg)
                state["steps"] += 1
                n += 1
        return n

    return run


def probe_samples(bf: BenchFile, chunk: int, in_flight: int, *, slices: int, slice_s: float = PROBE_SLICE_S,
                  compute_threads: int = 1, seed: int = 0, batch_reads: tuple[int, int] | None = None,
                  kind: str = "host", round_: int = 0,
                  probe: Callable[[float], int] | None = None) -> dict[str, Any] | None:
    """One round of the host CPU probe: `slices` slices per batch size, each the compute alone |
    batches alone | both at once; returns the per-slice samples (None without a compute probe).
    `kind` (PROBE_KINDS): the kernel GEMV ("host"), the tiny llama ("framework") or the long GEMV;
    `probe`: any other compute, run(until_perf_counter) -> iterations (kind is then unused).
    Reads are issued as the real backend issues a prefetch: a background thread hands batches of B
    reads to a persistent pool of `in_flight` threads (the reader's own `_Workers`), one batch after
    another. Two batch sizes separate the per-batch cost (waking and collecting the pool's threads)
    from the per-read cost (`probe_summary`)."""
    from real.reader import _Workers

    n_slots = (bf.size_bytes - chunk) // chunk + 1
    if n_slots < 1:
        raise FlashsimError(f"{bf.path}: {format_bytes(bf.size_bytes)} is smaller than a {format_bytes(chunk)} chunk")
    sizes = batch_reads or (2 * in_flight, 8 * in_flight)
    torch_threads = _torch_threads()
    if kind not in PROBE_KINDS:
        raise ValueError(f"probe kind must be one of {PROBE_KINDS}, got {kind!r}")
    if probe is None:
        probe = (_framework_probe(compute_threads, seed) if kind == "framework" else
                 _compute_probe(compute_threads, seed, PROBE_LONG_DIM if kind == "long" else PROBE_DIM))
    if probe is None:
        _restore_torch_threads(torch_threads)
        return None
    calls = calls_per_iteration(probe)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xC0DE, round_]))
    # where the reads land: thread w takes its next slot of the huge-page region in turn, as the
    # grid's reads do and as a prefetch's reads land in cache rows (module doc, destinations)
    dest = bf.destination(in_flight * chunk)
    slots = [itertools.cycle([[mv] for mv in _thread_slots(dest, w, in_flight, chunk)]) for w in range(in_flight)]
    pool = _Workers(in_flight) if in_flight > 1 else None

    def one_batch(n: int) -> None:
        offs = (rng.integers(0, n_slots, n) * chunk).tolist()
        nxt = itertools.count()

        def work(w: int) -> None:
            mine = slots[w]
            while (j := next(nxt)) < n:
                _read_or_fail(bf.fd, next(mine), offs[j], bf.path)

        if pool is None:
            work(0)
        else:
            pool.run(work, min(in_flight, n))

    def batches_during(n: int, fn: Callable[[], Any]) -> tuple[list[float], float, float]:
        """Batches of n reads back to back on a background thread while fn() runs here:
        (durations of the batches that ended during fn, wall s of fn, process CPU s of fn)."""
        stop, done, errors = threading.Event(), [], []

        def issuer() -> None:
            try:
                while not stop.is_set():
                    t = time.perf_counter()
                    one_batch(n)
                    done.append((t, time.perf_counter()))
            except BaseException as e:  # handed to the caller
                errors.append(e)

        th = threading.Thread(target=issuer, daemon=True)
        th.start()
        try:
            c0, t0 = process_cpu_s(), time.perf_counter()
            fn()
            c1, t1 = process_cpu_s(), time.perf_counter()
        finally:
            stop.set()
            th.join()
        if errors:
            raise errors[0]
        return [b - a for a, b in done if a >= t0 and b <= t1], t1 - t0, c1 - c0

    it_alone: list[float] = []
    per: dict[int, dict[str, list[float]]] = {n: {"alone": [], "both": [], "lost": [], "cpu": []} for n in sizes}
    try:
        probe(time.perf_counter() + slice_s)                       # warm-up
        bf.drop_cache()
        for _ in range(slices):
            for n in sizes:
                t0 = time.perf_counter()
                k = probe(t0 + slice_s)
                it_alone.append((time.perf_counter() - t0) / max(k, 1))
                durs, wall, cpu = batches_during(n, lambda: time.sleep(slice_s))
                if durs:
                    per[n]["alone"].append(float(np.median(durs)))
                    per[n]["cpu"].append(cpu / (len(durs) * n))
                box = [0]

                def both(box: list[int] = box) -> None:
                    box[0] = probe(time.perf_counter() + slice_s)

                durs, wall, _ = batches_during(n, both)
                if durs:
                    per[n]["both"].append(float(np.median(durs)))
                    # compute lost per batch: the probe's extra time over the batches that ran meanwhile
                    per[n]["lost"].append((wall - box[0] * it_alone[-1]) * float(np.median(durs)) / wall)
    finally:
        if pool is not None:
            pool.close()
        _restore_torch_threads(torch_threads)
    return {"chunk_bytes": chunk, "in_flight": in_flight, "compute_threads": compute_threads, "slices": slices,
            "slice_s": slice_s, "batch_reads": list(sizes), "per": per, "it_alone": it_alone,
            "calls_per_iteration": calls, "load_average_1min": os.getloadavg()[0]}


def probe_summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The probe's result from the samples of one or more rounds (`probe_samples`, same chunk,
    depth and batch sizes): per batch size the medians over all slices, then a straight line
    through the two batch sizes splits each effect into a per-batch and a per-read part (>= 0)."""
    first = rounds[0]
    sizes = first["batch_reads"]
    med = {n: {k: float(np.median(v)) if (v := [x for r in rounds for x in r["per"][n][k]]) else float("nan")
               for k in ("alone", "both", "lost", "cpu")} for n in sizes}
    (n1, n2) = sizes

    def line(y1: float, y2: float) -> tuple[float, float]:
        """(per batch, per read) through the two batch sizes, both >= 0."""
        per_read = max(0.0, (y2 - y1) / (n2 - n1))
        return max(0.0, y1 - per_read * n1), per_read

    delay = {n: med[n]["both"] - med[n]["alone"] for n in sizes}
    lost_b, lost_r = line(med[n1]["lost"], med[n2]["lost"])
    delay_b, delay_r = line(delay[n1], delay[n2])
    return {"chunk_bytes": first["chunk_bytes"], "in_flight": first["in_flight"],
            "compute_threads": first["compute_threads"], "slices": sum(r["slices"] for r in rounds),
            "rounds": len(rounds), "slice_s": first["slice_s"], "batch_reads": list(sizes),
            "cpu_s_per_read": float(np.nanmedian([med[n]["cpu"] for n in sizes])),
            "compute_lost_s_per_read": lost_r, "compute_lost_s_per_batch": lost_b,
            "read_delay_s_per_read": delay_r, "read_delay_s_per_batch": delay_b,
            "per_batch_size": {str(n): {"batch_s": med[n]["alone"], "batch_with_compute_s": med[n]["both"],
                                        "compute_lost_s": med[n]["lost"], "cpu_s_per_read": med[n]["cpu"],
                                        "delay_s": delay[n]}
                               for n in sizes},
            "probe_iteration_s": (it := float(np.median([x for r in rounds for x in r["it_alone"]]))),
            # seconds per torch call (None without torch, or a round that could not count)
            "op_s": it / calls if (calls := _median_calls(rounds)) else None,
            "load_average_1min": float(np.median([r["load_average_1min"] for r in rounds]))}


def _median_calls(rounds: list[dict[str, Any]]) -> float | None:
    calls = [r.get("calls_per_iteration") for r in rounds]
    return float(np.median(calls)) if calls and all(c for c in calls) else None  # type: ignore[arg-type]


def _torch_threads() -> int | None:
    try:
        import torch
    except ImportError:
        return None
    return torch.get_num_threads()


def _restore_torch_threads(n: int | None) -> None:
    if n is not None:
        import torch

        torch.set_num_threads(n)


def _cpu_round(bf: BenchFile, store: Any, cfg: FlashBenchConfig, r: int, rounds: dict[str, list]) -> None:
    """One round of the CPU work around I/O waits, after sweep r of the grid: the reader's planning,
    the cache index work and (host CPU probe on) compute after a read wait, on `store` (None: a
    folder without room for it), then the host CPU probe's slices for this round, kernel and
    framework. Each is CPU work that moves with the host's state (one slow spell moved a single
    0.3 s measurement of the planning 2.5x; the validate checks saw this work at 0.5-2.2x a profile
    within 14 minutes), so the rounds are spread over the whole grid, one after each sweep, and the
    profile keeps the median of each (until the eighth round they ran back to back after the grid;
    the validate checks after three such calibrations found this work at a median 0.65x, 1.35x and
    0.81x of the profile over the 14 minutes that followed)."""
    q = max(cfg.in_flight)
    if store is not None:
        rounds["plan"].append(read_plan_cost(store, q, cfg.seed + r, min(0.3, cfg.duration_s)))
        rounds["index"].append(cache_index_cost(store, q, cfg.seed + r, min(0.3, cfg.duration_s)))
        if cfg.host_cpu:
            # COLD_SAMPLES layers per point over all rounds (a short bench, --quick or short points: 8 per round)
            n = max(8, COLD_SAMPLES // cfg.passes) if cfg.duration_s >= 0.5 else 8
            rounds["cold"].append(cold_compute(store, q, cfg.seed + r, samples=n))
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
        sweeps, cpus = np.zeros(shape), np.zeros(shape)
        points = [(i, j) for i in range(len(cfg.chunks)) for j in range(len(cfg.in_flight))]
        batches = plan = cold = index = None
        skipped = None
        rounds: dict[str, list[dict[str, Any]]] = {k: [] for k in ("plan", "index", "cold", *PROBE_KINDS)}
        with contextlib.ExitStack() as stack:
            try:
                store = stack.enter_context(bench_store(path.resolve().parent, cfg.seed))
            except (OSError, FlashsimError) as e:   # a read-only folder, or no room for its 16 MiB
                store = None
                why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
                skipped = (f"batch overhead, reader planning and compute after a read wait not measured: cannot write a store in "
                           f"{path.resolve().parent} ({why}); the profile gets no batch terms")
            for k in range(cfg.passes):   # alternate the sweep's direction: a slow spell of the disk hits few points twice
                for i, j in (points if k % 2 == 0 else points[::-1]):
                    c, q = cfg.chunks[i], cfg.in_flight[j]
                    st: dict[str, float] = {}
                    sweeps[k, i, j] = random_read_bytes_per_s(bf, c, q, cfg.duration_s / cfg.passes,
                                                              point_rngs[i * len(cfg.in_flight) + j], stats=st)
                    cpus[k, i, j] = st["cpu_s"] / max(st["reads"], 1.0)
                    if progress:
                        progress(f"{format_bytes(c)} x {q}" + (f" (pass {k + 1}/{cfg.passes})" if cfg.passes > 1 else ""))
                _cpu_round(bf, store, cfg, k, rounds)
                if progress and cfg.host_cpu:
                    progress(f"host CPU (round {k + 1}/{cfg.passes})")
            # mean time per byte over the sweeps (module doc: the disk's states; latency adds times)
            grid, cpu = cfg.passes / np.sum(1.0 / sweeps, axis=0), np.median(cpus, axis=0)
            seq_chunk = min(max(SEQ_CHUNK_BYTES, max(cfg.chunks)), round_down(bf.size_bytes))
            seq = {q: sequential_bytes_per_s(bf, seq_chunk, q, cfg.duration_s) for q in (1, 4)}
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
                plan, index = median_of_rounds(rounds["plan"]), median_of_rounds(rounds["index"])
                cold = median_of_rounds(rounds["cold"]) if rounds["cold"] else None
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
                 "bytes_per_s_per_pass": sweeps.tolist()},
        "sequential": {"chunk_bytes": seq_chunk, "in_flight_1_bytes_per_s": seq[1],
                       "in_flight_4_bytes_per_s": seq[4], "bytes_per_s": max(seq.values())},
        "latency_4k_qd1": lat,
        "staged": staged,
        "segments": segments,
        "batches": batches,
        "read_plan": plan,
        "cold_compute": cold,
        "cache_index": index,
        "host_cpu": host,
        "load_average_1min": os.getloadavg()[0],
    }


def staged_read_cost(bf: BenchFile, chunk: int, in_flight: int, duration_s: float,
                     rng: np.random.Generator) -> dict[str, Any]:
    """Extra wall time per read when each read is copied out of a staging buffer (real.reader's
    path for units not aligned for direct I/O): the same grid point without and with the copy,
    alternated twice so a drift of the disk hits both alike; medians."""
    plain, staged = [], []
    for _ in range(2):
        for copy, out in ((False, plain), (True, staged)):
            bw = random_read_bytes_per_s(bf, chunk, in_flight, duration_s / 2, rng, stage_copy=copy)
            out.append(chunk / bw)
    t_plain, t_staged = float(np.median(plain)), float(np.median(staged))
    return {"chunk_bytes": chunk, "in_flight": in_flight, "plain_s_per_read": t_plain,
            "staged_s_per_read_total": t_staged, "staged_s_per_read": max(0.0, t_staged - t_plain)}


def segment_cost(bf: BenchFile, in_flight: int, duration_s: float, rng: np.random.Generator,
                 rounds: int = 3) -> dict[str, Any] | None:
    """Device time each extra destination segment adds to a read (the profile's `flash.segment_s`):
    SEGMENT_CHUNK_BYTES reads into one buffer and into SEGMENT_CHUNK_BYTES / ALIGN_BYTES
    discontiguous 4 KiB buffers (one iovec each: real.reader's in-place reads of a run of unbundled
    rows, one row per cache row), alternated `rounds` times at `in_flight`; per read, the device
    time is chunk / throughput, and segment_s = (many - one) / (segments - 1), median over rounds.
    None when the file is smaller than a chunk."""
    chunk = SEGMENT_CHUNK_BYTES
    if bf.size_bytes < chunk:
        return None
    segments = chunk // ALIGN_BYTES
    one, many, per = [], [], []
    for _ in range(rounds):
        t1 = chunk / random_read_bytes_per_s(bf, chunk, in_flight, duration_s / (2 * rounds), rng)
        tn = chunk / random_read_bytes_per_s(bf, chunk, in_flight, duration_s / (2 * rounds), rng,
                                             segment_bytes=ALIGN_BYTES)
        one.append(t1)
        many.append(tn)
        per.append((tn - t1) / (segments - 1))
    return {"chunk_bytes": chunk, "segments": segments, "in_flight": in_flight, "one_s_per_read": float(np.median(one)),
            "segmented_s_per_read": float(np.median(many)), "segment_s": max(0.0, float(np.median(per)))}


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
        extra["batch_overhead_s"] = [sig4(x) for x in batches["overhead_s"]]
        source += (f"; batch overhead: real.reader's batches of q and 4q {format_bytes(batches['bundle_bytes'])} bundles "
                   "at each depth q less the read table's time for their reads, scaled by the disk's state "
                   "(steady reads of the same chunks at q around each slice of batches)")
    plan = result.get("read_plan")
    if plan:
        extra["plan_s_per_batch"] = sig4(plan["per_batch_s"])
        extra["plan_s_per_neuron"] = sig4(plan["per_neuron_s"])
        source += (f"; reader planning: real.reader's work besides the reads for {plan['batch_neurons']} neurons "
                   "on a one-layer store")
    index = result.get("cache_index")
    if index:
        extra["cache_index_s_per_layer"] = sig4(index["per_layer_s"])
        extra["cache_index_s_per_evicted"] = sig4(index["per_evicted_s"])
        source += (f"; cache index work: real.backend's per-layer LayerCache.keep_only x 2 + missing on "
                   f"{index['layer_neurons']} resident neurons after a read batch, keeping or evicting them all")
    cold = result.get("cold_compute")
    if cold:
        # the profile's curve needs increasing reads: keep the points whose batch issued more reads
        # than the one before (coalescing could in principle merge two batch sizes' counts)
        keep, top = [], 0.0
        for i, r in enumerate(cold["batch_reads"]):
            if r > top:
                keep.append(i)
                top = r
        extra["cold_batch_reads"] = [sig4(cold["batch_reads"][i]) for i in keep]
        extra["cold_compute_s"] = [sig4(cold["kernel_cold_s"][i]) for i in keep]
        if cold.get("framework_cold_s"):
            extra["framework_cold_compute_s"] = [sig4(cold["framework_cold_s"][i]) for i in keep]
        source += ("; compute after a read wait: a layer's kernels (and a tiny transformers llama layer) timed right "
                   f"after real.reader batches of {cold['batch_neurons']} neurons less back to back")
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
