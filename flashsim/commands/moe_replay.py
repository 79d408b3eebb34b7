"""`flashsim replay` on a routing trace: every expert-cache policy (or those named with --expert-cache)
on one MoE spec, device and DRAM budget; expected, device peak-bound and ideal-policy bound."""

from __future__ import annotations

import argparse
from typing import Any

from devices.units import format_bytes, parse_bytes
from flashsim.output import print_json, print_table


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("MoE (with a routing trace)")
    g.add_argument("--routing-trace", help="routing trace directory (see `flashsim trace`); --trace works too")
    g.add_argument("--expert-cache", action="append", default=[], metavar="POLICY[:k=v,...]",
                   help="expert-cache policy (repeatable; default: every one): lru, lfu, least-stale, pinned, "
                        "page-cache, belady, cache-aware")
    g.add_argument("--cache-scope", choices=("layer", "global"), default="layer",
                   help="cache slots per MoE layer (default) or one pool for all layers")
    g.add_argument("--cache-slots", type=int, help="expert slots (per layer or in all); default: what the DRAM "
                   "budget leaves after resident weights, staging and KV")
    g.add_argument("--expert-dtype", default=None, help="weight precision (default: the spec's, e.g. int4)")
    g.add_argument("--context", type=int, default=1024, help="context tokens for the KV cache (default 1024)")
    g.add_argument("--prefetch", action="store_true", help="speculative next-layer prefetch (the next layer's "
                   "router on the current hidden state) at the published accuracy of the model's family "
                   "(devices/models/moe/prefetch/); off by default")
    g.add_argument("--prefetch-accuracy", type=float, help="speculative prefetch with this accuracy instead (a "
                   "measured figure, e.g. from a captured trace); implies --prefetch")
    g.add_argument("--warm-passes", type=int, default=1, help="untimed replays of the whole trace before the timed "
                   "one, so caches start in steady state (default 1; 0 with --warmup-tokens for a cold start)")
    g.add_argument("--warmup-tokens", type=int, default=None, help="with --warm-passes 0: decode tokens that only "
                   "warm the cache before timing starts (default: a quarter of the trace's decode tokens)")
    g.add_argument("--plot", metavar="DIR", help="also write the MoE figures for this trace and device: hit rate "
                   "vs cache size per policy (moe_hit_rate.png/.svg) and tok/s vs DRAM (moe_dram.png/.svg)")
    g.add_argument("--prefetch-memory", type=float, default=None,
                   help="persistence of prefetch errors from token to token, in [0, 1) (default 0: no published "
                        "figure)")


def is_moe_replay(args: argparse.Namespace) -> bool:
    from traces.routing import is_routing_trace

    return bool(args.routing_trace) or bool(args.trace and is_routing_trace(args.trace))


def run_moe_replay(args: argparse.Namespace) -> int:
    from devices.errors import FlashsimError
    from devices.moe_prefetch import resolve_prefetch
    from devices.moe_spec import load_moe_model
    from devices.schema import load_profile
    from sim.moe.base import parse_cache_arg
    from sim.moe.compare import compare_policies, resolve_capacity
    from sim.moe.run import MoERunConfig
    from traces.routing import open_routing_trace

    path = args.routing_trace or args.trace
    if not args.device:
        raise FlashsimError("replay: --device required")
    trace = open_routing_trace(path)
    spec = load_moe_model(args.model or trace.manifest.model)
    raw = load_profile(args.device)
    dtype = args.expert_dtype or ("int4" if spec.dtype in ("bf16", "fp16") else spec.dtype)
    pf = resolve_prefetch(spec.family, enabled=args.prefetch, accuracy=args.prefetch_accuracy,
                          memory=args.prefetch_memory)
    base = MoERunConfig(capacity=args.cache_slots or 0, scope=args.cache_scope, dtype=dtype,
                        context_tokens=args.context, prefetch_accuracy=pf.accuracy if pf else None,
                        prefetch_memory=pf.memory if pf else 0.0, seed=args.seed or 0,
                        engine="des" if args.engine == "des" else "fast")
    budget = parse_bytes(args.dram_budget, "--dram-budget") if args.dram_budget else raw.available_bytes
    if args.cache_slots is None:
        base = resolve_capacity(spec, base, budget)
    policies = [parse_cache_arg(x) for x in args.expert_cache] or None
    n = args.tokens
    ex, w, ph = trace.experts, trace.weights, trace.phase
    if n is not None:
        ex, w, ph = ex[:n], w[:n], ph[:n]
    from dataclasses import asdict, replace

    warm = args.warmup_tokens if args.warmup_tokens is not None else int((ph == 1).sum()) // 4
    base = replace(base, warmup_tokens=warm, warm_passes=args.warm_passes)
    out = compare_policies(spec, raw, ex, base, policies, weights=w, phase=ph)
    out.update({"routing_trace": str(path), "dram_budget_bytes": budget,
                "routing_source": trace.manifest.source.get("kind"),
                "router_sync_s": raw.moe.router_sync_s if raw.moe else None,
                "router_sync_source": raw.moe.router_sync_source.model_dump() if raw.moe else None,
                "prefetch": asdict(pf) if pf else None})
    if args.plot:
        out["figures"] = [str(p) for p in _plot(args.plot, spec, raw.name, ex, w, ph, base, policies)]
    if args.json:
        print_json(out)
        return 0
    _print(out, spec)
    for f in out.get("figures", []):
        print(f"wrote {f}")
    return 0


def _plot(out_dir: str, spec: Any, device: str, ex: Any, w: Any, ph: Any, base: Any,
          policies: list[tuple[str, dict]] | None) -> list[Any]:
    """The two MoE figures (analysis/figures/fig_moe_*.py) for this trace, spec and device."""
    import numpy as np

    from analysis.figures import common as C
    from analysis.figures import fig_moe_dram, fig_moe_hit_rate
    from analysis.moe_curves import budget_grid, hit_rate_curve, tps_vs_dram

    routing = {"experts": np.asarray(ex), "weights": np.asarray(w), "phase": np.asarray(ph)}
    names = [n for n, _ in policies] if policies else ["lru", "lfu", "least-stale", "pinned", "belady"]
    names = [n for n in names if n not in ("cache-aware", "page-cache")] or ["lru"]
    caps = sorted({round(spec.n_experts * i / 8) for i in range(9)})
    hr = hit_rate_curve(spec, routing, names, caps, base.scope)
    paths = C.save(fig_moe_hit_rate.draw(hr, f"{spec.name}: expert-cache hit rate vs cache size"), out_dir,
                   fig_moe_hit_rate.KIND)
    df = tps_vs_dram(spec, routing, [device], budget_grid(spec, base, 6), base)
    paths += C.save(fig_moe_dram.draw(df, f"{spec.name} {base.dtype}, {base.policy}: decode tok/s vs DRAM"),
                    out_dir, fig_moe_dram.KIND)
    return paths


def _print(out: dict[str, Any], spec: Any) -> None:
    from devices.moe_prefetch import PrefetchAccuracy

    c = out["config"]
    warm = (f"{c['warm_passes']} untimed pass(es) first" if c["warm_passes"]
            else f"{c['warmup_tokens']} warm-up tokens")
    print(f"{out['model']} on {out['device']}: {c['dtype']} experts, {warm}, "
          f"{c['capacity']} cache slots {'per MoE layer' if c['scope'] == 'layer' else 'in all'} "
          f"({format_bytes(out['dram_budget_bytes'])} budget), routing trace {out['routing_trace']} "
          f"({out['routing_source']})")
    rows = []
    for r in out["policies"]:
        e, p = r["expected"], r["peak_bound"]
        rows.append([r["policy"], f"{e['tokens_per_s']:.2f}", f"{p['tokens_per_s']:.2f}", f"{e['hit_rate']:.3f}",
                     f"{e['prefetch_hit_rate']:.3f}", format_bytes(e["flash_bytes_per_token"]),
                     f"{e['io_ms_per_token']:.1f}", f"{e['quality_router_mass_replaced']:.3f}",
                     format_bytes(e["dram_bytes"]),
                     "-" if e["energy_j_per_token"] is None else f"{e['energy_j_per_token']['total']:.2f}"])
    i = out["ideal_policy_bound"]
    rows.append(["ideal bound", f"{i['tokens_per_s']:.2f}", "", f"{i['hit_rate']:.3f}", f"{i['prefetch_hit_rate']:.3f}",
                 format_bytes(i["flash_bytes_per_token"]), f"{i['io_ms_per_token']:.1f}", "0.000",
                 format_bytes(i["dram_bytes"]), "-" if i["energy_j_per_token"] is None
                 else f"{i['energy_j_per_token']['total']:.2f}"])
    if out["router_sync_s"] is None:
        print(f"note: {out['device']} has no moe: section: the router read-back per MoE layer is taken as 0 "
              "(add one with its source, docs/moe.md)")
    else:
        print(f"router read-back: {out['router_sync_s'] * 1e6:.0f} us per MoE layer "
              f"({out['router_sync_source']['kind']})")
    pf = out.get("prefetch")
    print(PrefetchAccuracy(**pf).line() if pf else "speculative prefetch: off (--prefetch: the model family's "
          "published accuracy; --prefetch-accuracy P: your own)")
    print_table(["expert cache", "tok/s", "peak tok/s", "hit rate", "prefetch hits", "flash/token", "io ms",
                 "mass replaced", "DRAM", "J/token"], rows, align="lrrrrrrrrr")
    print("tok/s: expected (achievable device numbers); peak tok/s: the same policy on datasheet peaks (a bound); "
          "ideal bound: Belady's cache + an oracle next-layer prefetch (for policies that keep the router's choice). "
          "mass replaced: router-weight share cache-aware routing swapped (its quality cost, the price of passing "
          "the bound).")
