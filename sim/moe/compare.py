"""Every expert-cache policy on one trace, device and memory budget: each policy's expected figure and
its device peak-bound, and one ideal-policy bound (Belady + an oracle prefetch) for them all."""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any

import numpy as np

from devices.achievable import at_bound
from devices.errors import FlashsimError
from devices.moe_spec import MoESpec
from devices.schema import DeviceProfile
from sim.moe.base import build_cache, cache_names
from sim.moe.run import MoERunConfig, capacity_for_budget, simulate

SUMMARY_KEYS = ("tokens_per_s", "ms_per_token", "io_ms_per_token", "stall_ms_per_token", "hit_rate",
                "prefetch_hit_rate", "flash_bytes_per_token", "quality_router_mass_replaced", "dram_bytes")


def resolve_capacity(spec: MoESpec, cfg: MoERunConfig, budget_bytes: int) -> MoERunConfig:
    """cfg with `capacity` set from the DRAM budget (FlashsimError when nothing fits)."""
    cap = capacity_for_budget(spec, cfg, budget_bytes)
    if cap < 0:
        from sim.moe.run import dram_bytes

        need = dram_bytes(spec, cfg, 0)
        raise FlashsimError(f"{spec.name} at {cfg.dtype} needs {need / 2**30:.2f} GiB without any expert cached "
                            f"(resident weights, staging, KV at {cfg.context_tokens} tokens); the budget is "
                            f"{budget_bytes / 2**30:.2f} GiB: give a larger --dram-budget or a smaller dtype")
    return replace(cfg, capacity=cap)


def compare_policies(spec: MoESpec, raw: DeviceProfile, experts: np.ndarray, base: MoERunConfig,
                     policies: list[tuple[str, dict[str, Any]]] | None = None, *,
                     weights: np.ndarray | None = None, phase: np.ndarray | None = None) -> dict[str, Any]:
    """{"policies": [{name, expected: {...}, peak_bound: {...}}], "ideal_policy_bound": {...}, "config": ...}."""
    ach, peak = at_bound(raw, "achievable"), at_bound(raw, "peak")
    # pinned by default profiles its hot set on the first quarter of the trace (not the whole: an oracle)
    quarter = {"profile_tokens": max(1, len(experts) // 4)}
    names = policies or [(n, quarter if n == "pinned" else {}) for n in cache_names()]
    rows = []
    for name, params in names:
        build_cache(name, params)                     # unknown names and parameters fail before any run
        cfg = replace(base, policy=name, params=dict(params))
        exp = simulate(spec, ach, experts, cfg, weights=weights, phase=phase).summary
        pk = simulate(spec, peak, experts, cfg, weights=weights, phase=phase).summary
        rows.append({"policy": name, "params": dict(params), "expected": exp,
                     "peak_bound": {k: pk[k] for k in SUMMARY_KEYS}})
    ideal_cfg = replace(base, policy="belady", params={}, prefetch_accuracy=1.0, prefetch_memory=0.0)
    ideal = simulate(spec, ach, experts, ideal_cfg, weights=weights, phase=phase).summary
    return {"model": spec.name, "device": raw.name, "config": asdict(base), "policies": rows,
            "ideal_policy_bound": ideal}
