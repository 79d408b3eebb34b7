"""The tables behind the MoE figures: hit rate against cache size per expert-cache policy, and expected
tok/s against the DRAM given to the model per device (analysis/figures/fig_moe_*.py draw them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from devices.achievable import at_bound
from devices.moe_spec import MoESpec
from devices.schema import load_profile
from sim.moe.base import build_cache
from sim.moe.residency import walk
from sim.moe.run import MoERunConfig, capacity_for_budget, dram_bytes, simulate, slots_total


def hit_rate_curve(spec: MoESpec, routing: dict[str, Any], policies: Sequence[str],
                   capacities: Sequence[int], scope: str = "layer") -> pd.DataFrame:
    """Rows (policy, capacity, cache_share, hit_rate): the walk only, no timing."""
    rows = []
    for pol in policies:
        for cap in capacities:
            r = walk(routing["experts"], spec.n_experts, build_cache(pol), int(cap), scope,  # type: ignore[arg-type]
                     weights=routing.get("weights"))
            share = slots_total(spec, r.capacity, r.scope) / (spec.n_moe_layers * spec.n_experts)
            rows.append({"policy": pol, "capacity": int(cap), "cache_share": share, "hit_rate": r.hit_rate})
    return pd.DataFrame(rows)


def tps_vs_dram(spec: MoESpec, routing: dict[str, Any], devices: Sequence[str], budgets_bytes: Sequence[int],
                cfg: MoERunConfig) -> pd.DataFrame:
    """Rows (device, dram_budget_bytes, dram_bytes, capacity, tokens_per_s, peak_tokens_per_s) for every
    budget that fits the model's resident part."""
    rows = []
    for name in devices:
        raw = load_profile(name)
        ach, peak = at_bound(raw, "achievable"), at_bound(raw, "peak")
        for b in budgets_bytes:
            cap = capacity_for_budget(spec, cfg, int(b))
            if cap < 0:
                continue
            c = replace(cfg, capacity=cap)
            kw = {"weights": routing.get("weights"), "phase": routing.get("phase")}
            e = simulate(spec, ach, routing["experts"], c, **kw).summary
            p = simulate(spec, peak, routing["experts"], c, **kw).summary
            rows.append({"device": name, "dram_budget_bytes": int(b),
                         "dram_bytes": dram_bytes(spec, c, slots_total(spec, cap, cfg.scope)), "capacity": cap,
                         "tokens_per_s": e["tokens_per_s"], "peak_tokens_per_s": p["tokens_per_s"]})
    return pd.DataFrame(rows)


def budget_grid(spec: MoESpec, cfg: MoERunConfig, n: int = 6) -> np.ndarray:
    """n budgets from the smallest that fits to the whole model cached."""
    lo = dram_bytes(spec, cfg, 0)
    hi = dram_bytes(spec, cfg, spec.n_moe_layers * spec.n_experts)
    return np.linspace(lo, hi, n).astype(np.int64)
