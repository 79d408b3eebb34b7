"""Records of a run: one `TokenRecord` per step, timeline intervals, memory samples; the Recorder.

No pandas at import: `Recorder.frame()` imports it when asked. Column names carry units and are
listed once, in `TOKEN_COLUMNS`.

TokenRecord fields (one per step; a decode step yields one token per sequence):
    token               step index (0 is the prefill when the workload has a prompt)
    phase               "prefill" | "decode"
    n_tokens            tokens processed in the step (prompt tokens of all sequences, or the batch)
    t_start_s, t_end_s  simulated time when the step starts and ends
    latency_s           t_end_s - t_start_s  (= compute_s + mem_mgmt_s + stall_s)
    io_s                flash service time of every read the step consumed (demand, prefetched
                        for it, streamed tensors); may overlap compute when prefetched
    compute_s           attention, predictor, FFN and lm_head phases (with DMA contention)
    ffn_compute_s       the FFN phases alone (part of compute_s): gathering the computed neurons' rows
                        and their products; compute_s - ffn_compute_s is the attention, predictor and
                        lm_head work and the framework around it (real runs: everything not waiting,
                        moving rows or in the sparse FFN)
    stall_s             time the step waited for flash (demand reads, late prefetches)
    mem_mgmt_s          moving rows inside the neuron caches
    bytes_read          bytes of those reads; demand_bytes / prefetch_bytes / stream_bytes split it
    reads_issued        number of reads (chunks) issued for the step
    resident_bytes      DRAM in use (upper bound over the step): fixed + KV + caches
    cache_bytes, kv_bytes, budget_bytes
    computed            FFN neurons computed (all layers)
    hits                computed neurons already resident (static or cached) when needed
    activation_mass_kept  sum |a| over computed / sum |a| over all neurons (see sim/quality_proxy.py)
    recall              computed active neurons / active neurons
    dropped_blocks      blocks pruned from the model during the step, e.g. "mha:3,ffn:5" (sim/blocks.py;
                        "" when none)
"""

from __future__ import annotations

from dataclasses import asdict, astuple, dataclass, fields
from typing import Any

TOKEN_COLUMNS = (
    "token", "phase", "n_tokens", "t_start_s", "t_end_s", "latency_s", "io_s", "compute_s", "ffn_compute_s",
    "stall_s", "mem_mgmt_s", "bytes_read", "demand_bytes", "prefetch_bytes", "stream_bytes", "reads_issued",
    "resident_bytes", "cache_bytes", "kv_bytes", "budget_bytes", "computed", "hits",
    "activation_mass_kept", "recall", "dropped_blocks",
)


@dataclass(frozen=True, slots=True)
class TokenRecord:
    token: int
    phase: str
    n_tokens: int
    t_start_s: float
    t_end_s: float
    latency_s: float
    io_s: float
    compute_s: float
    ffn_compute_s: float
    stall_s: float
    mem_mgmt_s: float
    bytes_read: int
    demand_bytes: int
    prefetch_bytes: int
    stream_bytes: int
    reads_issued: int
    resident_bytes: int
    cache_bytes: int
    kv_bytes: int
    budget_bytes: int
    computed: int
    hits: int
    activation_mass_kept: float
    recall: float
    dropped_blocks: str = ""


assert tuple(f.name for f in fields(TokenRecord)) == TOKEN_COLUMNS


@dataclass(frozen=True, slots=True)
class Interval:
    """A span on the timeline: lane "compute" | "flash" | "stall" | "memory"."""

    lane: str
    name: str
    step: int
    layer: int
    t_start_s: float
    t_end_s: float


@dataclass(frozen=True, slots=True)
class MemorySample:
    """DRAM in use and the budget at an instant (step starts and budget changes)."""

    t_s: float
    resident_bytes: int
    budget_bytes: int


class Recorder:
    """Collects records during a run (lists of frozen dataclasses)."""

    def __init__(self, timeline: bool = False):
        self.tokens: list[TokenRecord] = []
        self.intervals: list[Interval] | None = [] if timeline else None
        self.memory: list[MemorySample] = []
        self.budget_changes: list[tuple[float, int]] = []

    def interval(self, lane: str, name: str, step: int, layer: int, t0: float, t1: float) -> None:
        if self.intervals is not None and t1 > t0:
            self.intervals.append(Interval(lane, name, step, layer, t0, t1))

    def columns(self) -> dict[str, list[Any]]:
        """Column-wise view of the token records."""
        rows = [astuple(r) for r in self.tokens]
        return {c: [r[i] for r in rows] for i, c in enumerate(TOKEN_COLUMNS)}

    def frame(self):  # -> pandas.DataFrame
        import pandas as pd

        df = pd.DataFrame(self.columns(), columns=list(TOKEN_COLUMNS))
        df["phase"] = df["phase"].astype("string")
        return df

    def as_dicts(self) -> list[dict[str, Any]]:
        return [asdict(r) for r in self.tokens]
