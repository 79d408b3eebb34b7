"""One MoE run: a spec, a device, a routing trace and an expert-cache policy -> per-token timeline and
a summary; and the three numbers every MoE answer carries:

- **expected**: the policy as configured, on the device's achievable numbers;
- **device peak-bound**: the same policy on the device's datasheet peaks (a ceiling, never the answer);
- **ideal-policy bound**: Belady's offline cache plus an oracle prefetch (accuracy 1) on the
  achievable numbers: what no cache or predictor can beat on this trace and device.

Memory: resident weights + the cache's slots x one expert + the staging buffers (one layer's
demand reads and one layer's prefetch) + the KV cache and recurrent state at the context length.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

import numpy as np

from devices.achievable import at_bound
from devices.errors import FlashsimError
from devices.moe_spec import MOE_DTYPE_BITS, MoESpec
from devices.schema import DeviceProfile
from sim.moe.base import build_cache
from sim.moe.des import run_des
from sim.moe.prefetch import realised_accuracy, speculative_sets
from sim.moe.residency import Residency, walk
from sim.moe.timing import LayerCosts, Timeline, fast_path, layer_costs
from sim.rng import RngStreams


@dataclass(frozen=True)
class MoERunConfig:
    """What one run needs besides the spec, device and trace."""

    policy: str = "lru"
    params: dict[str, Any] = field(default_factory=dict)
    capacity: int = 0                    # expert slots: per MoE layer (scope "layer") or in all ("global")
    scope: Literal["layer", "global"] = "layer"
    dtype: str = "int4"
    context_tokens: int = 1024
    prefetch_accuracy: float | None = None
    prefetch_memory: float = 0.0
    seed: int = 0
    engine: Literal["fast", "des"] = "fast"
    router_sync: bool = True             # False: an engine that never waits on the host (no reads during decode)
    warmup_tokens: int = 0               # the first tokens warm the cache and are not timed (steady state after)
    warm_passes: int = 0                 # untimed walks over the whole trace first: the caches start in steady state

    def __post_init__(self) -> None:
        if self.dtype not in MOE_DTYPE_BITS:
            raise FlashsimError(f"dtype {self.dtype!r}: choose one of {', '.join(MOE_DTYPE_BITS)}")
        if self.context_tokens < 0:
            raise FlashsimError(f"context_tokens must be >= 0, got {self.context_tokens}")
        if not 0 <= self.warm_passes <= 4:
            raise FlashsimError(f"warm_passes must be in [0, 4], got {self.warm_passes}")
        if self.warmup_tokens < 0:
            raise FlashsimError(f"warmup_tokens must be >= 0, got {self.warmup_tokens}")


def dram_bytes(spec: MoESpec, cfg: MoERunConfig, slots_total: int) -> int:
    """Resident weights + cached experts + staging (demand and prefetch of one layer) + KV and state."""
    eb = spec.expert_bytes(cfg.dtype)
    staging = spec.top_k * (2 if cfg.prefetch_accuracy is not None else 1)
    kv_dtype = "fp16"
    return (spec.resident_bytes(cfg.dtype) + (slots_total + staging) * eb
            + spec.kv_bytes(cfg.context_tokens, kv_dtype))


def slots_total(spec: MoESpec, capacity: int, scope: str) -> int:
    return capacity * spec.n_moe_layers if scope == "layer" else capacity


def capacity_for_budget(spec: MoESpec, cfg: MoERunConfig, budget_bytes: int) -> int:
    """The most cache slots (per layer or in all, by cfg.scope) whose run fits `budget_bytes`; -1 when
    even an empty cache does not fit."""
    free = budget_bytes - dram_bytes(spec, cfg, 0)
    if free < 0:
        return -1
    total = min(free // spec.expert_bytes(cfg.dtype), spec.n_moe_layers * spec.n_experts)
    return int(total // spec.n_moe_layers if cfg.scope == "layer" else total)


@dataclass(frozen=True)
class MoERun:
    residency: Residency
    timeline: Timeline
    costs: LayerCosts
    summary: dict[str, Any]


def _decode_rows(phase: np.ndarray | None, T: int, warmup: int = 0) -> np.ndarray:
    """The tokens timed: decode tokens (phase 1) after the first `warmup` of them; prefill tokens and the
    warm-up only fill the cache. A trace too short for its warm-up times its last token."""
    dec = np.ones(T, bool) if phase is None else np.asarray(phase) == 1
    if not dec.any():
        dec = np.ones(T, bool)
    idx = np.flatnonzero(dec)
    keep = idx[min(warmup, len(idx) - 1):]
    out = np.zeros(T, bool)
    out[keep] = True
    return out


def simulate(spec: MoESpec, profile: DeviceProfile, experts: np.ndarray, cfg: MoERunConfig, *,
             weights: np.ndarray | None = None, phase: np.ndarray | None = None) -> MoERun:
    """One run on `profile` (already folded to its bound: achievable or peak)."""
    if profile.bound == "raw":
        profile = at_bound(profile, "achievable")
    e = np.asarray(experts)
    if e.ndim != 3 or e.shape[1] != spec.n_moe_layers or e.shape[2] != spec.top_k:
        raise FlashsimError(f"routing trace shape {tuple(e.shape)} does not match {spec.name}: expected "
                            f"[tokens, {spec.n_moe_layers} MoE layers, top-{spec.top_k}]")
    T0 = e.shape[0]
    if cfg.warm_passes:
        # the trace replayed untimed first: a stationary workload's caches in steady state, without the
        # compulsory first reads of a short trace (only the last copy is timed)
        reps = cfg.warm_passes + 1
        e = np.concatenate([e] * reps)
        weights = None if weights is None else np.concatenate([np.asarray(weights)] * reps)
        ph = np.ones(T0, np.uint8) if phase is None else np.asarray(phase)
        phase = np.concatenate([np.zeros(T0 * cfg.warm_passes, np.uint8), ph])
    pred = None
    if cfg.prefetch_accuracy is not None:
        rng = RngStreams(cfg.seed).get("moe/prefetch")
        pred = speculative_sets(e, spec.n_experts, cfg.prefetch_accuracy, cfg.prefetch_memory, rng)
    policy = build_cache(cfg.policy, cfg.params)
    res = walk(e, spec.n_experts, policy, cfg.capacity, cfg.scope, weights=weights, prefetch=pred)
    hits, pf_hits, misses = res.layer_counts()
    pf_reads = res.prefetch_reads
    all_cached = res.capacity >= (spec.n_experts if res.scope == "layer" else spec.n_experts * spec.n_moe_layers)
    costs = layer_costs(spec, profile, cfg.dtype, cfg.context_tokens, max_batch=2 * spec.top_k,
                        router_sync=cfg.router_sync and not (all_cached or policy.page_faults))
    engine = run_des if cfg.engine == "des" else fast_path
    tl = engine(costs, hits, pf_hits, misses, pf_reads, policy.page_faults)
    rows = _decode_rows(phase, e.shape[0], 0 if cfg.warm_passes else cfg.warmup_tokens)
    summary = _summary(spec, profile, cfg, res, tl, costs, rows, misses, pf_reads, pred, e, policy.page_faults)
    return MoERun(res, tl, costs, summary)


def _summary(spec: MoESpec, profile: DeviceProfile, cfg: MoERunConfig, res: Residency, tl: Timeline,
             costs: LayerCosts, rows: np.ndarray, misses: np.ndarray, pf_reads: np.ndarray,
             pred: np.ndarray | None, e: np.ndarray, page_faults: bool) -> dict[str, Any]:
    lat = tl.latency_s[rows]
    eb = costs.expert_bytes
    flash_bytes = (misses[rows].sum(axis=1) + pf_reads[rows].sum(axis=1)) * eb
    ms = float(lat.mean())
    used_bytes = spec.n_moe_layers * spec.top_k * eb
    slots = slots_total(spec, res.capacity, res.scope)
    out = {
        "policy": cfg.policy, "params": dict(cfg.params), "bound": profile.bound, "scope": res.scope,
        "capacity": res.capacity, "cache_slots_total": slots,
        "cache_share_of_experts": slots / (spec.n_moe_layers * spec.n_experts),
        "dtype": cfg.dtype, "tokens": int(rows.sum()), "warmup_tokens": cfg.warmup_tokens,
        "warm_passes": cfg.warm_passes,
        "ms_per_token": ms * 1e3, "tokens_per_s": 1.0 / ms if ms > 0 else float("inf"),
        "io_ms_per_token": float(tl.io_s[rows].mean()) * 1e3,
        "stall_ms_per_token": float(tl.stall_s[rows].mean()) * 1e3,
        "hit_rate": float(res.hit[rows].mean()),
        "prefetch_hit_rate": float(res.prefetch_hit[rows].mean()),
        "miss_rate": float(res.miss[rows].mean()),
        "flash_bytes_per_token": float(flash_bytes.mean()),
        "expert_bytes": eb, "page_faults": page_faults,
        "router_sync_ms_per_token": float((costs.router_s.sum() - _router_gemv_s(spec, costs)) * 1e3),
        "dram_bytes": dram_bytes(spec, cfg, slots),
        "quality_router_mass_replaced": float(res.replaced_mass[rows].mean()),
        "prefetch_accuracy_realised": realised_accuracy(pred, e) if pred is not None else None,
    }
    out["energy_j_per_token"] = _energy(spec, profile, tl, rows, flash_bytes, costs, used_bytes)
    return out


def _router_gemv_s(spec: MoESpec, costs: LayerCosts) -> float:
    """The router GEMVs' own time per token (router_s less the read-back)."""
    return float(spec.n_moe_layers * (costs.router_gemv_s))


def _energy(spec: MoESpec, profile: DeviceProfile, tl: Timeline, rows: np.ndarray, flash_bytes: np.ndarray,
            costs: LayerCosts, used_bytes: int) -> dict[str, float] | None:
    """Joules per decode token by component (sim/energy.py's terms): flash reads while busy, DRAM
    traffic (weights streamed, expert bytes computed, flash DMA into DRAM), compute, static."""
    en = profile.energy
    if en is None:
        return None
    lat, io = tl.latency_s[rows], tl.io_s[rows]
    busy = np.maximum(lat - tl.stall_s[rows], 0.0)
    flops = 2.0 * spec.active_params_per_token()
    parts = {
        "flash": float(((en.value("flash_read_active_w") - en.value("flash_idle_w")) * io).mean()),
        "dram": float((en.value("dram_j_per_byte") * (costs.stream_bytes_per_token + used_bytes + flash_bytes)).mean()),
        "compute": float((en.value("compute_j_per_flop") * flops + en.value("compute_busy_w") * busy).mean()),
        "static": float(((en.value("static_w") + en.value("flash_idle_w")) * lat).mean()),
    }
    parts["total"] = sum(parts.values())
    return parts


def three_numbers(spec: MoESpec, raw: DeviceProfile, experts: np.ndarray, cfg: MoERunConfig, *,
                  weights: np.ndarray | None = None, phase: np.ndarray | None = None) -> dict[str, Any]:
    """Expected, device peak-bound and ideal-policy bound of one configuration (module docstring)."""
    ach, peak = at_bound(raw, "achievable"), at_bound(raw, "peak")
    expected = simulate(spec, ach, experts, cfg, weights=weights, phase=phase).summary
    peak_run = simulate(spec, peak, experts, cfg, weights=weights, phase=phase).summary
    ideal_cfg = replace(cfg, policy="belady", params={}, prefetch_accuracy=1.0, prefetch_memory=0.0)
    ideal = simulate(spec, ach, experts, ideal_cfg, weights=weights, phase=phase).summary
    return {"expected": expected, "peak_bound": peak_run, "ideal_policy_bound": ideal, "config": asdict(cfg)}
