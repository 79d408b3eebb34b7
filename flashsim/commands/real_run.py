"""CLI: `flashsim real run`, one policy configuration on the real backend (shape or model mode).

    flashsim real run --store STORE --trace TRACE [--preset P] [--set k=v ...]      (shape mode)
    flashsim real run --store STORE --model smollm2-135m --text FILE [--keep 0.3]  (model mode)
    flashsim real run --store EXPERT_STORE --trace ROUTING_TRACE | --model MOE_FOLDER --text FILE
          --expert-cache lru --capacity 4   (an MoE: real_moe.py)
          [--predictor oracle|previous|lowrank:FILE ...]   (repeat: one row per predictor)
          [--profile this-host] [--dram-budget 200MiB] [--records R.parquet] [--trace-out DIR] [--json]

Registered under `flashsim real` by `register_real(rsub)` (called from flashsim/commands/real.py).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from devices.errors import FlashsimError
from devices.progress import note, phase
from devices.units import format_bytes, parse_bytes
from flashsim.output import output_file, print_json, print_table


def register_real(rsub: argparse._SubParsersAction) -> None:
    r = rsub.add_parser("run", help="run a policy configuration on the real backend (shape or model mode)")
    r.add_argument("--store", required=True, help="weight store (see `flashsim real convert`)")
    src = r.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", help="shape mode: active sets from this trace (the store's shape)")
    src.add_argument("--model", help="model mode: smollm2-135m or a llama-family HF folder (the store's model)")
    r.add_argument("--text", help="model mode: text file to decode token by token (teacher forced)")
    r.add_argument("--max-tokens", type=int, default=64, help="model mode: tokens of --text to run (default 64)")
    r.add_argument("--keep", type=float, default=1.0,
                   help="model mode: fraction of neurons active per token (oracle top-k; 1.0 = dense)")
    r.add_argument("--predictor", action="append", metavar="P",
                   help="model mode: what each token computes: oracle, previous (the previous token's true set) or "
                        "lowrank:FILE.safetensors (`flashsim real train-predictor`); repeat to compare predictors on "
                        "one dense pass (default: the config's predictor slot)")
    r.add_argument("--preset", default="neuroprefetcher", help="policy preset (default neuroprefetcher)")
    r.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE")
    r.add_argument("--profile", default="this-host", help="device profile for the policies' context")
    r.add_argument("--dram-budget", help="DRAM for the model, caches and KV cache, e.g. 200MiB")
    r.add_argument("--tokens", type=int, help="shape mode: decode steps (default: every trace token)")
    r.add_argument("--threads", type=int, help="PyTorch compute threads (default: PyTorch's own setting)")
    r.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"), help="where compute runs")
    r.add_argument("--records", help="write per-token records (the simulator's schema) to this Parquet file")
    r.add_argument("--trace-out", help="write the executed sets as a trace here (replay it with `flashsim replay`)")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    from flashsim.commands.real_moe import add_run_args

    add_run_args(r)
    r.set_defaults(func=_run)


# ---- real run -------------------------------------------------------------------------------------
def _config(args: argparse.Namespace) -> Any:
    from sim.policies.presets import preset_config

    sets = ["workload.prompt_tokens=0", *args.settings]
    if args.dram_budget:
        sets.append(f"memory.dram_budget_bytes={parse_bytes(args.dram_budget, '--dram-budget')}")
    if getattr(args, "tokens", None):
        sets.append(f"workload.tokens={args.tokens}")
    return preset_config(args.preset).with_overrides(sets)


def _run(args: argparse.Namespace) -> int:
    from devices import load_profile
    from real.runtime.run_outputs import write_executed_trace, write_records
    from real.weights.store import open_store

    profile = load_profile(args.profile)
    from flashsim.commands.real_moe import is_expert_store

    if is_expert_store(args.store):                  # an MoE: the expert cache on an expert store
        from flashsim.commands.real_moe import run as run_moe

        return run_moe(args, profile)
    if args.records:
        output_file(args.records, "FILE.parquet", "--records")   # refused before any work
    if args.trace_out:      # a new or empty folder, or a trace an earlier run wrote (replaced)
        from traces.outputs import check_output_dir

        check_output_dir(args.trace_out, "--trace-out", overwrite=True, kind="trace")
    if not Path(args.store).exists():
        raise FlashsimError(f"--store {args.store}: no such weight store (write one with `flashsim real convert`)")
    store = open_store(args.store, verify="record")   # a changed byte since the last check: refused
    cfg = _config(args)
    quality = None
    from real.bench.rapl import RaplMeter

    meter = RaplMeter()
    if meter.unavailable() is None:
        meter.start()
    if args.trace:
        from real.runtime.shape_mode import run_shape
        from traces.format import open_trace

        if args.predictor:
            raise FlashsimError("--predictor is for model mode (--model); shape mode takes --set predictor=...")
        trace = open_trace(args.trace)
        with phase(f"real run (shape mode): {trace.n_tokens} tokens of {args.trace}"):
            run = run_shape(store, trace, profile, cfg, device=args.device, threads=args.threads)
    else:
        if args.predictor and len(args.predictor) > 1:
            if args.records or args.trace_out:
                raise FlashsimError("--records and --trace-out take one --predictor (run each predictor on its own)")
            return _print_comparison(args, _model_runs(args, store, profile, cfg))
        run, quality = _model_runs(args, store, profile, cfg)[0]
    joules = meter.stop() if meter.unavailable() is None else None
    if args.records:
        write_records(args.records, run)
    if args.trace_out:
        write_executed_trace(args.trace_out, run, run.view, store.spec, overwrite=True)
    summary = _summary(run)
    if "model_predictor" in run.config:
        summary["predictor"] = run.config["model_predictor"]
    energy = _energy_comparison(args, meter, joules, run, profile, cfg)
    if args.json:
        print_json({"summary": summary, "quality": quality, "notes": run.notes, "energy": energy,
                    "config": {k: v for k, v in run.config.items() if k != "fixed_parts"}})
        return 0
    print_table(["metric", "value"], [[k, f"{v:.6g}" if isinstance(v, float) else str(v)] for k, v in summary.items()])
    _print_energy(energy)
    if quality:
        print_table(["quality", "value"], [[k, f"{v:.6g}" if isinstance(v, float) else str(v)]
                                           for k, v in quality.items()])
    for n in run.notes:
        print(f"note: {n}")
    return 0


def _energy_comparison(args: argparse.Namespace, meter: Any, joules: dict | None, run: Any, profile: Any,
                       cfg: Any) -> dict[str, Any]:
    """RAPL's measured joules per token beside the simulator's for the same trace, profile and
    configuration (shape mode; model mode: replay the executed trace, --trace-out, to get it)."""
    import numpy as np

    from real.bench.rapl import measured_energy

    token_s = float(np.mean([r.latency_s for r in run.tokens])) if run.tokens else 0.0
    out: dict[str, Any] = {"measured": measured_energy(meter, joules, token_s, len(run.tokens)), "simulated": None}
    if args.trace and profile.energy is not None:
        from sim.engine import simulate
        from sim.metric_names import ENERGY_MJ_PER_TOKEN, JOULES_PER_TOKEN
        from traces.format import open_trace

        s = simulate(open_trace(args.trace), None, profile, cfg).summary()
        mj = s[ENERGY_MJ_PER_TOKEN]
        out["simulated"] = {JOULES_PER_TOKEN: s[JOULES_PER_TOKEN], ENERGY_MJ_PER_TOKEN: mj,
                            "joules_per_token_without_flash": (mj["dram"] + mj["compute"] + mj["static"]) / 1e3,
                            "profile": profile.name}
    elif args.trace:
        out["simulated_reason"] = f"the profile {profile.name} has no energy section"
    else:
        out["simulated_reason"] = "model mode: replay the executed trace (--trace-out) with `flashsim replay`"
    return out


def _print_energy(e: dict[str, Any]) -> None:
    m, s = e["measured"], e["simulated"]
    if not m["available"]:
        print(f"energy measured: not available: {m['reason']}")
    else:
        watts = ", ".join(f"{k} {v:.2f} W" for k, v in m["watts"].items())
        print(f"energy measured (RAPL, {m['covers']}): {1e3 * m['joules_per_token']:.3f} mJ/token ({watts})")
    if s is not None:
        print(f"energy simulated ({s['profile']}): {1e3 * s['joules_per_token']:.3f} mJ/token, "
              f"{1e3 * s['joules_per_token_without_flash']:.3f} without the storage (what RAPL can see)")
    else:
        print(f"energy simulated: {e.get('simulated_reason')}")


def _model_runs(args: argparse.Namespace, store: Any, profile: Any, cfg: Any) -> list[tuple[Any, dict]]:
    """One dense pass, then one real run per --predictor (or one with the config's predictor)."""
    import numpy as np

    from real.runtime.model_mode import check_store_matches, prepare, run_prepared
    from real.runtime.predictors import parse_predictor
    from traces.capture.models import load_hf_model

    if not args.text:
        raise FlashsimError("--model needs --text FILE (the text decoded token by token)")
    text_path = Path(args.text)
    if not text_path.is_file():
        raise FlashsimError(f"--text {args.text}: no such file")
    predictors = args.predictor or [None]
    for p in predictors:
        if p is not None:
            parse_predictor(p)   # bad names and missing files before the model loads
    with phase(f"loading {args.model}"):
        loaded = load_hf_model(args.model, notify=note)
    check_store_matches(store, loaded.spec)
    ids = np.asarray(loaded.tokenizer(text_path.read_text())["input_ids"], np.int64)[: args.max_tokens]
    runs = []
    with tempfile.TemporaryDirectory(prefix="flashsim-run-") as tmp:
        with phase(f"dense reference pass: {len(ids)} tokens"):
            ref = prepare(loaded.model, loaded.spec, store, ids, keep_fraction=args.keep, workdir=tmp)
        for p in predictors:
            with phase(f"real run: {len(ids)} tokens, predictor {p or cfg.predictor.name}"):
                runs.append(run_prepared(ref, loaded.model, loaded.spec, store, profile, cfg, predictor=p,
                                         device=args.device, threads=args.threads))
    return runs


QUALITY_COLUMNS = ("predictor_recall", "predictor_precision", "predicted_fraction", "perplexity", "dense_perplexity",
                   "greedy_agreement", "live_agreement")


def _print_comparison(args: argparse.Namespace, runs: list[tuple[Any, dict]]) -> int:
    """One row per predictor: its set quality, the model's quality and the real run's costs."""
    rows = [{"predictor": q["predictor"], **{k: q.get(k) for k in QUALITY_COLUMNS}, **_summary(run),
             "notes": run.notes} for run, q in runs]
    if args.json:
        print_json({"runs": [{"summary": _summary(run), "quality": q, "notes": run.notes,
                              "config": {k: v for k, v in run.config.items() if k != "fixed_parts"}}
                             for run, q in runs], "comparison": rows})
        return 0

    def f(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    table = [[r["predictor"], f(r["predictor_recall"], ".3f"), f(r["predictor_precision"], ".3f"),
              f(r["predicted_fraction"], ".3f"), f(r["perplexity"], ".2f"), f(r["dense_perplexity"], ".2f"),
              f(r["greedy_agreement"], ".3f"), f(r["live_agreement"], ".3f"), f(r["latency_ms_mean"], ".1f"),
              format_bytes(r["bytes_read_per_token"])] for r in rows]
    print_table(["predictor", "recall", "precision", "computed", "ppl", "dense ppl", "greedy agree",
                 "live agree", "latency ms", "read/token"], table, align="lrrrrrrrrr")
    for r in rows:
        for n in r["notes"]:
            if n.startswith("active sets"):
                print(f"note ({r['predictor']}): {n}")
    return 0


def _summary(run: Any) -> dict[str, Any]:
    import numpy as np

    t = run.tokens
    lat = np.array([r.latency_s for r in t])
    return {"steps": len(t), "latency_ms_mean": float(lat.mean() * 1e3), "latency_ms_p90": float(np.percentile(lat, 90) * 1e3),
            "io_ms_mean": float(np.mean([r.io_s for r in t]) * 1e3),
            "compute_ms_mean": float(np.mean([r.compute_s for r in t]) * 1e3),
            "stall_ms_mean": float(np.mean([r.stall_s for r in t]) * 1e3),
            "bytes_read_per_token": float(np.mean([r.bytes_read for r in t])),
            "cache_bytes_max": format_bytes(max(r.cache_bytes for r in t)),
            "recall": float(np.mean([r.recall for r in t])), "direct_io": run.config["reader"]["direct_io"],
            "policy_bookkeeping_s": run.plan_s}


