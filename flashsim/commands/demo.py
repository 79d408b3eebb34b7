"""`flashsim demo`: the main job (analysis.demo): capture a fresh SmolLM2 trace (or use the shipped
one), replay every preset on jetson-orin-nano-8gb and this-host, plan Llama-3.2-3B on a Jetson Orin
Nano 8 GB, write the HTML report, and print a summary; plus the first-order fit table of every
bundled model on every bundled device. Progress goes to stderr; --json prints the summary object."""

from __future__ import annotations

import argparse
import sys

from analysis.demo import DEMO_DEVICES, DEMO_PLAN, run_demo
from analysis.first_order import estimate_fit
from devices import list_models, list_profiles, load_model, load_profile
from devices.units import format_bytes
from flashsim.output import print_json, print_table
from sim.metric_names import (
    ACTIVATION_MASS_KEPT,
    DRAM_PEAK_BYTES,
    FLASH_BYTES_PER_TOKEN,
    MS_PER_TOKEN,
    TOKENS_PER_S,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="the main job: trace, replay every preset, plan, report")
    p.add_argument("--out", default="out/demo", help="output directory (default ./out/demo)")
    p.add_argument("--quick", action="store_true",
                   help="the shipped trace, fewer budgets and windows, a shorter planning trace (seconds)")
    p.add_argument("--no-capture", action="store_true", help="use the shipped trace instead of capturing one")
    p.add_argument("--workers", type=int, default=None, help="sweep processes (default: the CPU count)")
    p.add_argument("--context", type=int, default=1024,
                   help="KV-cache length of the first-order fit table, in tokens (default 1024)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.set_defaults(func=_demo)


def first_order(context_tokens: int) -> list:
    devices = [load_profile(n) for n in list_profiles()]
    return [estimate_fit(load_model(m, dtype=dt), d, context_tokens=context_tokens)
            for dt in ("fp16", "int4") for m in list_models() for d in devices]


def _demo(args: argparse.Namespace) -> int:
    def note(msg: str) -> None:
        print(f"flashsim demo: {msg}", file=sys.stderr, flush=True)

    summary = run_demo(args.out, quick=args.quick, capture=not args.no_capture, workers=args.workers, note=note)
    estimates = first_order(args.context)
    summary["first_order"] = [{**e.__dict__, "tokens_per_s": e.tokens_per_s} for e in estimates]
    if args.json:
        print_json(summary)
        return 0
    tr = summary["trace"]
    how = (f"captured fresh from the embedded SmolLM2-135M ({tr['prompts']} prompts x {tr['new_tokens_per_prompt']} "
           f"new tokens, {tr['seconds']:.1f} s)" if tr["source"] == "captured"
           else f"the shipped SmolLM2-135M trace ({tr['reason']})")
    print(f"== Trace ==\n{tr['path']}: {how}")
    rep = summary["replay"]
    print(f"\n== Every preset, device DRAM, default parameters ({rep['points']} points swept, "
          f"{rep['errors']} refused) ==")
    rows = []
    for d in DEMO_DEVICES:
        for r in (x for x in rep["rows"] if x["device"] == d):
            if r["status"] == "ok":
                rows.append([d, r["preset"], f"{r[TOKENS_PER_S]:.1f}", f"{r[MS_PER_TOKEN]:.2f}",
                             format_bytes(r[DRAM_PEAK_BYTES]), f"{r[ACTIVATION_MASS_KEPT]:.3f}",
                             format_bytes(int(r[FLASH_BYTES_PER_TOKEN]))])
            else:
                rows.append([d, r["preset"], "-", "-", "-", "-", str(r["error"])[:60]])
    print_table(["device", "preset", "tok/s", "ms/token", "DRAM peak", "mass kept", "flash/token"], rows,
                align="llrrrrr")
    p = summary["plan"]
    q = DEMO_PLAN
    print(f"\n== Plan: {q['model']} on {q['device']}, {format_bytes(q['budget_bytes'])} free, "
          f">= {q['target_tps']:g} tok/s, activation mass kept >= {q['min_quality']:g} ==")
    print(f"trace: {p['trace']}")
    if p.get("quality_floor"):
        print(f"quality floor: {p['quality_floor']}")
    if p["best"]:
        b = p["best"]
        print(f"feasible: yes; best {b['label']}: {b[TOKENS_PER_S]:.2f} tok/s, DRAM "
              f"{format_bytes(b[DRAM_PEAK_BYTES])}, mass kept {b[ACTIVATION_MASS_KEPT]:.3f}, "
              f"bound by {b['binding_constraint']}")
    else:
        print(f"feasible: no; bound by {p['binding_constraint']}")
    md = p["min_dram_bytes"]
    print("smallest DRAM meeting the target: "
          + (f"{format_bytes(md)} ({p['min_dram_configuration']})" if md is not None else "none"))
    print(f"Pareto front: {', '.join(p['pareto']) or 'empty'}")
    print(f"full plan: {p['file']} (flashsim plan --model {q['model']} --device {q['device']} prints it)")
    first_order_table(estimates, args.context)
    print(f"\n== Report ==\n{summary['report']}")
    t = summary["timings_s"]
    print(f"(trace {t['trace_s']:.1f} s, replay {t['replay_s']:.1f} s, plan {t['plan_s']:.1f} s, "
          f"report {t['report_s']:.1f} s; total {t['total_s']:.1f} s)")
    return 0


def first_order_table(estimates: list, context: int) -> None:
    """The foundation's first-order roofline fit table: every bundled model on every bundled device."""
    names = list_profiles()
    half = len(estimates) // 2
    for dt, chunk in (("fp16", estimates[:half]), ("int4", estimates[half:])):
        print(f"\n== First-order fit, {dt} weights, KV cache of {context} tokens ==")
        print("   fits: all weights in DRAM; streams-ffn: FFN partly read from flash every token (dense);")
        print("   tok/s is a roofline bound over bytes; the replay and plan above simulate sparse policies.")
        rows = []
        for m in list_models():
            row: list[str] = [m]
            for name in names:
                e = next(x for x in chunk if x.model == m and x.device == name)
                if e.verdict == "does-not-fit":
                    row.append("no fit")
                else:
                    row.append(f"{e.tokens_per_s:.1f}{'' if e.verdict == 'fits' else '*'}")
            rows.append(row)
        print_table(["tok/s (* = streams FFN)"] + names, rows, align="l" + "r" * len(names))
