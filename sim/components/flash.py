"""Flash: service time of a read batch from the device's read curve, and the FIFO device of the DES.

A **read batch** is every read one layer needs at one moment (demand reads before its FFN, or one
prefetch), described by counts per chunk size. All its reads are issued together, so the device
works at depth q = min(in_flight, reads in the batch) and the batch takes

    t = sum_g n_g * c_g / bw(c_g, q)

(`devices.curves.read_time_s` summed over chunk-size groups at the batch's common depth; for one
group it is exactly `read_time_s`), plus the profile's per-batch overhead at depth q
(`flash.batch_overhead_s`: handing the batch to the reader threads, collecting them, and the
drain to the slowest read; measured by bench flash, 0 when absent). Computed vectorised over
steps and layers with a table of 1 / bw(c, q) for every q in 1..in_flight.

`FlashDevice` serves batches first come, first served, one at a time at the throughput of that
batch: an NVMe/UFS queue serves commands in submission order, and a batch already keeps the queue
as deep as it can; two overlapping batches sharing the device would finish the later one at the
same time as back-to-back service (the work is conserved), so FIFO is exact for the last
completion and only reorders the two. A demand batch therefore queues behind prefetches already
issued (head-of-line blocking, as on a real queue). Events: one per batch.

On a host whose CPU both computes and submits the reads (`enable_host_cpu`, see
`sim.components.compute.HostCpu`), a prefetch batch (issued when the decoder goes on computing)
also needs CPU time that the compute holds: its service grows by n_reads x delay_s_per_read,
at most the compute it overlaps (`overlap_s`: with nothing to compute there is nothing to wait for;
recorded per step in `host_cpu_extra_s`), and each batch records the CPU share it
leaves to the compute (`cpu_segments_after`).
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from devices.curves import ReadCurve
from sim.components.compute import HostCpu


@functools.lru_cache(maxsize=256)
def _inverse_throughputs(curve: ReadCurve, sizes: tuple[float, ...], in_flight: int) -> np.ndarray:
    """inv[q, g] = 1 / bw(sizes[g], q) for q = 1..in_flight (row 0 unused), read-only: the runs of a
    sweep or plan on one device and layout share it."""
    inv = np.zeros((in_flight + 1, len(sizes)))
    for q in range(1, in_flight + 1):
        inv[q] = 1.0 / curve.bytes_per_s_many(np.asarray(sizes), q)
    inv.flags.writeable = False
    return inv


class ReadCost:
    """Vectorised batch service times for one curve, chunk-size set and queue depth.

    `batch_overhead_s(depths)` (optional; the profile's `FlashSpec.batch_overhead_at`) gives the
    time a batch at each depth takes beyond its reads at the curve's throughput
    (starting and collecting the reader threads, the drain to the slowest read); it is added once
    per non-empty batch at its depth q = min(reads, in_flight)."""

    def __init__(self, curve: ReadCurve, chunk_sizes: np.ndarray, in_flight: int,
                 batch_overhead_s: Callable[[np.ndarray], np.ndarray] | None = None):
        if in_flight < 1:
            raise ValueError(f"in_flight must be >= 1, got {in_flight}")
        self.curve, self.in_flight = curve, int(in_flight)
        self.sizes = np.asarray(chunk_sizes, np.float64)
        self.inv = _inverse_throughputs(curve, tuple(self.sizes.tolist()), self.in_flight)
        # batch[q] = overhead of a batch at depth q; batch[0] = 0 (no reads, no batch)
        self.batch = np.zeros(self.in_flight + 1)
        if batch_overhead_s is not None:
            self.batch[1:] = batch_overhead_s(np.arange(1, self.in_flight + 1, dtype=np.float64))

    def time_s(self, counts: np.ndarray) -> np.ndarray:
        """counts [..., G] -> seconds [...] for each batch."""
        counts = np.asarray(counts)
        n = counts.sum(axis=-1)
        q = np.clip(n, 0, self.in_flight).astype(np.int64)
        return np.einsum("...g,...g->...", counts * self.sizes, self.inv[np.maximum(q, 1)]) + self.batch[q]

    def bytes(self, counts: np.ndarray) -> np.ndarray:
        return (np.asarray(counts) * self.sizes).sum(axis=-1).astype(np.int64)


def contiguous_counts(nbytes: int, chunk_bytes: int) -> tuple[list[int], list[int]]:
    """A contiguous region of `nbytes` read in chunks of `chunk_bytes`: ([sizes], [counts])."""
    if nbytes <= 0:
        return [], []
    full, rem = divmod(int(nbytes), int(chunk_bytes))
    sizes, counts = [], []
    if full:
        sizes.append(int(chunk_bytes))
        counts.append(full)
    if rem:
        sizes.append(rem)
        counts.append(1)
    return sizes, counts


def region_time_s(curve: ReadCurve, nbytes: int, chunk_bytes: int, in_flight: int) -> tuple[float, int]:
    """(seconds, reads) to read a contiguous region in chunks, all issued together."""
    sizes, counts = contiguous_counts(nbytes, chunk_bytes)
    if not sizes:
        return 0.0, 0
    n = sum(counts)
    q = min(in_flight, n)
    bw = curve.bytes_per_s_many(np.asarray(sizes, float), q)
    return float(sum(c * s / b for c, s, b in zip(counts, sizes, bw))), n


@dataclass(frozen=True, slots=True)
class FlashBatch:
    """One served batch (the device's event log)."""

    tag: str            # "demand" | "prefetch" | "attention" | "head"
    step: int
    layer: int
    nbytes: int
    nreads: int
    t_issue_s: float
    t_start_s: float
    t_end_s: float


class FlashDevice:
    """FIFO read server for the DES. `submit` returns the batch's completion time.

    With `dram_bytes_per_s` set (unified memory), each scheduled transfer also records the share of
    DRAM bandwidth it leaves to compute: 1 - (bytes/s it moves) / dram_bytes_per_s (floored)."""

    def __init__(self, log: bool = False, dram_bytes_per_s: float | None = None, min_share: float = 0.05):
        self.free_at_s = 0.0
        self.busy_s = 0.0
        self.log: list[FlashBatch] | None = [] if log else None
        self._bw = dram_bytes_per_s
        self._min_share = min_share
        self._segments: deque[tuple[float, float, float]] = deque()   # (start, end, share left)
        self.host: HostCpu | None = None
        # (start, end, reads): the share each leaves to a compute depends on the compute (HostCpu)
        self._cpu_segments: deque[tuple[float, float, float]] = deque()
        self.host_cpu_extra_s: dict[int, float] = {}    # step -> service added by the reads' CPU work

    def enable_host_cpu(self, host: HostCpu | None) -> None:
        """Model reads whose CPU work runs on the cores that compute (None: they cost nothing)."""
        self.host = host

    def submit(self, now_s: float, service_s: float, nbytes: float, nreads: float, tag: str = "demand",
               step: int = -1, layer: int = -1, overlap_s: float = float("inf"), op_s: float = 0.0) -> float:
        """Serve a batch; returns its completion time. `overlap_s`: the compute the decoder runs
        before it needs a prefetch (a batch waits for the compute at most that long); `op_s`: a
        Python loop's seconds per torch call over that compute (HostCpu)."""
        start = now_s if now_s > self.free_at_s else self.free_at_s
        host = self.host
        if host is not None and nreads > 0:
            if tag == "prefetch":   # the decoder computes while it runs: its CPU work waits for the compute's
                extra = host.delay_s(nreads, op_s)
                if extra > overlap_s:
                    extra = overlap_s
                service_s += extra
                self.host_cpu_extra_s[step] = self.host_cpu_extra_s.get(step, 0.0) + extra
            if service_s > 0:
                self._cpu_segments.append((start, start + service_s, nreads))
        end = start + service_s
        self.free_at_s = end
        self.busy_s += service_s
        if self._bw and service_s > 0:
            share = 1.0 - nbytes / service_s / self._bw
            self._segments.append((start, end, share if share > self._min_share else self._min_share))
        if self.log is not None:
            self.log.append(FlashBatch(tag, step, layer, int(nbytes), int(nreads), now_s, start, end))
        return end

    def cpu_segments_after(self, t_s: float, op_s: float = 0.0) -> list[tuple[float, float, float]]:
        """Scheduled batches (start, end, CPU share left to a compute whose seconds per torch call,
        for a Python loop, are `op_s`) ending after t_s."""
        seg = self._cpu_segments
        while seg and seg[0][1] <= t_s:
            seg.popleft()
        if not seg:
            return []
        share = self.host.cpu_share  # type: ignore[union-attr]
        return [(a, b, share(n, b - a, op_s)) for a, b, n in seg]

    def segments_after(self, t_s: float) -> deque[tuple[float, float, float]]:
        """Scheduled transfers (start, end, DRAM share left) ending after t_s (older ones dropped)."""
        seg = self._segments
        while seg and seg[0][1] <= t_s:
            seg.popleft()
        return seg
