"""RunResult: per-token records, the summary, and exports (Parquet, JSON, Chrome/Perfetto trace).

Summary (decode steps unless the key says otherwise; a decode step yields one token per sequence):
    ms_per_token, tokens_per_s (= batch x decode steps / decode time), latency_p50_ms, latency_p90_ms,
    io_ms_per_token, compute_ms_per_token, stall_ms_per_token, memory_mgmt_ms_per_token,
    flash_bytes_per_token, flash_reads_per_token, flash_throughput_bytes_per_s (bytes / flash busy time),
    dram_peak_bytes (all steps), activation_mass_kept, recall, hit_rate,
    prefill {ms, io_ms, compute_ms, stall_ms, flash_bytes, tokens} or None,
    prune {blocks, dropped_mha, dropped_ffn, weight_bytes_saved, kv_bytes_per_token_saved, quality_proxy}
    (blocks: the canonical dropped set, "" when none; see sim.engine.prune_summary),
    joules_per_token, energy_mj_per_token {flash, dram, compute, static}, energy_inputs_per_token,
    energy_source_kinds (sim/energy.py; None where the device profile has no energy section),
    engine ("des" | "fast"), notes, config (everything resolved).
Exports write to a temporary name and rename, so a partial file never looks valid.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sim.components.flash import FlashBatch
from sim.energy import empty_energy
from sim.metric_names import (
    ACTIVATION_MASS_KEPT,
    COMPUTE_MS_PER_TOKEN,
    DRAM_PEAK_BYTES,
    FLASH_BYTES_PER_TOKEN,
    FLASH_READS_PER_TOKEN,
    FLASH_THROUGHPUT_BYTES_PER_S,
    HIT_RATE,
    IO_MS_PER_TOKEN,
    LATENCY_P50_MS,
    LATENCY_P90_MS,
    MEMORY_MGMT_MS_PER_TOKEN,
    MS_PER_TOKEN,
    RECALL,
    STALL_MS_PER_TOKEN,
    SUMMARY_KEYS,
    TOKENS_PER_S,
)
from sim.records import Interval, MemorySample, TokenRecord

__all__ = ["SUMMARY_KEYS", "RunResult", "to_jsonable"]   # SUMMARY_KEYS: the summary's metric keys


@dataclass
class RunResult:
    """The outcome of one simulation."""

    tokens: list[TokenRecord]
    config: dict[str, Any]
    engine: str
    batch: int
    mass: tuple[np.ndarray, np.ndarray]        # per step numerator / denominator
    recall: tuple[np.ndarray, np.ndarray]
    notes: list[str] = field(default_factory=list)
    memory: list[MemorySample] = field(default_factory=list)
    intervals: list[Interval] | None = None
    flash_log: list[FlashBatch] | None = None
    device: str = ""
    prune: dict[str, Any] = field(default_factory=lambda: {"blocks": ""})
    energy: dict[str, Any] | None = None       # sim.energy.energy_summary's keys

    # ---- tables -----------------------------------------------------------------------------------
    def records(self):  # -> pandas.DataFrame
        from sim.records import Recorder

        r = Recorder()
        r.tokens = self.tokens
        return r.frame()

    def write_records(self, path: str | Path) -> Path:
        """Per-token records as Parquet (atomic)."""
        from traces.outputs import write_atomic

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        frame = self.records()
        return write_atomic(path, lambda tmp: frame.to_parquet(tmp, index=False), "records")

    # ---- summary ------------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        dec = [r for r in self.tokens if r.phase == "decode"]
        pre = [r for r in self.tokens if r.phase == "prefill"]
        lat = np.array([r.latency_s for r in dec])
        sel = np.array([r.phase == "decode" for r in self.tokens])
        mn, md = self.mass
        rn, rd = self.recall
        io = sum(r.io_s for r in dec)
        nbytes = sum(r.bytes_read for r in dec)
        computed = sum(r.computed for r in dec)
        out: dict[str, Any] = {
            MS_PER_TOKEN: 1e3 * float(lat.mean()),
            TOKENS_PER_S: self.batch * len(dec) / float(lat.sum()) if lat.sum() > 0 else float("inf"),
            LATENCY_P50_MS: 1e3 * float(np.percentile(lat, 50)),
            LATENCY_P90_MS: 1e3 * float(np.percentile(lat, 90)),
            IO_MS_PER_TOKEN: 1e3 * io / len(dec),
            COMPUTE_MS_PER_TOKEN: 1e3 * float(np.mean([r.compute_s for r in dec])),
            STALL_MS_PER_TOKEN: 1e3 * float(np.mean([r.stall_s for r in dec])),
            MEMORY_MGMT_MS_PER_TOKEN: 1e3 * float(np.mean([r.mem_mgmt_s for r in dec])),
            FLASH_BYTES_PER_TOKEN: nbytes / len(dec),
            FLASH_READS_PER_TOKEN: sum(r.reads_issued for r in dec) / len(dec),
            FLASH_THROUGHPUT_BYTES_PER_S: nbytes / io if io > 0 else 0.0,
            DRAM_PEAK_BYTES: max(r.resident_bytes for r in self.tokens),
            ACTIVATION_MASS_KEPT: float(mn[sel].sum() / md[sel].sum()) if md[sel].sum() > 0 else 1.0,
            RECALL: float(rn[sel].sum() / rd[sel].sum()) if rd[sel].sum() > 0 else 1.0,
            HIT_RATE: sum(r.hits for r in dec) / computed if computed else 1.0,
            **(self.energy or empty_energy()),
            "decode_tokens": len(dec) * self.batch,
            "batch": self.batch,
            "total_s": self.tokens[-1].t_end_s,
            "prefill": None,
            "prune": dict(self.prune),
            "engine": self.engine,
            "device": self.device,
            "notes": list(self.notes),
            "config": self.config,
        }
        if pre:
            out["prefill"] = {
                "ms": 1e3 * sum(r.latency_s for r in pre),
                "io_ms": 1e3 * sum(r.io_s for r in pre),
                "compute_ms": 1e3 * sum(r.compute_s for r in pre),
                "stall_ms": 1e3 * sum(r.stall_s for r in pre),
                "flash_bytes": sum(r.bytes_read for r in pre),
                "tokens": sum(r.n_tokens for r in pre),
            }
        return out

    def write_json(self, path: str | Path) -> Path:
        return _atomic_text(Path(path), json.dumps(to_jsonable(self.summary()), indent=2))

    # ---- Chrome / Perfetto trace ---------------------------------------------------------------------
    def chrome_trace(self) -> dict[str, Any]:
        """Trace Event Format: pid 1 = the device; tids: steps, compute, memory, stall, flash (µs)."""
        lanes = {"step": 1, "compute": 2, "memory": 3, "stall": 4, "flash": 5}
        ev: list[dict[str, Any]] = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": self.device}}]
        ev += [{"ph": "M", "pid": 1, "tid": t, "name": "thread_name", "args": {"name": n}} for n, t in lanes.items()]
        us = 1e6
        for r in self.tokens:
            ev.append({"ph": "X", "pid": 1, "tid": 1, "name": f"{r.phase} step {r.token}", "cat": r.phase,
                       "ts": r.t_start_s * us, "dur": r.latency_s * us,
                       "args": {"bytes_read": r.bytes_read, "stall_ms": r.stall_s * 1e3}})
        for iv in self.intervals or []:
            ev.append({"ph": "X", "pid": 1, "tid": lanes[iv.lane], "name": iv.name, "cat": iv.lane,
                       "ts": iv.t_start_s * us, "dur": (iv.t_end_s - iv.t_start_s) * us,
                       "args": {"step": iv.step, "layer": iv.layer}})
        for b in self.flash_log or []:
            ev.append({"ph": "X", "pid": 1, "tid": 5, "name": f"{b.tag} read", "cat": b.tag,
                       "ts": b.t_start_s * us, "dur": (b.t_end_s - b.t_start_s) * us,
                       "args": {"step": b.step, "layer": b.layer, "bytes": b.nbytes, "reads": b.nreads,
                                "queued_us": (b.t_start_s - b.t_issue_s) * us}})
        for m in self.memory:
            ev.append({"ph": "C", "pid": 1, "name": "DRAM", "ts": m.t_s * us,
                       "args": {"resident_bytes": m.resident_bytes, "budget_bytes": m.budget_bytes}})
        return {"traceEvents": ev, "displayTimeUnit": "ms",
                "otherData": {"producer": "flashsim replay", "preset": self.config.get("preset")}}

    def write_timeline(self, path: str | Path) -> Path:
        return _atomic_text(Path(path), json.dumps(self.chrome_trace()))


def to_jsonable(x: Any) -> Any:
    """Plain JSON values: numpy scalars unwrapped, non-finite floats as null, keys as str."""
    if isinstance(x, float) and not np.isfinite(x):
        return None
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, dict):
        return {str(k): to_jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_jsonable(v) for v in x]
    return x


def _atomic_text(path: Path, text: str) -> Path:
    from traces.outputs import write_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, lambda tmp: tmp.write_text(text))
