"""FlashSpec: the `flash:` section of a device profile, the storage the weights are read from.

It owns the read curve (`FlashSpec.curve`: the measured `ReadTable`, or the closed form, capped by
the CPU the requests cost; devices/curves.py), the achievable read table, and the host-CPU terms of
I/O that `flashsim bench flash` measures (each probe's interference with the compute, read-batch
overheads, the reader's planning time; sim/components/ reads them).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

import numpy as np
from pydantic import Field, model_validator

from devices.curves import ClosedFormReadCurve, CpuBoundReadCurve, ReadCurve, TableReadCurve
from devices.section_base import RETIRED_FLASH_KEYS, Provenance, Strict, drop_retired, needs_source


class ReadTable(Strict):
    """Measured throughput grid: bytes_per_s[i][j] at chunk_bytes[i] with in_flight[j] reads outstanding."""

    chunk_bytes: list[int]
    in_flight: list[int]
    bytes_per_s: list[list[float]]

    @model_validator(mode="after")
    def _check(self) -> ReadTable:
        TableReadCurve(tuple(self.chunk_bytes), tuple(self.in_flight),
                       tuple(tuple(r) for r in self.bytes_per_s))
        return self


# An achievable read table reaches at least this share of its SSD's rated sequential read and IOPS
# (FlashSpec._achievable_agrees); a table may exceed a peak by rounding only.
REACH = 0.6
ROUNDING = 1.01


def _within_ceiling(t: ReadTable, name: str, ceiling: float, ceiling_name: str, iops_max: float | None) -> None:
    """Every cell of table `name` at or below `ceiling` bytes/s and `iops_max` x its request size."""
    for c, row in zip(t.chunk_bytes, t.bytes_per_s):
        for q, v in zip(t.in_flight, row):
            if v > ROUNDING * ceiling:
                raise ValueError(f"{name} holds {v / 1e9:.2f} GB/s at {c} B x {q} in flight, above {ceiling_name} "
                                 f"{ceiling / 1e9:.2f} GB/s (a peak bounds what is achieved): lower the table or "
                                 f"correct {ceiling_name}")
            if iops_max is not None and v > ROUNDING * iops_max * c:
                raise ValueError(f"{name} holds {v / c:,.0f} reads/s at {c} B x {q} in flight, above iops_max "
                                 f"{iops_max:,.0f} (a peak bounds what is achieved): lower the table or correct "
                                 "iops_max")


class FlashSpec(Strict):
    """The storage the weights are read from."""

    sequential_read_bytes_per_s: float = Field(gt=0)
    read_latency_s: float = Field(gt=0, description="one small (4 KiB) read at queue depth 1")
    max_in_flight: int = Field(ge=1, description="hardware queue depth usable by one process")
    iops_max: float | None = Field(default=None, gt=0, description="closed-form model's controller IOPS cap")
    read_table: ReadTable | None = None
    # Achievable (devices/achievable.py): random reads against request size and queue depth from a
    # published measurement of this SSD or its class (fio / CrystalDiskMark-style, Linux or Android),
    # the link's limit, and the host CPU each request costs through the I/O path.
    read_table_achievable: ReadTable | None = Field(default=None, description="published random-read "
                                                    "throughput over request size x queue depth (achievable)")
    read_table_achievable_source: Provenance | None = None
    link_bytes_per_s: float | None = Field(default=None, gt=0, description="what the storage link allows "
                                           "(PCIe lanes x rate, UFS gear), after encoding")
    request_cpu_s: float | None = Field(default=None, ge=0, description="CPU seconds one read request costs "
                                        "through the I/O path: submit, completion, thread hand-off")
    request_cpu_source: Provenance | None = None
    io_cores: int | None = Field(default=None, ge=1, description="CPU cores the I/O path can use at once (its "
                                 "reader threads'); with request_cpu_s it caps IOPS at io_cores / request_cpu_s")
    # Host CPU work of I/O (see sim/components/compute.py `HostCpu`). Non-zero only on a host whose
    # CPU both runs the compute and submits/completes the reads (a CPU-only host reading with
    # threads): there each read takes CPU time from the compute running at the same time, and the
    # compute delays the reads' own CPU work. 0 (the default) = reads cost the compute nothing
    # (an SSD's DMA engine does the transfer; submission on other cores or a GPU computes).
    host_cpu_s_per_read: float = Field(default=0.0, ge=0, description="host CPU seconds per read (submit + "
                                       "complete), on the cores that also compute; 0: not shared")
    compute_lost_s_per_read: float | None = Field(default=None, ge=0, description="compute time lost per read "
                                                  "that runs while the compute runs (default: host_cpu_s_per_read)")
    read_delay_s_per_read: float | None = Field(default=None, ge=0, description="time a read takes longer while "
                                                "the compute runs (default: host_cpu_s_per_read)")
    compute_lost_s_per_batch: float = Field(default=0.0, ge=0, description="compute time lost per read batch "
                                            "(waking and collecting the reader threads), on top of the per-read loss")
    read_delay_s_per_batch: float = Field(default=0.0, ge=0, description="time a batch takes longer while the "
                                          "compute runs, on top of the per-read delay")
    # The same four effects while the compute is framework code (Python holding the interpreter lock:
    # Hugging Face modules) rather than kernels; default: the kernel values above. bench flash measures
    # them with a tiny transformers llama as the compute probe.
    framework_compute_lost_s_per_read: float | None = Field(default=None, ge=0, description="compute_lost_s_per_read "
                                                            "while the compute is framework code")
    framework_compute_lost_s_per_batch: float | None = Field(default=None, ge=0, description="compute_lost_s_per_batch "
                                                             "while the compute is framework code")
    framework_read_delay_s_per_read: float | None = Field(default=None, ge=0, description="read_delay_s_per_read "
                                                          "while the compute is framework code")
    framework_read_delay_s_per_batch: float | None = Field(default=None, ge=0, description="read_delay_s_per_batch "
                                                           "while the compute is framework code")
    # The op rhythm of each probe, and a third probe of long kernels (sim/components/compute.py
    # `HostCpu.at`, compute.decoder=python). A Python decoder loop takes the interpreter lock back
    # after every torch call; each time, a reader thread that woke meanwhile may hold it, so what a
    # read batch costs the loop follows how often the loop re-takes the lock: its mean seconds per
    # torch call. bench flash counts each probe's torch calls and times them (the tiny llama: a few
    # us per call; the kernel GEMV: tens of us; the long GEMV: about a millisecond), and the
    # simulator places a decoder loop between the three probes by its own seconds per call.
    framework_probe_op_s: float | None = Field(default=None, gt=0, description="the framework probe's mean "
                                               "seconds per torch call")
    kernel_probe_op_s: float | None = Field(default=None, gt=0, description="the kernel probe's mean seconds "
                                            "per torch call")
    long_kernel_probe_op_s: float | None = Field(default=None, gt=0, description="the long-kernel probe's "
                                                 "mean seconds per torch call")
    long_kernel_compute_lost_s_per_read: float | None = Field(default=None, ge=0, description="compute_lost_s_per_"
                                                              "read while the compute is long kernels")
    long_kernel_compute_lost_s_per_batch: float | None = Field(default=None, ge=0, description="compute_lost_s_"
                                                               "per_batch while the compute is long kernels")
    long_kernel_read_delay_s_per_read: float | None = Field(default=None, ge=0, description="read_delay_s_per_"
                                                            "read while the compute is long kernels")
    long_kernel_read_delay_s_per_batch: float | None = Field(default=None, ge=0, description="read_delay_s_per_"
                                                             "batch while the compute is long kernels")
    staged_s_per_read: float = Field(default=0.0, ge=0, description="extra time per read whose units cannot land "
                                     "in place (not aligned for direct I/O) and are copied out of the reader's "
                                     "staging buffer; 0 = none")
    # A read whose destination is n discontiguous buffers (real.reader's in-place reads of a run of
    # unbundled rows: one iovec per cache row) costs the device more than one contiguous buffer:
    # on a virtio disk each descriptor is served on its own (bench flash: 64 KiB into 16 x 4 KiB).
    segment_s: float = Field(default=0.0, ge=0, description="device time each extra destination segment "
                             "adds to a read (a read into n discontiguous buffers pays n - 1); 0 = none")
    # A read batch is issued to a pool of reader threads and done when its last read completes: on top
    # of its reads at the table's steady throughput it costs starting the threads that take part,
    # collecting them, and the wait for the slowest read (the depth drains at the end). bench flash
    # measures it at each depth as real.reader's batch time less the table's time for the same reads.
    batch_overhead_s: list[float] | None = Field(default=None, description="per read_table.in_flight entry: "
                                                 "the time one read batch at that depth (min(reads, in flight)) "
                                                 "takes beyond its reads at the table's throughput; None = 0")
    source: str

    @model_validator(mode="before")
    @classmethod
    def _retired(cls, data: Any) -> Any:
        """Keys of terms the simulator no longer models (RETIRED_FLASH_KEYS) are dropped, so profiles
        and kept grids written with them still load. A batch overhead measured per reads per thread
        (`batch_overhead_by_ratio_s`) becomes the per-depth median that bench flash writes now."""
        by_ratio = data.get("batch_overhead_by_ratio_s") if isinstance(data, dict) else None
        data = drop_retired(data, RETIRED_FLASH_KEYS)
        if by_ratio is not None and data.get("batch_overhead_s") is None:
            data = {**data, "batch_overhead_s": [float(np.median(row)) for row in by_ratio]}
        return data

    @model_validator(mode="after")
    def _achievable(self) -> FlashSpec:
        needs_source(self.read_table_achievable, self.read_table_achievable_source, "read_table_achievable")
        needs_source(self.request_cpu_s, self.request_cpu_source, "request_cpu")
        if self.read_table is not None and self.link_bytes_per_s is not None:
            _within_ceiling(self.read_table, "read_table", self.link_bytes_per_s, "link_bytes_per_s", None)
        if self.read_table_achievable is not None:
            self._achievable_agrees(self.read_table_achievable)
        return self

    def _achievable_agrees(self, t: ReadTable) -> None:
        """The achievable table is a measurement of the SSD the closed-form numbers rate: never above
        them (peak >= achievable: sequential read, link, IOPS x request size), and reaching most of
        them (published random-read tables of NVMe and UFS drives reach 0.93-1.0 of the rated
        sequential read at large requests and deep queues, and 0.67-1.0 of the rated IOPS at 4 KiB:
        the bundled profiles' sources). A table far below its own peaks was written for other
        numbers (a copied profile whose flash numbers were edited): the simulator would read at the
        table's speed and ignore the edit, so the profile is refused, naming both fields."""
        ceiling, ceiling_name = self.sequential_read_bytes_per_s, "sequential_read_bytes_per_s"
        if self.link_bytes_per_s is not None and self.link_bytes_per_s < ceiling:
            ceiling, ceiling_name = self.link_bytes_per_s, "link_bytes_per_s"
        _within_ceiling(t, "read_table_achievable", ceiling, ceiling_name, self.iops_max)
        remedy = ("scale read_table_achievable (and its source) with the number you changed, or remove both "
                  "to use the closed form")
        best = max(max(row) for row in t.bytes_per_s)
        if best < REACH * ceiling:
            raise ValueError(f"read_table_achievable reaches at most {best / 1e9:.2f} GB/s, {best / ceiling:.0%} of "
                             f"{ceiling_name} {ceiling / 1e9:.2f} GB/s, below the {REACH:.0%} a measurement of the "
                             f"same SSD reaches: {remedy}")
        if self.iops_max is not None:
            c0 = t.chunk_bytes[0]
            rated = min(self.iops_max, ceiling / c0)
            iops = max(t.bytes_per_s[0]) / c0
            if iops < REACH * rated:
                raise ValueError(f"read_table_achievable serves at most {iops:,.0f} reads/s of {c0} B, "
                                 f"{iops / rated:.0%} of iops_max {self.iops_max:,.0f} (capped by {ceiling_name}), "
                                 f"below the {REACH:.0%} a measurement of the same SSD reaches: {remedy}")

    @property
    def measured_io_cpu(self) -> bool:
        """The host CPU of the I/O path is already inside measured tables (bench flash's batch
        overheads or host-CPU terms): request_cpu_s must not be charged again."""
        return self.batch_overhead_s is not None or self.host_cpu_s_per_read > 0

    @model_validator(mode="after")
    def _one_model(self) -> FlashSpec:
        if self.read_table is None and self.iops_max is None:
            raise ValueError("give either read_table (measured) or iops_max (closed-form model)")
        if self.batch_overhead_s is not None:
            depths = self.read_table.in_flight if self.read_table is not None else None
            if depths is None or len(self.batch_overhead_s) != len(depths):
                raise ValueError("batch_overhead_s needs a read_table and one value per read_table.in_flight entry")
            if any(not (x >= 0) for x in self.batch_overhead_s):
                raise ValueError("batch_overhead_s values must be >= 0 seconds")
        for name in ("compute_lost_s_per_read", "read_delay_s_per_read", "compute_lost_s_per_batch",
                     "read_delay_s_per_batch", "framework_compute_lost_s_per_read",
                     "framework_compute_lost_s_per_batch", "framework_read_delay_s_per_read",
                     "framework_read_delay_s_per_batch"):
            if getattr(self, name) and self.host_cpu_s_per_read == 0:
                raise ValueError(f"{name} needs host_cpu_s_per_read > 0 (a host whose CPU both computes and "
                                 "submits the reads)")
        return self

    @model_validator(mode="after")
    def _probe_rhythm(self) -> FlashSpec:
        ops = [self.framework_probe_op_s, self.kernel_probe_op_s, self.long_kernel_probe_op_s]
        long_terms = [self.long_kernel_compute_lost_s_per_read, self.long_kernel_compute_lost_s_per_batch,
                      self.long_kernel_read_delay_s_per_read, self.long_kernel_read_delay_s_per_batch]
        given = [x is not None for x in ops + long_terms]
        if not any(given):
            return self
        if not all(given) or self.framework_compute_lost_s_per_read is None:
            raise ValueError("framework_probe_op_s, kernel_probe_op_s, long_kernel_probe_op_s and the four "
                             "long_kernel_* terms go together, with the framework_* terms (bench flash writes them all)")
        if not ops[0] < ops[1] < ops[2]:  # type: ignore[operator]
            raise ValueError("the probes' seconds per torch call must increase: framework_probe_op_s < "
                             f"kernel_probe_op_s < long_kernel_probe_op_s, got {ops}")
        if self.host_cpu_s_per_read == 0:
            raise ValueError("the probe terms need host_cpu_s_per_read > 0 (a host whose CPU both computes and "
                             "submits the reads)")
        return self

    def host_cpu_terms(self, probe: str = "kernel") -> tuple[float, float, float, float]:
        """(compute lost per read, per batch, read delay per read, per batch) measured with a probe:
        "kernel" (per read default host_cpu_s_per_read), "framework" (each default the kernel's) or
        "long" (long_kernel_*: only with the probes, see `probe_points`)."""
        k = (self.compute_lost_s_per_read if self.compute_lost_s_per_read is not None else self.host_cpu_s_per_read,
             self.compute_lost_s_per_batch,
             self.read_delay_s_per_read if self.read_delay_s_per_read is not None else self.host_cpu_s_per_read,
             self.read_delay_s_per_batch)
        if probe == "kernel":
            return k
        prefix = {"framework": "framework_", "long": "long_kernel_"}[probe]
        own = [getattr(self, prefix + name) for name in ("compute_lost_s_per_read", "compute_lost_s_per_batch",
                                                         "read_delay_s_per_read", "read_delay_s_per_batch")]
        return tuple(b if b is not None else a for a, b in zip(k, own))  # type: ignore[return-value]

    def probe_points(self) -> list[tuple[float, float, float, float, float]] | None:
        """The three probes as (seconds per torch call, compute lost per read, per batch, read delay
        per read, per batch), by increasing seconds per call; None when the profile lacks them."""
        if self.long_kernel_probe_op_s is None:
            return None
        return [(op_s, *self.host_cpu_terms(probe)) for op_s, probe in  # type: ignore[misc]
                ((self.framework_probe_op_s, "framework"), (self.kernel_probe_op_s, "kernel"),
                 (self.long_kernel_probe_op_s, "long"))]

    @property
    def shares_host_cpu(self) -> bool:
        """The reads' CPU work runs on the cores that compute (host_cpu_s_per_read > 0)."""
        return self.host_cpu_s_per_read > 0

    @cached_property
    def curve(self) -> ReadCurve:
        """The read model: the table when measured, the closed form otherwise; with request_cpu_s
        (and no measured I/O CPU terms) capped by the CPU the requests cost (CpuBoundReadCurve)."""
        base: ReadCurve
        if self.read_table is not None:
            t = self.read_table
            base = TableReadCurve(tuple(t.chunk_bytes), tuple(t.in_flight),
                                  tuple(tuple(r) for r in t.bytes_per_s))
        else:
            assert self.iops_max is not None
            base = ClosedFormReadCurve(self.sequential_read_bytes_per_s, self.read_latency_s, self.iops_max)
        if self.request_cpu_s and not self.measured_io_cpu:
            return CpuBoundReadCurve(base, self.request_cpu_s, self.io_cores or 1)
        return base

    def bytes_per_s(self, chunk_bytes: float, in_flight: int | None = None) -> float:
        return self.curve.bytes_per_s(chunk_bytes, in_flight or self.max_in_flight)

    def batch_overhead_at(self, depth: np.ndarray) -> np.ndarray:
        """Seconds per read batch at each depth q (reads in flight; linear between the table's depths,
        the end values beyond them); zeros without `batch_overhead_s`."""
        q = np.asarray(depth, np.float64)
        if self.read_table is None:
            return np.zeros_like(q)
        depths = np.asarray(self.read_table.in_flight, np.float64)
        if self.batch_overhead_s is None:
            return np.zeros_like(q)
        return np.interp(q, depths, np.asarray(self.batch_overhead_s))
