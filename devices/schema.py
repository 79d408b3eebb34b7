"""DeviceProfile: the validated schema of a device data file, and where bundled profiles live.

One YAML file per device in `devices/profiles/`: the only place device numbers live. Every section
carries a `source` string saying where its numbers come from (datasheet, paper, measured, estimate;
"peak" where a datasheet gives a peak). Units are in the key names: `_bytes`, `_bytes_per_s`,
`_flops_per_s`, `_s`. Unknown keys are errors. Extra profile folders can be listed in the
environment variable FLASHSIM_PROFILE_PATH (os.pathsep-separated); they shadow bundled ones.
"""

from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from devices.curves import ClosedFormReadCurve, CpuBoundReadCurve, ReadCurve, TableReadCurve
from devices.energy import EnergySpec
from devices.errors import FlashsimError, unknown_name
from devices.kernel_table import KernelTable
from devices.limits import check_field
from devices.loading import validate_file
from devices.power_modes import with_power_mode

SCHEMA_VERSION = 1
BUNDLED_DIR = Path(__file__).parent / "profiles"
DTYPES = ("fp32", "fp16", "bf16", "int8", "int4")


# Keys of terms the simulator no longer has: the compute penalty after a demand read's wait, the
# cache index work and the host-CPU interference curves over a batch's reads (flash), the penalty
# after a layer's streaming (compute). None lowered the error on a grid of another boot
# (docs/calibrate-and-validate.md, "The machine model's terms"). Older profiles and kept grids carry them;
# loading drops them (with whatever they nest).
RETIRED_FLASH_KEYS = ("cold_wait_s", "cold_batch_reads", "cold_compute_s", "framework_cold_compute_s",
                      "cache_index_s_per_layer", "cache_index_s_per_evicted", "host_cpu_batch_reads",
                      "host_cpu_curves", "batch_overhead_reads_per_thread", "batch_overhead_by_ratio_s",
                      "plan_s_per_batch", "plan_s_per_neuron")
RETIRED_COMPUTE_KEYS = ("evict_bytes", "evict_layer_s", "framework_evict_layer_s", "row_move_bytes_per_s",
                        "row_move_row_s", "framework_layer_s", "framework_token_s")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*")
    @classmethod
    def _physical_range(cls, v: object, info: ValidationInfo) -> object:
        """Every number within its physical range (devices/limits.py FIELD_LIMITS)."""
        return check_field(cls.__name__, str(info.field_name), v)


class Source(_Strict):
    """Provenance of a profile as a whole."""

    kind: Literal["datasheet", "paper", "measured", "estimate", "mixed"]
    references: list[str] = Field(default_factory=list)
    date: str | None = None
    host: str | None = None
    tool: str | None = None
    notes: str | None = None


# Where one achievable number comes from (devices/achievable.py folds them in; `devices show` prints
# them beside the peaks): measured on the host by `flashsim bench`, a published measurement (cited
# with its conditions), a datasheet figure, or a stated estimate with its reasoning.
SourceKind = Literal["measured", "published", "datasheet", "estimate"]


class Provenance(_Strict):
    """The source of one achievable number: its kind and the citation with its conditions."""

    kind: SourceKind
    source: str


def _needs_source(value: object, source: Provenance | None, name: str) -> None:
    if value is not None and source is None:
        raise ValueError(f"{name} needs {name.split('.')[-1]}_source (kind and citation)")


class MemorySpec(_Strict):
    """DRAM seen by the inference process. `bandwidth_bytes_per_s` is the peak (datasheet or, on a
    measured host, its copy bandwidth); `sustained_bandwidth_bytes_per_s` is what batch-1 decode
    streams weights at (achievable; the simulator's default, devices/achievable.py)."""

    capacity_bytes: int = Field(gt=0)
    reserved_bytes: int = Field(ge=0, description="taken by the OS, runtime and display")
    bandwidth_bytes_per_s: float = Field(gt=0)
    unified: bool = Field(description="CPU, accelerator and flash DMA share one DRAM")
    sustained_bandwidth_bytes_per_s: float | None = Field(default=None, gt=0, description="DRAM bandwidth a "
                                                          "batch-1 decode's weight streaming reaches (achievable)")
    sustained_bandwidth_source: Provenance | None = None
    source: str

    @model_validator(mode="after")
    def _reserved_below_capacity(self) -> MemorySpec:
        if self.reserved_bytes >= self.capacity_bytes:
            raise ValueError(
                f"reserved_bytes ({self.reserved_bytes}) must be < capacity_bytes ({self.capacity_bytes})"
            )
        _needs_source(self.sustained_bandwidth_bytes_per_s, self.sustained_bandwidth_source,
                      "sustained_bandwidth")
        if self.sustained_bandwidth_bytes_per_s is not None and \
                self.sustained_bandwidth_bytes_per_s > self.bandwidth_bytes_per_s:
            raise ValueError(f"sustained_bandwidth_bytes_per_s ({self.sustained_bandwidth_bytes_per_s:g}) exceeds "
                             f"the peak bandwidth_bytes_per_s ({self.bandwidth_bytes_per_s:g})")
        return self


SPARSE_FFN_KERNELS = ("gather_s", "input_gemv_s", "transpose_s", "down_gemv_s")


class SparseFfnTable(_Strict):
    """One dtype's sparse-FFN kernels on gathered cache rows: seconds per call [i][j] at d_model[i]
    and neurons[j] computed (devices/kernel_table.py interpolates; real/bench/bench_sparse_ffn.py measures).
    gather_s: k cache rows (gate | up | down, 4 KiB-aligned) into the scratch; input_gemv_s: ONE
    GEMV (gate or up) on a strided view of the gathered rows; transpose_s: the down segment's
    transposed copy [k, d] -> [d, k]; down_gemv_s: the down GEMV on that copy."""

    d_model: list[int]
    neurons: list[int]
    gather_s: list[list[float]]
    input_gemv_s: list[list[float]]
    transpose_s: list[list[float]]
    down_gemv_s: list[list[float]]

    @model_validator(mode="after")
    def _check(self) -> SparseFfnTable:
        for k in SPARSE_FFN_KERNELS:
            try:
                self.kernel(k)
            except ValueError as e:
                raise ValueError(f"{k}: {e}") from None
        return self

    def kernel(self, name: str) -> KernelTable:
        """The table of one of SPARSE_FFN_KERNELS."""
        return KernelTable(tuple(self.d_model), tuple(self.neurons), tuple(tuple(r) for r in getattr(self, name)))


class SparseFfnSpec(_Strict):
    """The sparse FFN's kernels measured per dtype over model widths and computed neurons; where a
    run's dtype has a table it replaces the single rates (gather_bytes_per_s, the GEMV rate,
    transpose_bytes_per_s) in the FFN phase."""

    tables: dict[Literal["fp32", "fp16", "bf16", "int8", "int4"], SparseFfnTable]
    source: str


class DenseGemvTable(_Strict):
    """One dtype's dense GEMV y = W x (one token, W [out_features, in_features] streamed from DRAM):
    seconds per call [i][j] at in_features[i] and out_features[j] (devices/kernel_table.py
    interpolates; real/bench/bench_dense_gemv.py measures)."""

    in_features: list[int]
    out_features: list[int]
    gemv_s: list[list[float]]

    @model_validator(mode="after")
    def _check(self) -> DenseGemvTable:
        try:
            self.table()
        except ValueError as e:
            raise ValueError(f"gemv_s: {e}") from None
        return self

    def table(self) -> KernelTable:
        """The KernelTable over (width = in_features, rows = out_features)."""
        return KernelTable(tuple(self.in_features), tuple(self.out_features), tuple(tuple(r) for r in self.gemv_s),
                           axes=("in_features", "out_features"))


class DenseGemvSpec(_Strict):
    """Dense GEMVs measured per dtype over both matrix sizes; where a run's dtype has a table it
    replaces the single rates (the GEMV rate, gemv_row_s) for the attention projections, the
    lm_head and a dense FFN's matrices."""

    tables: dict[Literal["fp32", "fp16", "bf16", "int8", "int4"], DenseGemvTable]
    source: str


class ComputeSpec(_Strict):
    """Effective throughput of the unit that runs the FFN (matrix-vector products, decode)."""

    gemv_flops_per_s: dict[Literal["fp32", "fp16", "bf16", "int8", "int4"], float]
    gather_bytes_per_s: float = Field(gt=0, description="copying scattered rows into a dense buffer")
    op_overhead_s: float = Field(ge=0, description="fixed cost per operation (launch / dispatch)")
    gemv_row_s: float = Field(default=0.0, ge=0, description="time per output row of a GEMV beyond streaming its "
                              "bytes (the inner loop's setup, the prefetcher restarting per row); 0 = none")
    transpose_bytes_per_s: float | None = Field(default=None, gt=0, description="the sparse FFN's transposed copy "
                                                "of the gathered down rows; None = no such copy")
    sparse_ffn: SparseFfnSpec | None = Field(default=None, description="the sparse FFN's kernels per dtype over "
                                             "(d_model, neurons) (`flashsim bench compute`); None = the single rates")
    dense_gemv: DenseGemvSpec | None = Field(default=None, description="dense GEMV seconds per dtype over (in_features, "
                                             "out_features) (`flashsim bench compute`); None = the single rates")
    cpu_cores: int | None = Field(default=None, ge=1, description="cores the compute runs on when the CPU "
                                  "computes (reads then take CPU time from the decoder); None: an accelerator computes")
    threads: int | None = Field(default=None, ge=1, description="compute threads the rates were measured with "
                                "(`flashsim bench compute --threads`); real runs use it and warn on a mismatch")
    # Achievable (devices/achievable.py): a batch-1 dense GEMV streams its weights at
    # gemv_efficiency[dtype] x the sustained DRAM bandwidth (dequantization, the tail of each row,
    # launch gaps); a sparse FFN's gather + GEMV over the selected rows reaches sparse_gemv_efficiency
    # x the dense GEMV's rate per byte of rows computed.
    gemv_efficiency: dict[Literal["fp32", "fp16", "bf16", "int8", "int4"], float] | None = Field(
        default=None, description="share of the sustained DRAM bandwidth a batch-1 dense GEMV streams "
        "weights at, per dtype (achievable)")
    gemv_efficiency_source: Provenance | None = None
    sparse_gemv_efficiency: float | None = Field(default=None, gt=0, lt=1, description="share of the dense "
                                                 "GEMV rate a gather + GEMV over selected rows reaches (achievable)")
    sparse_gemv_efficiency_source: Provenance | None = None
    source: str

    @model_validator(mode="before")
    @classmethod
    def _retired(cls, data: Any) -> Any:
        """Keys of terms the simulator no longer models (RETIRED_COMPUTE_KEYS) are dropped, so profiles
        and kept grids written with them still load."""
        if isinstance(data, dict) and any(k in data for k in RETIRED_COMPUTE_KEYS):
            data = {k: v for k, v in data.items() if k not in RETIRED_COMPUTE_KEYS}
        return data

    @model_validator(mode="after")
    def _achievable(self) -> ComputeSpec:
        _needs_source(self.gemv_efficiency, self.gemv_efficiency_source, "gemv_efficiency")
        _needs_source(self.sparse_gemv_efficiency, self.sparse_gemv_efficiency_source, "sparse_gemv_efficiency")
        for k, e in (self.gemv_efficiency or {}).items():
            if not 0 < e <= 1:
                raise ValueError(f"gemv_efficiency.{k} must be in (0, 1], got {e}")
        return self

    def gemv_efficiency_for(self, dtype: str) -> float:
        """The dense GEMV efficiency of `dtype` (the nearest wider dtype listed; 1.0 without any)."""
        eff = self.gemv_efficiency or {}
        for d in (dtype, *_WIDER.get(dtype, ())):
            if d in eff:
                return eff[d]
        return 1.0


    @field_validator("gemv_flops_per_s")
    @classmethod
    def _positive(cls, v: dict[str, float]) -> dict[str, float]:
        if not v:
            raise ValueError("give at least one dtype's throughput")
        for k, x in v.items():
            if not x > 0:
                raise ValueError(f"{k} must be > 0, got {x}")
        return v

    def flops_per_s(self, dtype: str) -> float:
        """Throughput for `dtype`; falls back to the nearest wider dtype the profile lists."""
        for d in (dtype, *_WIDER.get(dtype, ())):
            if d in self.gemv_flops_per_s:
                return self.gemv_flops_per_s[d]
        return min(self.gemv_flops_per_s.values())


_WIDER = {"int4": ("int8", "fp16", "bf16", "fp32"), "int8": ("fp16", "bf16", "fp32"),
          "fp16": ("bf16", "fp32"), "bf16": ("fp16", "fp32"), "fp32": ("fp16", "bf16")}


class ReadTable(_Strict):
    """Measured throughput grid: bytes_per_s[i][j] at chunk_bytes[i] with in_flight[j] reads outstanding."""

    chunk_bytes: list[int]
    in_flight: list[int]
    bytes_per_s: list[list[float]]

    @model_validator(mode="after")
    def _check(self) -> ReadTable:
        TableReadCurve(tuple(self.chunk_bytes), tuple(self.in_flight),
                       tuple(tuple(r) for r in self.bytes_per_s))
        return self


class FlashSpec(_Strict):
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
    # A read whose destination is n discontiguous buffers (real.io.reader's in-place reads of a run of
    # unbundled rows: one iovec per cache row) costs the device more than one contiguous buffer:
    # on a virtio disk each descriptor is served on its own (bench flash: 64 KiB into 16 x 4 KiB).
    segment_s: float = Field(default=0.0, ge=0, description="device time each extra destination segment "
                             "adds to a read (a read into n discontiguous buffers pays n - 1); 0 = none")
    # A read batch is issued to a pool of reader threads and done when its last read completes: on top
    # of its reads at the table's steady throughput it costs starting the threads that take part,
    # collecting them, and the wait for the slowest read (the depth drains at the end). bench flash
    # measures it at each depth as real.io.reader's batch time less the table's time for the same reads.
    batch_overhead_s: list[float] | None = Field(default=None, description="per read_table.in_flight entry: "
                                                 "the time one read batch at that depth (min(reads, in flight)) "
                                                 "takes beyond its reads at the table's throughput; None = 0")
    source: str

    @model_validator(mode="before")
    @classmethod
    def _retired(cls, data: Any) -> Any:
        """Keys of terms the simulator no longer models (RETIRED_FLASH_KEYS) are dropped, so profiles
        and kept grids written with them still load."""
        if isinstance(data, dict) and any(k in data for k in RETIRED_FLASH_KEYS):
            data = {k: v for k, v in data.items() if k not in RETIRED_FLASH_KEYS}
        return data

    @model_validator(mode="after")
    def _achievable(self) -> FlashSpec:
        _needs_source(self.read_table_achievable, self.read_table_achievable_source, "read_table_achievable")
        _needs_source(self.request_cpu_s, self.request_cpu_source, "request_cpu")
        return self

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


class PowerMode(_Strict):
    """One power mode (nvpmodel mode, performance profile): the fields it changes, by dotted path
    (`memory.bandwidth_bytes_per_s`, `compute.gemv_flops_per_s.fp16`, `flash.request_cpu_s`), each
    an absolute value; the profile's own numbers are its default mode's."""

    description: str
    source: str
    set: dict[str, float] = Field(default_factory=dict)


class PowerModes(_Strict):
    """The device's power modes; `default` is the mode it ships in (named in every output)."""

    default: str
    modes: dict[str, PowerMode]

    @model_validator(mode="after")
    def _default_listed(self) -> PowerModes:
        if self.default not in self.modes:
            raise ValueError(f"default {self.default!r} is not one of the modes ({', '.join(self.modes)})")
        for name in self.modes:
            if not name or "@" in name or not name.replace("-", "").replace("_", "").isalnum():
                raise ValueError(f"mode name {name!r}: use letters, digits, '-' and '_'")
        return self


class DeviceProfile(_Strict):
    """A device: memory, compute and flash, each with its source. Achievable numbers sit beside the
    peaks; devices/achievable.py folds one set into the fields the simulator reads (`bound`) and
    applies a power mode (`power_mode`)."""

    schema_version: Literal[1] = 1
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    description: str
    source: Source
    memory: MemorySpec
    compute: ComputeSpec
    flash: FlashSpec
    energy: EnergySpec | None = None
    power_modes: PowerModes | None = None
    # set by devices/achievable.py, never read from a file
    _power_mode: str | None = PrivateAttr(default=None)
    _bound: str = PrivateAttr(default="raw")

    @property
    def power_mode(self) -> str | None:
        """The power mode applied (None: the profile has no modes)."""
        if self._power_mode is not None:
            return self._power_mode
        return self.power_modes.default if self.power_modes is not None else None

    @property
    def bound(self) -> str:
        """"raw" (as in the file: peaks and achievable numbers side by side), "achievable" or "peak"."""
        return self._bound

    @property
    def available_bytes(self) -> int:
        """DRAM left for the model after the OS's reserve."""
        return self.memory.capacity_bytes - self.memory.reserved_bytes

    def summary(self) -> dict:
        """The flat view printed by `flashsim devices` (units in the key names)."""
        return {
            "name": self.name,
            "description": self.description,
            "dram_bytes": self.memory.capacity_bytes,
            "dram_available_bytes": self.available_bytes,
            "dram_bandwidth_bytes_per_s": self.memory.bandwidth_bytes_per_s,
            "unified_memory": self.memory.unified,
            "flash_sequential_bytes_per_s": self.flash.sequential_read_bytes_per_s,
            "flash_4k_random_bytes_per_s": self.flash.bytes_per_s(4096),
            "flash_read_model": "table" if self.flash.read_table is not None else "closed_form",
            "source_kind": self.source.kind,
        }


def _search_dirs() -> list[Path]:
    extra = [Path(p) for p in os.environ.get("FLASHSIM_PROFILE_PATH", "").split(os.pathsep) if p]
    return [*extra, BUNDLED_DIR]


def list_profiles() -> list[str]:
    """Names of every profile on the search path (bundled and FLASHSIM_PROFILE_PATH), sorted."""
    names = {p.stem for d in _search_dirs() if d.is_dir() for p in d.glob("*.yaml")}
    return sorted(names)


def profile_path(name: str) -> Path:
    """The file a profile name resolves to (first match on the search path)."""
    for d in _search_dirs():
        p = d / f"{name}.yaml"
        if p.is_file():
            return p
    raise unknown_name("device", name, list_profiles())


def profile_file(name_or_path: str | Path) -> Path:
    """The file of a profile given by name (the search path) or by path (absolute or relative)."""
    p = Path(name_or_path).expanduser()
    return p if p.suffix in (".yaml", ".yml", ".json") or p.is_file() else profile_path(str(name_or_path))


def load_profile(name_or_path: str | Path) -> DeviceProfile:
    """Load a bundled profile by name, or any profile file by path; raise FlashsimError. A name or
    path may end in `@MODE` to pick one of the profile's power modes (default: the mode it ships in).
    The profile comes back raw (peaks and achievable numbers side by side); the simulator folds in
    the achievable numbers (devices/achievable.py `at_bound`) unless told `--bound peak`."""
    text = str(name_or_path)
    mode = None
    if "@" in text and not Path(text).is_file():
        text, mode = text.rsplit("@", 1)
    p = Path(text).expanduser()
    by_path = p.suffix in (".yaml", ".yml", ".json") or p.is_file()
    path = profile_file(text)
    profile = validate_file(DeviceProfile, path)
    if not by_path:
        check_profile_name(profile, path)
    return with_power_mode(profile, mode)


def check_profile_name(profile: DeviceProfile, path: Path) -> None:
    """Bundled files must be named after the profile they hold."""
    if path.stem != profile.name:
        raise FlashsimError(f"{path}: field 'name': {profile.name!r} does not match the file name")
