"""`flashsim plan --model MOE`: the MoE rows (analysis/moe_planner.py) on the command line."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("MoE models")
    g.add_argument("--routing-trace", help="routing trace to replay (default: synthesize one of the spec's shape)")
    g.add_argument("--expert-dtype", action="append", default=None, help="expert precision(s) to plan "
                   "(repeatable; default int4 and int8)")
    g.add_argument("--cache-scope", choices=("layer", "global"), default="layer",
                   help="expert cache slots per MoE layer (default) or one pool")
    g.add_argument("--prefetch", action="store_true", help="every row with speculative next-layer prefetch at the "
                   "published accuracy of the model's family (devices/models/moe/prefetch/); off by default")
    g.add_argument("--prefetch-accuracy", type=float, help="speculative prefetch with this accuracy instead "
                   "(implies --prefetch)")
    g.add_argument("--max-router-mass-replaced", type=float, default=0.0, metavar="X",
                   help="quality floor of the best row: the share of router-weight mass a cache-aware policy may "
                        "hand to experts the router did not choose (default 0: every routing choice kept)")
    g.add_argument("--prefetch-memory", type=float, default=None,
                   help="persistence of prefetch errors from token to token, in [0, 1) (default 0)")


def plan_moe(args: argparse.Namespace) -> int:
    import numpy as np  # here, not at import: `flashsim plan --help` loads this module (tests/test_cli_startup.py)

    from analysis.moe_planner import PLAN_DTYPES, moe_plan
    from devices.moe_prefetch import PrefetchAccuracy, resolve_prefetch
    from devices.moe_spec import load_moe_model
    from devices.schema import load_profile
    from devices.units import format_bytes, parse_bytes
    from flashsim.output import print_json, print_table

    spec = load_moe_model(args.model)
    raw = load_profile(args.device)
    budget = parse_bytes(args.dram_free, "--dram-free") if args.dram_free else None
    routing = None
    if args.routing_trace or args.trace:
        from traces.routing import open_routing_trace

        t = open_routing_trace(args.routing_trace or args.trace)
        routing = {"experts": np.asarray(t.experts), "weights": np.asarray(t.weights), "phase": np.asarray(t.phase),
                   "source": {"kind": t.manifest.source.get("kind"), "path": str(t.path)}}
    out = moe_plan(spec, raw, budget_bytes=budget, target_tps=args.target_tps, routing=routing,
                   tokens=min(args.tokens, 64), seed=args.seed, dtypes=tuple(args.expert_dtype or PLAN_DTYPES),
                   scope=args.cache_scope, prefetch=resolve_prefetch(
                       spec.family, enabled=args.prefetch, accuracy=args.prefetch_accuracy,
                       memory=args.prefetch_memory), max_mass_replaced=args.max_router_mass_replaced)
    if args.json:
        print_json(out)
        return 0
    src = out["routing_source"]
    where = src.get("path") or f"{src.get('generator')}, Zipf skew {src.get('zipf_skew')}"
    print(f"{out['model']} on {out['device']} with {format_bytes(out['budget_bytes'])} of DRAM; routing: "
          f"{src['kind']} ({where}); caches warmed by {out['warm_passes']} untimed pass over it")
    pf = out["prefetch"]
    print(PrefetchAccuracy(**pf).line() if pf else "speculative prefetch: off (--prefetch: the model family's "
          "published accuracy)")
    rows = [[r["dtype"], r["policy"], f"{r['cache_slots_per_layer']:.0f}", f"{r['hit_rate']:.3f}",
             f"{r['tokens_per_s']:.2f}", f"{r['peak_bound_tokens_per_s']:.2f}",
             f"{out['ideal_policy_bound'][r['dtype']]['tokens_per_s']:.2f}", format_bytes(r["dram_bytes"]),
             f"{r['quality_router_mass_replaced']:.3f}"] for r in out["rows"]]
    print_table(["experts", "cache policy", "slots/layer", "hit rate", "tok/s", "peak tok/s", "ideal tok/s", "DRAM",
                 "mass replaced"], rows, align="llrrrrrrr")
    for u in out["does_not_fit"]:
        print(f"{u['dtype']}: does not fit: needs {format_bytes(u['dram_needed_without_cache_bytes'])} before any "
              "expert is cached")
    print(f"quality floor: {out['quality_floor']['rule']}")
    b = out["best"]
    if b:
        print(f"best: {b['policy']} with {b['dtype']} experts, {b['cache_slots_per_layer']:.0f} slots per layer: "
              f"{b['tokens_per_s']:.2f} tok/s expected (peak-bound {b['peak_bound_tokens_per_s']:.2f}, ideal policy "
              f"{out['ideal_policy_bound'][b['dtype']]['tokens_per_s']:.2f})")
    if out["target_tps"] is not None:
        need = out["dram_for_target"]
        print(f"target {out['target_tps']:g} tok/s: " + (
            f"{need['policy']} with {need['dtype']} experts needs {need['capacity']} slots per layer, "
            f"{format_bytes(need['dram_bytes'])} of DRAM ({need['tokens_per_s']:.2f} tok/s)" if need
            else "not reached even with every expert cached"))
    print("tok/s: expected on the device's achievable numbers; peak: datasheet ceiling; ideal: Belady's cache with "
          "an oracle next-layer prefetch, for policies that keep the router's choice (cache-aware routing trades "
          "router-weight mass, its quality cost, to pass it).")
    return 0



