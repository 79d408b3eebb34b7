"""MoE rows of `flashsim plan`: for an MoE spec on a device and a DRAM budget, each expert precision x
expert-cache policy with its cache size per layer, expected tok/s, device peak-bound and ideal-policy
bound (Belady + an oracle prefetch), and the DRAM needed to reach a target tok/s.

Routing comes from a routing trace when one is given, else from the routing synthesizer
(traces/routing_synth.py) at the spec's shape with its default parameters (Zipf-skewed popularity,
token-to-token locality and cross-layer coupling): a synthetic answer, marked as such.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any

import numpy as np

from devices.achievable import at_bound
from devices.errors import FlashsimError
from devices.moe_prefetch import PrefetchAccuracy
from devices.moe_spec import MoESpec
from devices.schema import DeviceProfile
from sim.moe.run import MoERunConfig, capacity_for_budget, dram_bytes, simulate, slots_total

PLAN_POLICIES = ("lru", "lfu", "least-stale", "pinned", "page-cache", "cache-aware")
PLAN_DTYPES = ("int4", "int8")
DEFAULT_SKEW = 1.0          # Zipf exponent of expert popularity for a synthetic trace


def synthetic_routing(spec: MoESpec, tokens: int, seed: int, skew: float = DEFAULT_SKEW) -> dict[str, Any]:
    """A routing trace at the spec's shape from the routing synthesizer, in memory: `tokens` decode tokens
    (warm-up tokens are the caller's: MoERunConfig.warmup_tokens)."""
    from traces.routing_synth import SynthParams, generate, zipf_popularity

    pop = zipf_popularity(spec.n_moe_layers, spec.n_experts, skew, seed)
    ex, w = generate(pop, spec.top_k, tokens, SynthParams(), seed)
    return {"experts": ex, "weights": w, "phase": np.ones(tokens, np.uint8),
            "source": {"kind": "synthetic", "generator": "traces/routing_synth.py", "zipf_skew": skew,
                       "params": "SynthParams() defaults", "tokens": tokens, "seed": seed}}


def _row(spec: MoESpec, ach: DeviceProfile, peak: DeviceProfile, routing: dict[str, Any],
         cfg: MoERunConfig) -> dict[str, Any]:
    kw = {"weights": routing["weights"], "phase": routing["phase"]}
    e = simulate(spec, ach, routing["experts"], cfg, **kw).summary
    p = simulate(spec, peak, routing["experts"], cfg, **kw).summary
    return {"policy": cfg.policy, "params": dict(cfg.params), "dtype": cfg.dtype, "capacity": cfg.capacity, "scope": cfg.scope,
            "cache_slots_per_layer": cfg.capacity if cfg.scope == "layer" else cfg.capacity / spec.n_moe_layers,
            "tokens_per_s": e["tokens_per_s"], "peak_bound_tokens_per_s": p["tokens_per_s"],
            "hit_rate": e["hit_rate"], "dram_bytes": e["dram_bytes"], "io_ms_per_token": e["io_ms_per_token"],
            "flash_bytes_per_token": e["flash_bytes_per_token"],
            "quality_router_mass_replaced": e["quality_router_mass_replaced"],
            "energy_j_per_token": (e["energy_j_per_token"] or {}).get("total")}


def dram_for_target(spec: MoESpec, ach: DeviceProfile, routing: dict[str, Any], cfg: MoERunConfig,
                    target_tps: float, steps: int = 8) -> dict[str, Any] | None:
    """The smallest cache (on a grid of `steps` + 1 sizes up to every expert) whose expected tok/s
    meets the target under cfg's policy, and the DRAM it needs; None when even a full cache misses it."""
    full = spec.n_experts if cfg.scope == "layer" else spec.n_experts * spec.n_moe_layers
    for cap in sorted({round(full * i / steps) for i in range(steps + 1)}):
        c = replace(cfg, capacity=cap)
        s = simulate(spec, ach, routing["experts"], c, weights=routing["weights"], phase=routing["phase"]).summary
        if s["tokens_per_s"] >= target_tps:
            return {"policy": cfg.policy, "params": dict(cfg.params), "dtype": cfg.dtype, "capacity": cap,
                    "dram_bytes": dram_bytes(spec, c, slots_total(spec, cap, cfg.scope)),
                    "tokens_per_s": s["tokens_per_s"]}
    return None


# The router's choice is the model's own: a configuration that reroutes tokens to cached experts changes
# the model's output. By default the best row keeps every choice; `--max-router-mass-replaced X` admits
# cache-aware routing up to a share X of router-weight mass handed to other experts.
DEFAULT_MAX_MASS_REPLACED = 0.0


def floor_rule(max_mass_replaced: float) -> str:
    """The quality floor of the MoE plan's best row, in words."""
    if max_mass_replaced <= 0:
        return ("best is the fastest configuration that keeps every routing choice of the model (cache-aware "
                "routing changes them: admit it with --max-router-mass-replaced X)")
    return (f"best is the fastest configuration that hands at most {max_mass_replaced:.1%} of the router-weight "
            "mass to experts the router did not choose")


def moe_plan(spec: MoESpec, raw: DeviceProfile, *, budget_bytes: int | None = None, target_tps: float | None = None,
             routing: dict[str, Any] | None = None, tokens: int = 48, seed: int = 0,
             dtypes: tuple[str, ...] = PLAN_DTYPES, policies: tuple[str, ...] = PLAN_POLICIES,
             scope: str = "layer", context_tokens: int = 1024,
             prefetch: PrefetchAccuracy | None = None,
             max_mass_replaced: float = DEFAULT_MAX_MASS_REPLACED) -> dict[str, Any]:
    """Rows (dtype x policy), the ideal bound per dtype, the best feasible row and the DRAM for a target;
    with `prefetch` every row (and the DRAM search) runs speculative next-layer prefetch at its accuracy.
    The best row is the fastest whose routing keeps the router's choice within `max_mass_replaced` (the
    share of router-weight mass a cache-aware policy hands to other experts: a quality cost, so 0 by default)."""
    if not 0.0 <= max_mass_replaced <= 1.0:
        raise FlashsimError(f"--max-router-mass-replaced {max_mass_replaced:g}: must be a share in [0, 1]")
    pf = {"prefetch_accuracy": prefetch.accuracy, "prefetch_memory": prefetch.memory} if prefetch else {}
    ach, peak = at_bound(raw, "achievable"), at_bound(raw, "peak")
    budget = budget_bytes if budget_bytes is not None else raw.available_bytes
    routing = routing or synthetic_routing(spec, tokens, seed)
    if routing["experts"].shape[1:] != (spec.n_moe_layers, spec.top_k):
        raise FlashsimError(f"routing trace shape {routing['experts'].shape[1:]} does not match {spec.name} "
                            f"({spec.n_moe_layers} MoE layers, top-{spec.top_k})")
    rows, ideal, unfit = [], {}, []
    warm = 1                                         # steady state: one untimed pass over the trace first
    for dt in dtypes:
        base = MoERunConfig(scope=scope, dtype=dt, context_tokens=context_tokens, seed=seed,  # type: ignore[arg-type]
                            warm_passes=warm, **pf)
        cap = capacity_for_budget(spec, base, budget)
        if cap < 0:
            unfit.append({"dtype": dt, "dram_needed_without_cache_bytes": dram_bytes(spec, base, 0)})
            continue
        base = replace(base, capacity=cap)
        for pol in policies:
            # pinned: the hot set profiled on the first quarter of the tokens (mlx-moe profiles on separate prompts)
            params = {"profile_tokens": max(1, len(routing["experts"]) // 4)} if pol == "pinned" else {}
            rows.append(_row(spec, ach, peak, routing, replace(base, policy=pol, params=params)))
        ib = simulate(spec, ach, routing["experts"], replace(base, policy="belady", prefetch_accuracy=1.0, prefetch_memory=0.0),
                      weights=routing["weights"], phase=routing["phase"]).summary
        ideal[dt] = {"tokens_per_s": ib["tokens_per_s"], "hit_rate": ib["hit_rate"], "capacity": cap}
    kept = [r for r in rows if r["quality_router_mass_replaced"] <= max_mass_replaced + 1e-12]
    best = max(kept, key=lambda r: r["tokens_per_s"], default=None)
    need = None
    if target_tps is not None and best is not None:
        cfg = MoERunConfig(policy=best["policy"], params=best["params"], scope=scope, dtype=best["dtype"],  # type: ignore[arg-type]
                           context_tokens=context_tokens, seed=seed, warm_passes=warm, **pf)
        need = dram_for_target(spec, ach, routing, cfg, target_tps)
    return {"model": spec.name, "device": raw.name, "budget_bytes": budget, "target_tps": target_tps,
            "warm_passes": warm, "prefetch": asdict(prefetch) if prefetch else None,
            "routing_source": routing["source"], "rows": rows, "ideal_policy_bound": ideal, "best": best,
            "quality_floor": {"max_router_mass_replaced": max_mass_replaced, "rule": floor_rule(max_mass_replaced)},
            "meets_target": None if target_tps is None or best is None else best["tokens_per_s"] >= target_tps,
            "dram_for_target": need, "does_not_fit": unfit, "resident_bytes": {d: spec.resident_bytes(d) for d in dtypes},
            "expert_bytes": {d: spec.expert_bytes(d) for d in dtypes}}
