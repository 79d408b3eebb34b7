"""`flashsim models show` for a Mixture-of-Experts spec, and the MoE table of `flashsim models`."""

from __future__ import annotations

import argparse

from devices.moe_spec import MoESpec, list_moe_models, load_moe_model
from devices.units import format_bytes
from flashsim.output import print_json, print_table


def show_moe(args: argparse.Namespace) -> int:
    s = load_moe_model(args.name)
    d = s.summary(args.dtype)
    if args.json:
        print_json(d)
        return 0
    print(f"{s.name} ({s.family} MoE, {s.total_params / 1e9:.2f}B parameters, "
          f"{s.active_params_per_token() / 1e9:.2f}B active per token, experts at {d['dtype']})")
    print(f"  source: {s.source}")
    kinds = ", ".join(f"{n} {k}" for k, n in d["layer_kinds"].items())
    print(f"  layers                 {s.n_layers} ({kinds}); {s.n_moe_layers} with routed experts "
          f"(first: {s.moe_layers[0]})")
    print(f"  experts                {s.n_experts} routed, top-{s.top_k}, {s.n_shared_experts} shared; "
          f"d_model {s.d_model}, expert d_ff {s.d_expert_ff}")
    print("  bytes of one routed expert (gate+up+down), one contiguous read:")
    for k, v in d["expert_bytes"].items():
        print(f"    {k:8s} {v:>14,d}  ({format_bytes(v)})")
    for k in ("routed_bytes", "resident_bytes", "total_bytes", "active_expert_bytes_per_token",
              "kv_bytes_per_token_fp16", "state_bytes_fp32"):
        print(f"  {k:30s} {d[k]:>18,d}  ({format_bytes(d[k])})")
    print(f"  {'active_params_per_token':30s} {d['active_params_per_token']:>18,d}")
    return 0


def moe_table(dtype: str | None) -> None:
    specs: list[MoESpec] = [load_moe_model(n) for n in list_moe_models()]
    rows = [[s.name, s.family, f"{s.total_params / 1e9:.1f}B", f"{s.active_params_per_token() / 1e9:.2f}B",
             s.n_moe_layers, s.n_experts, f"{s.top_k}+{s.n_shared_experts}", dtype or s.dtype,
             format_bytes(s.expert_bytes(dtype or s.dtype)), format_bytes(s.resident_bytes(dtype or s.dtype))]
            for s in specs]
    print()
    print_table(["MoE model", "family", "params", "active", "MoE layers", "experts", "top-k+shared", "dtype",
                 "expert", "resident"], rows, align="llrrrrrlrr")
