"""CLI: MoE on the real backend. `flashsim real moe-store` writes an expert store; `flashsim real run` on an
expert store runs the expert cache on it (dispatched from real_run.py):

    flashsim real moe-store --out STORE --model HF_MOE_FOLDER [--dtype fp32]             (model mode store)
    flashsim real moe-store --out STORE --like TRACE --d-model D --d-expert-ff F          (shape mode store)
    flashsim real run --store STORE --trace ROUTING_TRACE --expert-cache lru --capacity 4 [--repeats 3]
    flashsim real run --store STORE --model HF_MOE_FOLDER --text FILE --expert-cache lru --capacity 4

Both runs print the real per-token latency beside the simulator's for the same trace, policy and
capacity on --profile, with the real repeat spread (real/runtime/moe_runs.py `score`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from devices.errors import FlashsimError
from devices.units import format_bytes
from flashsim.output import print_json, print_table


def register_store(rsub: argparse._SubParsersAction) -> None:
    s = rsub.add_parser("moe-store", help="write an expert store (each routed expert one aligned block)")
    s.add_argument("--out", required=True, help="expert store directory to create")
    src = s.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="a local Hugging Face MoE folder: its experts' weights")
    src.add_argument("--like", metavar="TRACE", help="shape mode: random experts for this routing trace's layers, "
                     "experts and top-k")
    s.add_argument("--d-model", type=int, help="with --like: hidden size")
    s.add_argument("--d-expert-ff", type=int, help="with --like: one expert's intermediate size")
    s.add_argument("--dtype", default="fp32", choices=("fp32", "fp16", "bf16"),
                   help="stored dtype (default fp32: this host's CPU computes fp32 fastest)")
    s.add_argument("--seed", type=int, default=0, help="with --like: seed of the random experts")
    s.add_argument("--force", action="store_true", help="replace --out if it exists")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=_store)


def add_run_args(r: argparse.ArgumentParser) -> None:
    r.add_argument("--expert-cache", default="lru", metavar="POLICY[:k=v,...]",
                   help="MoE (expert store): the simulator's expert-cache policy (default lru)")
    r.add_argument("--capacity", type=int, default=2, help="MoE: cache slots per MoE layer (scope layer) or in all")
    r.add_argument("--scope", choices=("layer", "global"), default="layer", help="MoE: cache scope (default layer)")
    r.add_argument("--repeats", type=int, default=1, help="MoE shape mode: runs of the trace, for the repeat spread")
    r.add_argument("--io-threads", type=int, default=4, help="MoE: expert reads in flight (one reader each)")
    r.add_argument("--reads-only", action="store_true",
                   help="MoE shape mode: read the experts without computing them (the I/O path alone)")


def is_expert_store(path: str) -> bool:
    m = Path(path) / "manifest.json"
    try:
        return json.loads(m.read_text()).get("format") == "flashsim-expert-store"
    except (OSError, ValueError, AttributeError):
        return False


def _store(args: argparse.Namespace) -> int:
    from real.weights.expert_store import open_expert_store, random_experts, write_expert_store

    if args.model:
        from real.runtime.moe_model import store_from_hf

        out = store_from_hf(args.model, args.out, args.dtype, overwrite=args.force)
    else:
        from traces.routing import open_routing_trace

        if not args.d_model or not args.d_expert_ff:
            raise FlashsimError("real moe-store --like: give --d-model and --d-expert-ff (the expert shape)")
        t = open_routing_trace(args.like, verify=False)
        m = t.manifest
        out = write_expert_store(args.out, model=m.model, n_layers=m.n_layers, moe_layers=m.moe_layers,
                                 n_experts=m.n_experts, top_k=m.top_k, d_model=args.d_model,
                                 d_expert_ff=args.d_expert_ff, dtype=args.dtype,
                                 experts=random_experts(args.d_model, args.d_expert_ff, args.seed),
                                 source={"kind": "random", "seed": args.seed, "like": str(args.like)},
                                 overwrite=args.force)
    s = open_expert_store(out).summary()
    if args.json:
        print_json(s)
        return 0
    print(f"wrote {out}: {s['moe_layers']} MoE layers x {s['n_experts']} experts, {s['dtype']}, "
          f"{format_bytes(s['expert_bytes'])} per expert ({format_bytes(s['stride_bytes'])} on disk), "
          f"{format_bytes(s['total_bytes'])} in all")
    return 0


def _token_ids(args: argparse.Namespace) -> list[int]:
    from traces.capture.routing import load_moe_folder, prompt_ids

    if not args.text:
        raise FlashsimError("real run --model (MoE): give --text FILE, the text to decode token by token")
    try:
        text = Path(args.text).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise FlashsimError(f"--text {args.text}: cannot read ({e})") from None
    _, tok, cfg = load_moe_folder(args.model)
    return prompt_ids(tok, text, int(cfg.get("vocab_size", 1)), False)[: args.max_tokens]


def run(args: argparse.Namespace, profile: Any) -> int:
    """`real run` on an expert store: shape mode (--trace) or model mode (--model)."""
    from real.runtime.moe_runs import (
        run_shape,
        score,
        simulated_latency_s,
        simulated_model_latency_s,
    )
    from real.weights.expert_store import open_expert_store
    from sim.moe.base import build_cache, parse_cache_arg

    store = open_expert_store(args.store)
    policy, params = parse_cache_arg(args.expert_cache)
    build_cache(policy, params)                  # an unknown policy or parameter: refused before any work
    if args.repeats < 1:
        raise FlashsimError(f"--repeats must be >= 1, got {args.repeats}")
    kw = dict(policy=policy, params=params, capacity=args.capacity, scope=args.scope, threads=args.io_threads)
    check: dict[str, Any] = {}
    if args.trace:
        from traces.routing import open_routing_trace

        t = open_routing_trace(args.trace)
        n = min(args.tokens or t.n_tokens, t.n_tokens)
        experts, weights = np.asarray(t.experts[:n], np.int64), np.asarray(t.weights[:n])
        runs = [run_shape(store, experts, weights, compute=not args.reads_only, **kw) for _ in range(args.repeats)]
        mode = "shape"
    else:
        from real.runtime.moe_model import dense_logits, run_model

        if args.reads_only:
            raise FlashsimError("--reads-only is for shape mode (--trace): model mode needs the experts' outputs")

        ids = _token_ids(args)
        runs = [run_model(args.model, store, ids, **kw) for _ in range(args.repeats)]
        experts = runs[0]["experts"]
        ref = dense_logits(args.model, ids)
        check = {"max_abs_logit_diff_vs_dense": float(np.abs(runs[0]["logits"] - ref).max()),
                 "max_abs_logit": float(np.abs(ref).max()),
                 "same_next_token": bool(np.all(runs[0]["logits"].argmax(1) == ref.argmax(1)))}
        mode = "model"
    if mode == "shape":
        sim_lat, sim_hit = simulated_latency_s(store, experts, profile, policy=policy, params=params,
                                               capacity=args.capacity, scope=args.scope,
                                               compute=not args.reads_only, threads=args.io_threads)
    else:
        sim_lat, sim_hit = simulated_model_latency_s(args.model, store, experts, profile, policy=policy,
                                                     params=params, capacity=args.capacity, scope=args.scope)
    sc = score(runs, sim_lat, warmup=1 if len(sim_lat) > 1 else 0)
    out = {"mode": mode, "store": str(store.path), "policy": policy, "params": params, "capacity": args.capacity,
           "scope": args.scope, "tokens": int(len(sim_lat)), "hit_rate_real": runs[0]["hit_rate"],
           "hit_rate_sim": sim_hit, "direct_io": runs[0]["direct_io"], "profile": profile.name,
           "store_bytes": store.total_bytes, **sc, **check}
    if args.json:
        print_json(out)
        return 0
    print(f"MoE {mode} mode: {store.manifest.model}, {out['tokens']} tokens, expert cache {policy} "
          f"x {args.capacity} slots per {args.scope}, store {format_bytes(store.total_bytes)}, "
          f"{'direct I/O' if out['direct_io'] else 'buffered reads'}")
    rows = [["ms per token", f"{sc['real_ms_per_token']:.2f}", f"{sc['sim_ms_per_token']:.2f}"],
            ["hit rate", f"{out['hit_rate_real']:.3f}", f"{sim_hit:.3f}"],
            ["reads in flight, ms per token", f"{sc['real_read_ms_per_token']:.2f}", "-"],
            ["GB/s while reads in flight", f"{sc['gb_per_s_read']:.2f}", "-"]]
    print_table(["", "real", f"simulated ({profile.name})"], rows, align="lrr")
    spread = "-" if sc["repeat_spread"] is None else f"{sc['repeat_spread']:.1%}"
    what = ("the whole model (its spec from config.json)" if mode == "model" else
            "expert reads only" if args.reads_only else "expert reads and expert compute only")
    print(f"simulator error {sc['error']:+.1%} on the mean token latency; real repeat spread {spread} "
          f"over {sc['repeats']} run(s) (the first token is warm-up, left out); the simulator prices "
          f"{what}")
    if check:
        print(f"logits vs the dense HF forward: max |diff| {check['max_abs_logit_diff_vs_dense']:.2e} "
              f"(max |logit| {check['max_abs_logit']:.3g}); same next token everywhere: {check['same_next_token']}")
    return 0
