"""MemorySpec and ComputeSpec: the `memory:` and `compute:` sections of a device profile.

`memory` is the DRAM the inference process sees (capacity, reserve, peak and sustained bandwidth).
`compute` is the unit that runs the FFN: GEMV throughput per dtype, gather and transpose rates,
per-operation overhead, the achievable efficiencies (devices/achievable.py folds them in), and the
measured kernel tables that replace the single rates where a run's dtype has one: the sparse FFN's
kernels over (d_model, neurons) (`SparseFfnSpec`) and dense GEMVs over (in_features, out_features)
(`DenseGemvSpec`), both interpolated by devices/kernel_table.py.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from devices.kernel_table import KernelTable
from devices.section_base import (
    RETIRED_COMPUTE_KEYS,
    Provenance,
    Strict,
    drop_retired,
    needs_source,
)


class MemorySpec(Strict):
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
        needs_source(self.sustained_bandwidth_bytes_per_s, self.sustained_bandwidth_source,
                      "sustained_bandwidth")
        if self.sustained_bandwidth_bytes_per_s is not None and \
                self.sustained_bandwidth_bytes_per_s > self.bandwidth_bytes_per_s:
            raise ValueError(f"sustained_bandwidth_bytes_per_s ({self.sustained_bandwidth_bytes_per_s:g}) exceeds "
                             f"the peak bandwidth_bytes_per_s ({self.bandwidth_bytes_per_s:g})")
        return self


SPARSE_FFN_KERNELS = ("gather_s", "input_gemv_s", "transpose_s", "down_gemv_s")


class SparseFfnTable(Strict):
    """One dtype's sparse-FFN kernels on gathered cache rows: seconds per call [i][j] at d_model[i]
    and neurons[j] computed (devices/kernel_table.py interpolates; real/bench_sparse_ffn.py measures).
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


class SparseFfnSpec(Strict):
    """The sparse FFN's kernels measured per dtype over model widths and computed neurons; where a
    run's dtype has a table it replaces the single rates (gather_bytes_per_s, the GEMV rate,
    transpose_bytes_per_s) in the FFN phase."""

    tables: dict[Literal["fp32", "fp16", "bf16", "int8", "int4"], SparseFfnTable]
    source: str


class DenseGemvTable(Strict):
    """One dtype's dense GEMV y = W x (one token, W [out_features, in_features] streamed from DRAM):
    seconds per call [i][j] at in_features[i] and out_features[j] (devices/kernel_table.py
    interpolates; real/bench_dense_gemv.py measures)."""

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


class DenseGemvSpec(Strict):
    """Dense GEMVs measured per dtype over both matrix sizes; where a run's dtype has a table it
    replaces the single rates (the GEMV rate, gemv_row_s) for the attention projections, the
    lm_head and a dense FFN's matrices."""

    tables: dict[Literal["fp32", "fp16", "bf16", "int8", "int4"], DenseGemvTable]
    source: str


class ComputeSpec(Strict):
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
        return drop_retired(data, RETIRED_COMPUTE_KEYS)

    @model_validator(mode="after")
    def _achievable(self) -> ComputeSpec:
        needs_source(self.gemv_efficiency, self.gemv_efficiency_source, "gemv_efficiency")
        needs_source(self.sparse_gemv_efficiency, self.sparse_gemv_efficiency_source, "sparse_gemv_efficiency")
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
