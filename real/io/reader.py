"""BundleReader: reads a set of FFN neurons of one layer from a weight store into a preallocated
destination, with direct I/O, coalescing and a pool of threads (sizes in bytes, times in seconds).

One call, `read(layer, neuron_ids, dest)`, fills row i of `dest` with neuron_ids[i]'s bundle bytes
(gate row | up row | down column, the store's bundle layout, whatever the layout on disk):

1. **Plan** (vectorised): map neurons to their slots on disk, sort, cut runs of adjacent slots
   into chunks of at most `max_chunk_bytes` (never fewer than one unit). The unbundled layout plans
   each matrix region separately: a neuron costs one read per matrix unless its neighbours coalesce.
2. **Read**: `in_flight` threads take chunks in order and issue one `os.preadv` each. When the
   destination rows are page aligned and the layout is padded, the data lands straight in them
   (one iovec for a run of contiguous destination rows, else one per unit plus a sink for the
   padding): no copy. Otherwise (packed layout, or an unaligned destination) the chunk is read into
   the thread's aligned staging buffer, widened to 4 KiB boundaries, and copied out.
3. **Check**: every read must return exactly its length; a short read (truncated file) or an
   OSError (EIO) raises FlashsimError naming the file and the offset.

Direct I/O (O_DIRECT) bypasses the page cache, so every read reaches the device. Where the
filesystem refuses O_DIRECT, the reader falls back (unless `direct=True`) to buffered reads with
readahead disabled (POSIX_FADV_RANDOM) and drops the layer's pages from the page cache after each
call (POSIX_FADV_DONTNEED), so repeated reads still go to the device; `direct_io` says which in
every ReadStats and in `describe()`.
"""

from __future__ import annotations

import errno
import itertools
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from devices.errors import FlashsimError
from real.io.buffers import ALIGN_BYTES, AlignedBuffer, round_up
from real.io.fsinfo import filesystem_type
from real.weights.store import WeightStore

MAX_UNITS_PER_CHUNK = 512  # keeps a chunk's iovec list (unit + padding sink) under Linux's IOV_MAX = 1024


@dataclass(frozen=True)
class ReadStats:
    """What one `read` call did."""

    layer: int
    neurons: int
    bytes_read: int          # bytes transferred from the device (padding and 4 KiB widening included)
    bytes_useful: int        # bundle bytes asked for
    reads_issued: int
    seconds: float           # wall time of the reads (planning and eviction excluded)
    plan_seconds: float      # wall time of the vectorised planning before the reads
    chunk_bytes: np.ndarray = field(repr=False)  # int64 [reads_issued]: the size of each read
    bytes_copied: int        # staging -> destination copies (0 when the reads landed in place)
    direct_io: bool
    in_flight: int

    @property
    def bytes_per_s(self) -> float:
        return self.bytes_read / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        c = self.chunk_bytes
        return {
            "layer": self.layer, "neurons": self.neurons, "bytes_read": self.bytes_read,
            "bytes_useful": self.bytes_useful, "reads_issued": self.reads_issued, "seconds": self.seconds,
            "plan_seconds": self.plan_seconds,
            "bytes_per_s": self.bytes_per_s, "bytes_copied": self.bytes_copied, "direct_io": self.direct_io,
            "in_flight": self.in_flight,
            "chunk_bytes_min": int(c.min()) if len(c) else 0,
            "chunk_bytes_median": float(np.median(c)) if len(c) else 0.0,
            "chunk_bytes_max": int(c.max()) if len(c) else 0,
        }


@dataclass(frozen=True)
class ReadPlan:
    """The reads one call issues (absolute file offsets) and where their units go."""

    offsets: np.ndarray      # int64 [C] file offset of each read (4 KiB aligned under direct I/O)
    lengths: np.ndarray      # int64 [C] bytes of each read
    first: np.ndarray        # int64 [C] index into `rows` of each chunk's first unit
    count: np.ndarray        # int64 [C] units in each chunk
    delta: np.ndarray        # int64 [C] bytes from the read's start to its first unit (widening)
    col: np.ndarray          # int64 [C] byte column of the unit inside a destination row
    contiguous: np.ndarray   # bool  [C] the chunk's destination rows are consecutive, ascending
    rows: np.ndarray         # int64 [U] destination row of each unit, chunk by chunk
    unit_bytes: int
    stride_bytes: int


class BundleReader:
    """Direct-I/O reader of one store layout.

    Args:
        store: an opened WeightStore.
        layout: "bundled" (one unit per neuron) or "unbundled" (one per matrix).
        in_flight: threads, hence reads outstanding at once (>= 1).
        max_chunk_bytes: the largest coalesced read (a single unit may exceed it).
        direct: True requires O_DIRECT, False uses buffered reads, None tries O_DIRECT first.
    Raises ValueError for in_flight < 1 or max_chunk_bytes < 1.
    """

    def __init__(self, store: WeightStore, *, layout: str = "bundled", in_flight: int = 8,
                 max_chunk_bytes: int = 1 << 20, direct: bool | None = None):
        if in_flight < 1:
            raise ValueError(f"in_flight must be >= 1, got {in_flight}")
        if max_chunk_bytes < 1:
            raise ValueError(f"max_chunk_bytes must be >= 1, got {max_chunk_bytes}")
        self.store, self.layout_name = store, layout
        self.info = store.layout(layout)
        self.in_flight = in_flight
        self.max_units = int(min(MAX_UNITS_PER_CHUNK, max(1, max_chunk_bytes // self.info.stride_bytes)))
        self.max_chunk_bytes = max_chunk_bytes
        self.padded = store.manifest.alignment == "padded"
        self._want_direct = direct
        self.direct_io = direct is not False
        self.fallback_reason: str | None = None
        self._fds: dict[Path, int] = {}
        self._stage_bytes = round_up(self.max_units * self.info.stride_bytes) + 2 * ALIGN_BYTES
        self._stage: list[AlignedBuffer | None] = [None] * in_flight  # per thread, made on first use
        sink = max(ALIGN_BYTES, round_up(self.info.stride_bytes - self.info.unit_bytes))
        self._sink = memoryview(AlignedBuffer(sink).array)
        self._pool = _Workers(in_flight) if in_flight > 1 else None
        self._busy = threading.Lock()

    # ---- public ---------------------------------------------------------------------------------
    @property
    def dest_row_bytes(self) -> int:
        """The destination row width (bytes) that lets reads land in place: the padded bundle
        stride for the bundled layout, else the bundle rounded up to 4 KiB. Allocate cache rows
        (page-aligned) this wide to get zero-copy reads."""
        if self.layout_name == "bundled" and self.padded:
            return self.info.stride_bytes
        return round_up(self.store.bundle_bytes)

    def describe(self) -> dict[str, Any]:
        return {"layout": self.layout_name, "in_flight": self.in_flight, "max_chunk_bytes": self.max_chunk_bytes,
                "unit_bytes": self.info.unit_bytes, "stride_bytes": self.info.stride_bytes,
                "direct_io": self.direct_io, "fallback_reason": self.fallback_reason,
                "filesystem": filesystem_type(self.store.path)}

    def plan(self, layer: int, neuron_ids: np.ndarray) -> ReadPlan:
        """The coalesced reads for these neurons (vectorised; no I/O)."""
        ids = np.asarray(neuron_ids, dtype=np.int64)
        n_neurons = self.store.n_neurons
        if ids.ndim != 1 or (len(ids) and (ids.min() < 0 or ids.max() >= n_neurons)):
            raise FlashsimError(f"layer {layer}: neuron ids must be a 1-D array in [0, {n_neurons})")
        entry, info = self.store.entry(layer, self.layout_name), self.info
        slots = self.store.position[layer][ids].astype(np.int64)
        order = np.argsort(slots, kind="stable")
        s = slots[order]
        if len(s) > 1 and np.any(s[1:] == s[:-1]):
            raise FlashsimError(f"layer {layer}: duplicate neuron ids in one read")
        brk = np.ones(len(s), bool)
        brk[1:] = s[1:] != s[:-1] + 1                                   # a new run starts
        run_start = np.maximum.accumulate(np.where(brk, np.arange(len(s)), 0))
        brk |= (np.arange(len(s)) - run_start) % self.max_units == 0    # or the chunk is full
        first = np.flatnonzero(brk)
        count = np.diff(np.append(first, len(s)))
        ok = np.concatenate([[0], np.cumsum(order[1:] != order[:-1] + 1)])
        contiguous = ok[first + count - 1] - ok[first] == 0
        R = info.regions_per_layer
        starts = np.concatenate([entry.region_offsets_bytes[r] + s[first] * info.stride_bytes for r in range(R)])
        ends = starts + np.tile(count, R) * info.stride_bytes
        if not self.padded and self.direct_io:
            offsets, lengths = round_down_arr(starts), round_up_arr(ends) - round_down_arr(starts)
        else:
            offsets, lengths = starts, ends - starts
        return ReadPlan(
            offsets=offsets, lengths=lengths, first=np.tile(first, R), count=np.tile(count, R),
            delta=starts - offsets, col=np.repeat(np.arange(R) * self.store.segment_bytes, len(first)),
            contiguous=np.tile(contiguous, R), rows=order, unit_bytes=info.unit_bytes,
            stride_bytes=info.stride_bytes,
        )

    def read(self, layer: int, neuron_ids: np.ndarray, dest: np.ndarray) -> ReadStats:
        """Fill dest[i] with neuron_ids[i]'s bundle; dest is C-contiguous [k, >= bundle_bytes].

        One call at a time per reader (a background prefetcher uses its own reader)."""
        if not self._busy.acquire(blocking=False):
            raise RuntimeError("BundleReader.read is not reentrant: use one reader per thread")
        try:
            ids = np.asarray(neuron_ids, dtype=np.int64)
            buf = self._dest_bytes(dest, len(ids))
            path = self.store.file_path(layer, self.layout_name)
            fd = self._fd(path)
            t0 = time.perf_counter()
            plan = self.plan(layer, ids)
            zero_copy = self._zero_copy_ok(buf)
            n = len(plan.offsets)
            t1 = time.perf_counter()
            copied = self._run(fd, path, plan, buf, zero_copy) if n else 0
            t2 = time.perf_counter()
            if not self.direct_io:
                self._evict(fd, layer)
        finally:
            self._busy.release()
        return ReadStats(layer=layer, neurons=len(ids), bytes_read=int(plan.lengths.sum()),
                         bytes_useful=len(ids) * self.store.bundle_bytes, reads_issued=n, seconds=t2 - t1,
                         plan_seconds=t1 - t0, chunk_bytes=plan.lengths, bytes_copied=copied,
                         direct_io=self.direct_io, in_flight=self.in_flight)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}

    def __enter__(self) -> BundleReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- internals ----------------------------------------------------------------------------------
    def _dest_bytes(self, dest: np.ndarray, k: int) -> np.ndarray:
        if not isinstance(dest, np.ndarray) or dest.ndim != 2 or not dest.flags.c_contiguous:
            raise ValueError("dest must be a C-contiguous 2-D NumPy array (one row per neuron)")
        buf = dest.view(np.uint8)
        if buf.shape[0] != k or buf.shape[1] < self.store.bundle_bytes:
            raise ValueError(f"dest must be [{k}, >= {self.store.bundle_bytes}] bytes, got {list(buf.shape)} bytes")
        return buf

    def _zero_copy_ok(self, buf: np.ndarray) -> bool:
        """Can every read land straight in the destination rows?

        Buffered reads can scatter anywhere. Under O_DIRECT each iovec must be 4 KiB aligned in
        address and length: true for whole destination rows when they are as wide as the padded
        stride, or for single units (plus a padding sink) when units and columns are 4 KiB multiples."""
        if not self.direct_io:
            return True
        info, W, a = self.info, buf.shape[1], ALIGN_BYTES
        if not self.padded or buf.ctypes.data % a or W % a:
            return False
        whole_rows = info.regions_per_layer == 1 and W == info.stride_bytes
        units_aligned = info.unit_bytes % a == 0 and (info.regions_per_layer == 1 or self.store.segment_bytes % a == 0)
        return whole_rows or units_aligned

    def _run(self, fd: int, path: Path, plan: ReadPlan, buf: np.ndarray, zero_copy: bool) -> int:
        offs, lens = plan.offsets.tolist(), plan.lengths.tolist()
        first, count = plan.first.tolist(), plan.count.tolist()
        delta, col, contig = plan.delta.tolist(), plan.col.tolist(), plan.contiguous.tolist()
        rows = plan.rows
        rows_l = rows.tolist()
        unit, stride = plan.unit_bytes, plan.stride_bytes
        W = buf.shape[1]
        flat = memoryview(buf.reshape(-1))
        sink = self._sink[: stride - unit] if stride > unit else None
        # Destination rows as wide as the disk stride take the padding too: whole-row iovecs.
        whole_rows = W == stride and self.info.regions_per_layer == 1
        n = len(offs)
        counter = itertools.count()
        failed: list[BaseException] = []
        preadv = os.preadv

        # Byte ranges of contiguous destination runs, vectorised once (the common, zero-copy case).
        lo = (rows[plan.first] * W).tolist() if len(rows) else []
        hi = (rows[plan.first] * W + plan.count * W).tolist() if len(rows) else []

        def fail(j: int, e: OSError | None, got: int = 0) -> None:
            if e is not None:
                failed.append(FlashsimError(
                    f"{path}: I/O error reading {lens[j]} bytes at offset {offs[j]} "
                    f"({e.strerror or errno.errorcode.get(e.errno or 0, e)}); the disk or file is damaged"))
            else:
                failed.append(FlashsimError(
                    f"{path}: short read at offset {offs[j]}: {got} of {lens[j]} bytes (file truncated?)"))

        def work(worker: int) -> None:
            if not zero_copy and self._stage[worker] is None:
                self._stage[worker] = AlignedBuffer(self._stage_bytes)
            stage = self._stage[worker]
            stage_mv = memoryview(stage.array) if stage is not None else None
            while not failed:
                j = next(counter)
                if j >= n:
                    return
                if zero_copy and whole_rows and contig[j]:
                    iov = [flat[lo[j]: hi[j]]]
                elif zero_copy and whole_rows:
                    iov = [flat[r * W: (r + 1) * W] for r in rows_l[first[j]: first[j] + count[j]]]
                elif zero_copy:
                    iov = []
                    for r in rows_l[first[j]: first[j] + count[j]]:
                        iov.append(flat[r * W + col[j]: r * W + col[j] + unit])
                        if sink is not None:
                            iov.append(sink)
                else:
                    iov = [stage_mv[: lens[j]]]  # type: ignore[index]
                try:
                    got = preadv(fd, iov, offs[j])
                except OSError as e:
                    return fail(j, e)
                if got != lens[j]:
                    return fail(j, None, got)
                if not zero_copy:
                    f, c = first[j], count[j]
                    src = stage.array[delta[j]: delta[j] + c * stride].reshape(c, stride)[:, :unit]
                    if contig[j]:
                        r0 = rows_l[f]
                        buf[r0: r0 + c, col[j]: col[j] + unit] = src
                    else:
                        buf[rows[f: f + c], col[j]: col[j] + unit] = src

        if self._pool is None or n == 1:
            work(0)
        else:
            self._pool.run(work, min(self.in_flight, n))
        if failed:
            raise failed[0]
        return 0 if zero_copy else int(plan.count.sum()) * unit

    def _fd(self, path: Path) -> int:
        fd = self._fds.get(path)
        if fd is not None:
            return fd
        if self.direct_io:
            try:
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
                if not hasattr(os, "O_DIRECT"):
                    raise OSError(errno.EINVAL, "O_DIRECT is not available on this platform")
            except OSError as e:
                if e.errno not in (errno.EINVAL, errno.EOPNOTSUPP) or self._want_direct:
                    raise FlashsimError(f"{path}: cannot open for direct I/O ({e.strerror})") from None
                if fd is not None:
                    os.close(fd)
                self.direct_io = False
                self.fallback_reason = f"O_DIRECT refused on {path.parent} ({e.strerror}): buffered reads + page-cache eviction"
                for old in self._fds.values():  # switch every file, so one call never mixes modes
                    os.close(old)
                self._fds = {}
        if not self.direct_io:
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError as e:
                raise FlashsimError(f"{path}: cannot open ({e.strerror})") from None
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)   # no readahead: read what is asked
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # start cold (clean pages only)
        self._fds[path] = fd
        return fd

    def _evict(self, fd: int, layer: int) -> None:
        e, info = self.store.entry(layer, self.layout_name), self.info
        os.posix_fadvise(fd, e.offset_bytes, info.region_bytes * info.regions_per_layer, os.POSIX_FADV_DONTNEED)


def round_down_arr(x: np.ndarray) -> np.ndarray:
    return (x // ALIGN_BYTES) * ALIGN_BYTES


def round_up_arr(x: np.ndarray) -> np.ndarray:
    return -(-x // ALIGN_BYTES) * ALIGN_BYTES


class _Workers:
    """Persistent threads; `run(fn, k)` calls fn(worker_id) on k of them and waits for all."""

    def __init__(self, n: int):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._loop, args=(i,), daemon=True, name=f"flashsim-read-{i}")
                         for i in range(n)]
        for t in self._threads:
            t.start()

    def _loop(self, index: int) -> None:
        while True:
            fn = self._jobs.get()
            if fn is None:
                return
            try:
                fn(index)  # one thread, one index: its staging buffer is its own
                self._done.put(None)
            except BaseException as e:  # handed to the caller
                self._done.put(e)

    def run(self, fn: Any, k: int) -> None:
        for _ in range(k):
            self._jobs.put(fn)
        errors = [e for e in (self._done.get() for _ in range(k)) if e is not None]
        if errors:
            raise errors[0]

    def close(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)
        for t in self._threads:
            t.join()
