"""The file a disk benchmark reads and its read primitives (bytes, seconds, bytes/s): `BenchFile`
(created with random bytes when missing, opened for direct I/O), random and sequential read
throughput, 4 KiB queue-depth-1 latency, and the staged-copy and segmented-read costs.
`flashsim bench flash` (real/bench/bench_flash.py) sweeps them into a profile; the host CPU probe
(real/bench/bench_host_cpu.py) and validate's host checks (real/validation/drift.py) issue their reads through them.

Method (the same I/O path as the real backend's reader, so its numbers are comparable):
Python threads, one per read in flight, each issuing `os.preadv` at random offsets aligned to the
chunk size (as fio's `randread` does), with O_DIRECT so the page cache never serves a read. A
point's throughput is the bytes completed divided by the time from the common start to the last
completion. Without O_DIRECT (filesystems that refuse it) the file is opened buffered with
readahead disabled and dropped from the page cache before every point; results then say
`direct_io: false`, since later reads of the same pages may come from RAM.

Destinations: a read lands where the workload puts it. The real backend's reads land in a neuron
cache's rows, a different place in a region of megabytes (SmolLM2 at half its FFN: 5 MB per layer;
a 7B shape: 135 MB) on huge pages (real/io/buffers.py), so each thread here takes the next slot of its
own in one DEST_BYTES (64 MiB) huge-page region, not one reused buffer per thread. On this VM the same random reads into one reused buffer per thread ran faster than into
slots across 64 MiB of huge pages: 5.72 vs 6.08 ms for 16 reads of 1 MiB at depth 1, 3.10 vs 3.25 ms
for 32 x 256 KiB at 4, 4.03 vs 4.27 ms for 128 x 64 KiB at 16, 3.97 vs 4.10 ms for 256 x 16 KiB at
32 (3-6%; presumably the host translating each new destination page for the device's transfer,
which a reused buffer keeps cached). Into 4 KiB pages the same reads took twice as long, which is
why the reader's cache is on huge pages. The staged-read point keeps one staging buffer per thread,
as real.io.reader does.

Sequential bandwidth: consecutive reads of max(1 MiB, largest chunk) with 1 and with 4 reads in
flight (threads taking the next offset), the better of the two. Latency: single 4 KiB reads at
queue depth 1 (mean, p50, p99).

Staged reads (`staged_read_cost`; the profile's `flash.staged_s_per_read`): real.io.reader reads units
that are not aligned for direct I/O (an unbundled SmolLM2 fp32 row is 2304 B; any packed store)
into a per-thread staging buffer and copies them out under the interpreter lock. The 4 KiB point at
the largest reads in flight is measured with and without that copy; the difference per read is
what the simulator adds to each staged read (measured here: 12-20 us on top of 12 us). At the same
moment real.io.reader's staged reads cost what this loop's do, within 5%.

Segmented reads (`segment_cost`; the profile's `flash.segment_s`): real.io.reader reads a run of
unbundled rows that are 4 KiB multiples in place, one iovec per row (each lands in its own cache
row), so one read fills many discontiguous buffers. On this VM's virtio disk every extra buffer
costs device time: 64 KiB reads at 32 in flight ran at 2297 MB/s into one buffer and 1145 MB/s
into 16 (16 KiB into 4: 1035 vs 782; 256 KiB into 64 at 8 in flight: 2975 vs 1276), 1.7-1.9 us
of device time per extra buffer at every size and depth tried (the emulated device serves each
descriptor on its own). The point is read both ways, alternating, and segment_s is the difference
per read over the extra segments.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from devices.errors import FlashsimError
from devices.units import format_bytes
from real.io.buffers import ALIGN_BYTES, AlignedBuffer, round_down
from real.io.fsinfo import RAM_FILESYSTEMS, filesystem_type
from traces.outputs import replace_output

FILE_WRITE_BLOCK = 16 << 20
SEGMENT_CHUNK_BYTES = 65536   # segment cost: a run of 16 unbundled 4 KiB rows, read as one iovec and as 16
STAGE_ROWS = 64               # destination rows of the staging copy (cycled)
STAGE_COL = 2304              # ... and the column it lands at (an unaligned one, as for a down row)
DEST_BYTES = 64 << 20         # reads land in turn across this much huge-page memory (module doc: destinations)


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
    from real.weights.store_writer import check_disk_room

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
        replace_output(tmp, path)
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
    real.io.reader does for units that cannot land in place (a reshaped view of the staging buffer
    assigned into a row slice). `segment_bytes`: each read lands in chunk / segment_bytes
    discontiguous buffers (iovecs of that size, one every 2 x segment_bytes), as real.io.reader's
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
        if dest is None:   # real.io.reader's small per-thread staging buffer (4 KiB pages), then a copy
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
            if dst is not None:   # real.io.reader's copy out of the staging buffer (one unit per read)
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


def staged_read_cost(bf: BenchFile, chunk: int, in_flight: int, duration_s: float,
                     rng: np.random.Generator) -> dict[str, Any]:
    """Extra wall time per read when each read is copied out of a staging buffer (real.io.reader's
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
    discontiguous 4 KiB buffers (one iovec each: real.io.reader's in-place reads of a run of unbundled
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
