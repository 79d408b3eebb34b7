"""`flashsim bench flash`: random-read throughput over chunk size x reads in flight, sequential
bandwidth and 4 KiB queue-depth-1 latency of the disk holding a file (bytes, seconds, bytes/s).

Method (the same I/O path as the real backend's reader, so its numbers are comparable):
Python threads, one per read in flight, each issuing `os.preadv` into its own page-aligned buffer
at random offsets aligned to the chunk size (as fio's `randread` does), with O_DIRECT so the page
cache never serves a read. Each grid point runs for `duration_s`; its throughput is the bytes
completed divided by the time from the common start to the last completion. Offsets come from a
seeded generator per grid point. Without O_DIRECT (filesystems that refuse it) the file is opened
buffered with readahead disabled and dropped from the page cache before every point; results then
say `direct_io: false`, since later reads of the same pages may come from RAM.

Sequential bandwidth: consecutive reads of max(1 MiB, largest chunk) with 1 and with 4 reads in
flight (threads taking the next offset), the better of the two. Latency: single 4 KiB reads at
queue depth 1 (mean, p50, p99).
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from devices.errors import FlashsimError
from devices.units import format_bytes
from real.buffers import ALIGN_BYTES, AlignedBuffer, round_down
from real.fsinfo import RAM_FILESYSTEMS, filesystem_type

SEQ_CHUNK_BYTES = 1 << 20
FILE_WRITE_BLOCK = 16 << 20
DEFAULT_CHUNKS = tuple(4096 << i for i in range(9))          # 4 KiB .. 1 MiB
DEFAULT_IN_FLIGHT = (1, 2, 4, 8, 16, 32, 64)
QUICK_CHUNKS = (4096, 65536, 1 << 20)
QUICK_IN_FLIGHT = (1, 4)


@dataclass(frozen=True)
class FlashBenchConfig:
    chunks: tuple[int, ...] = DEFAULT_CHUNKS
    in_flight: tuple[int, ...] = DEFAULT_IN_FLIGHT
    duration_s: float = 1.0
    seed: int = 0
    direct: bool | None = None     # None: O_DIRECT if the filesystem allows it

    def __post_init__(self) -> None:
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


def _read_or_fail(fd: int, buf: memoryview, off: int, path: Path) -> int:
    try:
        got = os.preadv(fd, [buf], off)
    except OSError as e:
        raise FlashsimError(f"{path}: I/O error at offset {off} ({e.strerror})") from None
    if got != len(buf):
        raise FlashsimError(f"{path}: short read at offset {off}: {got} of {len(buf)} bytes")
    return got


def random_read_bytes_per_s(bf: BenchFile, chunk: int, in_flight: int, duration_s: float,
                            rng: np.random.Generator) -> float:
    """Throughput of random chunk-aligned reads of `chunk` bytes with `in_flight` threads."""
    n_slots = (bf.size_bytes - chunk) // chunk + 1
    if n_slots < 1:
        raise FlashsimError(f"{bf.path}: {format_bytes(bf.size_bytes)} is smaller than a {format_bytes(chunk)} chunk")
    seeds = rng.spawn(in_flight)
    bf.drop_cache()

    def worker(k: int, out: list[float], start: threading.Barrier | None) -> None:
        buf = AlignedBuffer(chunk)
        mv = memoryview(buf.array)[:chunk]
        offs = (seeds[k].integers(0, n_slots, 4096) * chunk).tolist()
        if start is not None:
            start.wait()
        t_end = time.perf_counter() + duration_s
        done, i = 0, 0
        while True:
            done += _read_or_fail(bf.fd, mv, offs[i], bf.path)
            i += 1
            if i == len(offs):
                offs, i = (seeds[k].integers(0, n_slots, 4096) * chunk).tolist(), 0
            if time.perf_counter() >= t_end:
                break
        out[k] = done
        out[in_flight + k] = time.perf_counter()

    return _run_threads(worker, in_flight)


def sequential_bytes_per_s(bf: BenchFile, chunk: int, in_flight: int, duration_s: float) -> float:
    """Consecutive reads of `chunk` bytes, `in_flight` threads taking the next offset in turn."""
    n_chunks = bf.size_bytes // chunk
    if n_chunks < 1:
        raise FlashsimError(f"{bf.path}: smaller than one {format_bytes(chunk)} sequential read")
    lock = threading.Lock()
    nxt = [0]
    bf.drop_cache()

    def worker(k: int, out: list[float], start: threading.Barrier | None) -> None:
        buf = AlignedBuffer(chunk)
        mv = memoryview(buf.array)[:chunk]
        if start is not None:
            start.wait()
        t_end = time.perf_counter() + duration_s
        done = 0
        while time.perf_counter() < t_end:
            with lock:
                j = nxt[0] % n_chunks
                nxt[0] += 1
            done += _read_or_fail(bf.fd, mv, j * chunk, bf.path)
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
    mv = memoryview(buf.array)[:ALIGN_BYTES]
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
        grid = np.zeros((len(cfg.chunks), len(cfg.in_flight)))
        for i, c in enumerate(cfg.chunks):
            for j, q in enumerate(cfg.in_flight):
                grid[i, j] = random_read_bytes_per_s(bf, c, q, cfg.duration_s, point_rngs[i * len(cfg.in_flight) + j])
                if progress:
                    progress(f"{format_bytes(c)} x {q}")
        seq_chunk = min(max(SEQ_CHUNK_BYTES, max(cfg.chunks)), round_down(bf.size_bytes))
        seq = {q: sequential_bytes_per_s(bf, seq_chunk, q, cfg.duration_s) for q in (1, 4)}
        if progress:
            progress("sequential")
        lat = latency_4k_qd1(bf, cfg.duration_s, point_rngs[-1])
        if progress:
            progress("latency")
    finally:
        bf.close()
    return {
        "path": str(path), "filesystem": bf.filesystem, "file_bytes": bf.size_bytes, "file_created": bf.created,
        "direct_io": bf.direct_io,
        "note": bf.note, "method": "python threads, os.preadv, one thread per read in flight",
        "duration_s_per_point": cfg.duration_s, "seed": cfg.seed,
        "grid": {"chunk_bytes": list(cfg.chunks), "in_flight": list(cfg.in_flight),
                 "bytes_per_s": grid.tolist()},
        "sequential": {"chunk_bytes": seq_chunk, "in_flight_1_bytes_per_s": seq[1],
                       "in_flight_4_bytes_per_s": seq[4], "bytes_per_s": max(seq.values())},
        "latency_4k_qd1": lat,
    }


def flash_section(result: dict[str, Any], source: str) -> dict[str, Any]:
    """The profile's `flash` mapping (devices/schema.py FlashSpec) from a bench result."""
    g = result["grid"]
    return {
        "sequential_read_bytes_per_s": float(f"{result['sequential']['bytes_per_s']:.4g}"),
        "read_latency_s": float(f"{result['latency_4k_qd1']['mean_s']:.4g}"),
        "max_in_flight": int(max(g["in_flight"])),
        "read_table": {"chunk_bytes": [int(c) for c in g["chunk_bytes"]], "in_flight": [int(q) for q in g["in_flight"]],
                       "bytes_per_s": [[float(f"{v:.4g}") for v in row] for row in g["bytes_per_s"]]},
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
