"""`flashsim demo`: the main job. Today: the device and model tables and a first-order fit estimate
of every bundled model on every bundled device (fp16 and int4)."""

from __future__ import annotations

import argparse

from analysis.first_order import estimate_fit
from devices import list_models, list_profiles, load_model, load_profile
from devices.units import format_bytes
from sim.cli.cmd_catalog import _devices_list, _models_list
from sim.cli.output import print_json, print_table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="the main job on the bundled devices and models")
    p.add_argument("--context", type=int, default=1024, help="KV-cache length in tokens (default 1024)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    devices = [load_profile(n) for n in list_profiles()]
    estimates = [
        estimate_fit(load_model(m, dtype=dt), d, context_tokens=args.context)
        for dt in ("fp16", "int4") for m in list_models() for d in devices
    ]
    if args.json:
        print_json([{**e.__dict__, "tokens_per_s": e.tokens_per_s} for e in estimates])
        return 0
    print("== Devices ==")
    _devices_list(argparse.Namespace(json=False))
    print("\n== Models (fp16) ==")
    _models_list(argparse.Namespace(json=False, dtype="fp16"))
    for dt, chunk in (("fp16", estimates[: len(estimates) // 2]), ("int4", estimates[len(estimates) // 2:])):
        print(f"\n== First-order fit, {dt} weights, KV cache of {args.context} tokens ==")
        print("   fits: all weights in DRAM; streams-ffn: FFN partly read from flash every token (dense);")
        print("   tok/s is a roofline bound over bytes; `flashsim replay` simulates sparse policies.")
        names = [d.name for d in devices]
        rows = []
        for m in list_models():
            row: list[str] = [m]
            for name in names:
                e = next(x for x in chunk if x.model == m and x.device == name)
                if e.verdict == "does-not-fit":
                    row.append("no fit")
                else:
                    tag = "" if e.verdict == "fits" else "*"
                    row.append(f"{e.tokens_per_s:.1f}{tag}")
            rows.append(row)
        print_table(["tok/s (* = streams FFN)"] + names, rows, align="l" + "r" * len(names))
    biggest = max(devices, key=lambda d: d.available_bytes)
    print(f"\n(largest DRAM available: {biggest.name}, {format_bytes(biggest.available_bytes)})")
    return 0
