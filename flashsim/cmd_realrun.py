"""CLI: run policies on the real backend and validate the simulator against it.

    flashsim real run --store STORE --trace TRACE [--preset P] [--set k=v ...]      (shape mode)
    flashsim real run --store STORE --model smollm2-135m --text FILE [--keep 0.3]  (model mode)
          [--predictor oracle|previous|lowrank:FILE ...]   (repeat: one row per predictor)
          [--profile this-host] [--dram-budget 200MiB] [--records R.parquet] [--trace-out DIR] [--json]
    flashsim validate [--quick] [--json] [--plot DIR] [--profile NAME|YAML] [--tokens N] [--seed S]
                      [--modes shape,model]

`real run` is registered under `flashsim real` by `register_real(rsub)` (called from
flashsim/cmd_real.py); `validate` is a top-level verb registered here.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from devices.errors import FlashsimError
from devices.units import format_bytes, parse_bytes
from flashsim.output import output_file, print_json, print_table

# validate's options that shape the real runs: a rescore runs none, so it refuses them rather than ignore them
KEPT_PROFILE = "kept"
RUN_OPTIONS = ("quick", "tokens", "seed", "workdir", "threads", "modes", "repeats", "check_every", "keep",
               "recalibrate_every")


def register(sub: argparse._SubParsersAction) -> None:
    v = sub.add_parser("validate", help="run a grid of configurations on the real backend and report the "
                                        "simulator's error against it")
    v.add_argument("--quick", action="store_true", help="a 20-configuration subset (12 shape, 8 model), 12 steps each")
    v.add_argument("--json", action="store_true", help="print one JSON object")
    v.add_argument("--plot", metavar="DIR", help="write a sim-vs-real scatter plot (PNG) into DIR")
    v.add_argument("--profile", default="this-host", help="device profile the simulator replays with "
                                                         "(name or YAML, e.g. one written by `flashsim bench`); "
                                                         f"with --rescore, `{KEPT_PROFILE}` replays each grid on "
                                                         "the profile it was validated with")
    v.add_argument("--tokens", type=int, help="decode steps per configuration (default 12 quick, 24 full)")
    v.add_argument("--seed", type=int, default=0, help="seed of the store, trace and compute inputs")
    v.add_argument("--workdir", help="folder for the temporary store and traces (default: system temp)")
    v.add_argument("--threads", type=int, help="PyTorch compute threads of the real runs (default: the profile's "
                                               "compute.threads, the count its rates were measured at; 1 if none)")
    v.add_argument("--modes", default="shape,model", help="shape (random-weight store of a small llama shape), model "
                                                        "(SmolLM2 token by token, its real FFN weights), or both (default)")
    v.add_argument("--repeats", type=int, default=3,
                   help="real runs per configuration, as interleaved passes over the whole grid (default 3, also "
                        "with --quick); each pass is scored against the mean of the others, the host's repeat "
                        "spread the simulator's error is judged against (floor); 1 skips it")
    v.add_argument("--check-every", type=float, metavar="S",
                   help="seconds between the host checks that drift_corrected replays at (default 10; 0 = after "
                        "every real run, so each run sits between two checks: ~1.2 s per check)")
    v.add_argument("--recalibrate-every", type=float, metavar="S",
                   help="calibrate the host (the full bench flash + bench compute at the runs' threads, ~5 min "
                        "each, also with --quick) at the start, after every S seconds of real runs and at the end, and "
                        "score against the calibrations' mean instead of --profile (for a shared host whose speed "
                        "moves over minutes; the errors against --profile are reported too)")
    v.add_argument("--keep", metavar="DIR", help="keep the executed traces and every real run's per-token records in "
                                                 "this new folder, to score other profiles against them later (--rescore)")
    v.add_argument("--rescore", metavar="DIR", nargs="+",
                   help="run nothing: replay a grid kept with --keep on --profile and report its errors against the "
                        "kept real runs (seconds, not minutes); several DIRs: each grid's errors, their spread, and "
                        "the groups pooled over all of them")
    v.set_defaults(func=_validate, run_option_defaults={name: v.get_default(name) for name in RUN_OPTIONS})


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
    r.set_defaults(func=_run)


# ---- real run -------------------------------------------------------------------------------------
def _config(args: argparse.Namespace) -> Any:
    from sim.policies.presets import preset_config

    sets = ["workload.prompt_tokens=0", *args.settings]
    if args.dram_budget:
        sets.append(f"memory.dram_budget_bytes={parse_bytes(args.dram_budget)}")
    if getattr(args, "tokens", None):
        sets.append(f"workload.tokens={args.tokens}")
    return preset_config(args.preset).with_overrides(sets)


def _run(args: argparse.Namespace) -> int:
    from devices import load_profile
    from real.records import write_executed_trace, write_records
    from real.store import open_store

    profile = load_profile(args.profile)
    if args.records:
        output_file(args.records, "FILE.parquet", "--records")   # refused before any work
    if not Path(args.store).exists():
        raise FlashsimError(f"--store {args.store}: no such weight store (write one with `flashsim real convert`)")
    store = open_store(args.store, verify="record")   # a changed byte since the last check: refused
    cfg = _config(args)
    quality = None
    from real.rapl import RaplMeter

    meter = RaplMeter()
    if meter.unavailable() is None:
        meter.start()
    if args.trace:
        from real.shape_mode import run_shape
        from traces.format import open_trace

        if args.predictor:
            raise FlashsimError("--predictor is for model mode (--model); shape mode takes --set predictor=...")
        run = run_shape(store, open_trace(args.trace), profile, cfg, device=args.device, threads=args.threads)
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

    from real.rapl import measured_energy

    token_s = float(np.mean([r.latency_s for r in run.tokens])) if run.tokens else 0.0
    out: dict[str, Any] = {"measured": measured_energy(meter, joules, token_s, len(run.tokens)), "simulated": None}
    if args.trace and profile.energy is not None:
        from sim.engine import simulate
        from traces.format import open_trace

        s = simulate(open_trace(args.trace), None, profile, cfg).summary()
        mj = s["energy_mj_per_token"]
        out["simulated"] = {"joules_per_token": s["joules_per_token"], "energy_mj_per_token": mj,
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

    from real.model_mode import check_store_matches, prepare, run_prepared
    from real.predictors import parse_predictor
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
    loaded = load_hf_model(args.model, notify=lambda m: print(f"note: {m}", file=sys.stderr))
    check_store_matches(store, loaded.spec)
    ids = np.asarray(loaded.tokenizer(text_path.read_text())["input_ids"], np.int64)[: args.max_tokens]
    with tempfile.TemporaryDirectory(prefix="flashsim-run-") as tmp:
        ref = prepare(loaded.model, loaded.spec, store, ids, keep_fraction=args.keep, workdir=tmp)
        return [run_prepared(ref, loaded.model, loaded.spec, store, profile, cfg, predictor=p, device=args.device,
                             threads=args.threads) for p in predictors]


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


# ---- validate -------------------------------------------------------------------------------------
def _validate(args: argparse.Namespace) -> int:
    from devices import load_profile
    from real.validate import parse_modes, run_validation

    if args.tokens is not None and args.tokens < 4:
        raise FlashsimError(f"--tokens {args.tokens}: need at least 4 steps (2 are warm-up)")
    if args.threads is not None and args.threads < 1:
        raise FlashsimError(f"--threads {args.threads}: give at least 1 compute thread (or omit it: the profile's count)")
    if args.repeats < 1:
        raise FlashsimError(f"--repeats {args.repeats}: give 1 or more real runs per configuration")
    if args.rescore is not None:
        return _rescore(args)
    modes = parse_modes(args.modes)
    if args.profile == KEPT_PROFILE:
        raise FlashsimError(f"--profile {KEPT_PROFILE}: only with --rescore DIR (the profile a kept grid was "
                            "validated with); give a profile name or YAML file")
    profile = load_profile(args.profile)
    report = run_validation(profile, quick=args.quick, tokens=args.tokens, seed=args.seed, workdir=args.workdir,
                            progress=validate_progress(args.json), threads=args.threads, modes=modes,
                            repeats=args.repeats, check_every_s=args.check_every, keep=args.keep,
                            recalibrate_every_s=args.recalibrate_every)
    return print_validation(report, args.json, args.plot)


def _rescore(args: argparse.Namespace) -> int:
    from devices import load_profile
    from real.validate_keep import rescore

    given = [name for name, default in args.run_option_defaults.items() if getattr(args, name) != default]
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise FlashsimError(f"{flag} with --rescore: a rescore runs nothing, it replays the kept grid as it ran; "
                            f"drop {flag}")
    # `--profile kept`: each grid on the profile it was validated with (its profile.yaml)
    profile = None if args.profile == KEPT_PROFILE else load_profile(args.profile)
    if len(args.rescore) == 1:
        report = rescore(args.rescore[0], profile, progress=validate_progress(args.json))
        return print_validation(report, args.json, args.plot)
    if args.plot:
        raise FlashsimError("--plot with several --rescore folders: plot one kept grid at a time "
                            "(flashsim validate --rescore DIR --plot OUT)")
    from real.validate_keep import rescore_many

    many = rescore_many(args.rescore, profile, progress=validate_progress(args.json))
    if args.json:
        print_json(many)
        return 0
    print_rescore_many(many)
    return 0


def _pct(x: float | None, sign: str = "") -> str:
    return "n/a" if x is None else f"{x:{sign}.1%}"


def _alone(rep: dict) -> str:
    """One metric's real.validate_score.repeatability entry in words."""
    sim, rest = rep["simulator"], rep["other_passes"]
    return (f"the simulator's latency error median {_pct(sim['median'])}, p90 {_pct(sim['p90'])}; the other passes' "
            f"mean's median {_pct(rest['median'])}, p90 {_pct(rest['p90'])} (the host's repeatability)")


def print_convergence(conv: dict | None) -> None:
    """real.validate_score.convergence of the latency, as a table: the simulator against the mean of
    n passes, then the estimate for unlimited passes."""
    if not conv:
        return
    rows = [[f"mean of {c['passes']} pass{'es' if c['passes'] > 1 else ''}", c["configs"], _pct(c["median"]),
             _pct(c["p90"])] for c in conv["by_passes"]]
    left = conv["unlimited"]
    rows.append(["unlimited passes (estimate: error^2 less the mean's variance)", "", _pct(left["median"]),
                 _pct(left["p90"])])
    print_table(["simulator's latency error against", "configs", "median", "p90"], rows, align="lrrr")
    print("more --repeats narrow the error towards the last row; what stays there is the model's and the "
          "calibration's (the host while calibrated against its average over the passes)")


def print_level_removed(level: dict | None) -> None:
    """real.validate_score.level_removed in words (a diagnostic, not the score)."""
    if not level:
        return
    print(f"with its level taken out (simulated / real per mode: "
          f"{', '.join(f'{m} {f:.3f}' for m, f in level['factor'].items())}), the simulator's latency error would be "
          f"median {_pct(level['median'])}, p90 {_pct(level['p90'])}, max {_pct(level['max'])}: a diagnostic, not the "
          "score (the level is the calibration's moment; what is left, the model's shape and the host's scatter)")


def print_between_grids(between: dict | None) -> None:
    """real.validate_score.between_grids: the real runs of one grid against another's, per pair."""
    if not between:
        return
    print("the host against itself: each pair of grids' real latency means on the configurations they share "
          "(how much slower the slower grid ran each), raw and after one factor per mode")
    print_table(["grid a", "grid b", "configs", "b / a per mode", "raw median", "p90", "after the factor: median", "p90",
                 "each grid's share (/ sqrt 2): median", "p90"],
                [[Path(p["a"]).name, Path(p["b"]).name, p["n_configs"],
                  ", ".join(f"{m} {f:.3f}" for m, f in p["factor"].items()), _pct(p["raw"]["median"]),
                  _pct(p["raw"]["p90"]), _pct(p["scaled"]["median"]), _pct(p["scaled"]["p90"]),
                  _pct(p["share_median"]), _pct(p["share_p90"])] for p in between["pairs"]],
                align="lllrrrrrrr")
    s = between["summary"]
    print(f"over the {len(between['pairs'])} pairs, after the factor: median {_pct(s['scaled_median']['median'])} "
          f"({_pct(s['scaled_median']['min'])}-{_pct(s['scaled_median']['max'])}), p90 "
          f"{_pct(s['scaled_p90']['median'])} ({_pct(s['scaled_p90']['min'])}-{_pct(s['scaled_p90']['max'])}): "
          "two measurements of the same configurations disagree by this much, so a simulator calibrated once "
          "cannot score closer than about this over /sqrt(2) against each")


def print_rescore_many(many: dict) -> None:
    """One profile on several kept grids (real.validate_keep.rescore_many): a row per grid, the
    spread over the grids, the groups pooled."""
    print(f"profile {many['profile']} on {many['n_grids']} kept grids ({many['n_configs']} configurations), "
          f"{many['wall_s']:.0f} s")
    print_table(["kept grid", "configs", "passes", "latency error median", "p90", "max", "real spread median", "p90",
                 "one pass: simulator median", "p90", "other passes median", "p90", "unlimited passes median", "p90",
                 "level removed median", "p90"],
                [[g["rescored_from"], g["n_configs"], g["repeats"], _pct(g["latency_error_median"]),
                  _pct(g["latency_error_p90"]), _pct(g["latency_error_max"]), _pct(g["noise_latency_median"]),
                  _pct(g["noise_latency_p90"]), _pct(g["pass_latency_error_median"]), _pct(g["pass_latency_error_p90"]),
                  _pct(g["rest_latency_error_median"]), _pct(g["rest_latency_error_p90"]),
                  _pct(g["unlimited_latency_error_median"]), _pct(g["unlimited_latency_error_p90"]),
                  _pct(g["level_removed_latency_error_median"]), _pct(g["level_removed_latency_error_p90"])]
                 for g in many["grids"]],
                align="lrrrrrrrrrrrrrrr")
    med, p90 = many["latency_error_median"], many["latency_error_p90"]
    print(f"over the {many['n_grids']} grids: latency error median {_pct(med['median'])} ({_pct(med['min'])}-"
          f"{_pct(med['max'])}), p90 {_pct(p90['median'])} ({_pct(p90['min'])}-{_pct(p90['max'])})")
    alone = many["repeatability"].get("latency_s")
    if alone:
        print(f"each real pass alone, pooled: {_alone(alone)}")
    print_convergence(many.get("convergence", {}).get("latency_s"))
    print_between_grids(many.get("between_grids"))
    groups = many["per_group"]
    head, phases = _phase_columns(groups)
    print_table(["group, pooled over the grids (sim - real)", "configs", "latency signed median", "quartiles",
                 "I/O signed median", "compute signed median", *head, "one pass: simulator", "other passes"],
                [[f"{g['mode']}, {'bundled' if g['bundled'] else 'unbundled'}, prefetch {g['prefetch']}",
                  g["n_configs"], _pct(g["latency_signed_median"], "+"),
                  f"{_pct(g['latency_signed_q25'], '+')} to {_pct(g['latency_signed_q75'], '+')}",
                  _pct(g["io_signed_median"], "+"), _pct(g["compute_signed_median"], "+"), *phases(g),
                  _pct(g["pass_latency_error_median"]), _pct(g["rest_latency_error_median"])]
                 for g in groups], align="l" + "r" * (7 + len(head)))


def _phase_columns(groups: list[dict]) -> tuple[list[str], Any]:
    """The group tables' columns for the compute's two phases (real.validate_score.per_group), only
    when some group has them (grids kept before the records carried them have none)."""
    keys = ("ffn_compute_signed_median", "other_compute_signed_median")
    if not any(g.get(k) is not None for g in groups for k in keys):
        return [], lambda g: []
    return ["FFN compute signed median", "other compute signed median"], lambda g: [_pct(g.get(k), "+") for k in keys]


def validate_progress(quiet: bool) -> Any:
    def progress(i: int, n: int, label: str, err: float) -> None:
        if not quiet:
            print(f"[{i}/{n}] {label}: latency error {err:.1%}", file=sys.stderr, flush=True)

    return progress


def print_floor(floor: dict | None) -> None:
    """real.validate_score.floor as a table: the simulator's error beside the host's repeat spread
    per metric, and the pass line."""
    if not floor or not floor.get("metrics"):
        return
    names = {"latency_s": "total per token", "io_s": "I/O", "compute_s": "compute"}
    print_table(["metric (each real pass alone)", "sim error p50", "p90", "real repeat p50", "p90", "excess p50", "p90",
                 "pass"],
                [[names.get(m, m), _pct(v["sim_error_p50"]), _pct(v["sim_error_p90"]), _pct(v["real_repeat_p50"]),
                  _pct(v["real_repeat_p90"]), _pct(v["excess_p50"], "+"), _pct(v["excess_p90"], "+"),
                  "yes" if v["pass"] else "no"] for m, v in floor["metrics"].items()], align="lrrrrrrl")
    excluded = floor.get("excluded_configs") or []
    seen = (f"{len(excluded)} configuration(s) the calibration measured left out: {', '.join(excluded)}" if excluded
            else "no configuration of the grid was among the calibration's measurements")
    print(f"{'PASS' if floor['pass'] else 'FAIL'} on {floor['n_configs']} configurations ({floor['rule']}); {seen}"
          + ("" if floor["metrics"].get("latency_s", {}).get("real_repeat_p50") is not None
             else "; one pass per configuration: no repeat spread measured, the fixed targets alone apply"))


def print_validation(report: dict, as_json: bool, plot: str | None) -> int:
    """The validate report: JSON, or one error table over all configurations and one per mode."""
    from real.validate import scatter_plot

    if plot:
        report["plots"] = [str(p) for p in scatter_plot(report, plot)]
    if as_json:
        print_json(report)
        return 0
    counts = ", ".join(f"{m}: {v['n_configs']}" for m, v in report["per_mode"].items())
    print(f"{report['n_configs']} configurations ({counts}), "
          f"{report['tokens']} steps each, profile {report['profile']}, direct I/O {'yes' if report['direct_io'] else 'no'}, "
          f"{report['wall_s']:.0f} s")
    if report.get("rescored_from"):
        print(f"rescored: the real runs kept in {report['rescored_from']} ({report['repeats']} per configuration, "
              f"validated with profile {report['validated_with_profile']}) against the simulator on {report['profile']}"
              f"{' (the profile kept with them)' if report.get('profile_kept') else ''}")
    elif report.get("kept"):
        print(f"kept the executed traces and real runs in {report['kept']} (score another profile: "
              f"flashsim validate --rescore {report['kept']} --profile P, or --profile kept for this one)")
    print_floor(report.get("floor"))
    tables = [("all", report)] + (list(report["per_mode"].items()) if len(report["per_mode"]) > 1 else [])
    for name, summary in tables:
        noise = summary.get("noise_floor", {})
        rows = [[m, f"{v['median']:.1%}", f"{v['p90']:.1%}", f"{v['max']:.1%}"]
                + ([f"{noise[m]['median']:.1%}", f"{noise[m]['p90']:.1%}"] if m in noise else [])
                for m, v in summary["per_metric"].items()]
        head = [f"metric ({name})", "median error", "p90", "max"]
        print_table(head + (["real spread median", "p90"] if noise else []), rows)
    alone = report.get("repeatability")
    if not alone and not report.get("rescored_from"):
        print("one real run per configuration: with --repeats 2 or more the report also scores each run alone, by "
              "the simulator and by the other runs (how closely this host repeats itself)")
    if alone:
        print_table(["each real pass alone (leave one out)", "simulator median error", "p90", "other passes' mean median",
                     "p90"],
                    [[m, _pct(v["simulator"]["median"]), _pct(v["simulator"]["p90"]), _pct(v["other_passes"]["median"]),
                      _pct(v["other_passes"]["p90"])] for m, v in alone.items()], align="lrrrr")
    print_convergence(report.get("convergence", {}).get("latency_s"))
    print_level_removed(report.get("level_removed"))
    groups = report.get("per_group") or []
    if groups:
        head, phases = _phase_columns(groups)
        print_table(["group (sim - real: > 0 = simulated slow)", "configs", "latency signed median", "|error| median",
                     "p90", "I/O signed median", "compute signed median", *head, "drift-corrected median",
                     "one pass: simulator", "other passes"],
                    [[f"{g['mode']}, {'bundled' if g['bundled'] else 'unbundled'}, prefetch {g['prefetch']}",
                      g["n_configs"], _pct(g["latency_signed_median"], "+"), _pct(g["latency_error_median"]),
                      _pct(g["latency_error_p90"]), _pct(g["io_signed_median"], "+"),
                      _pct(g["compute_signed_median"], "+"), *phases(g), _pct(g["drift_corrected_median"]),
                      _pct(g["pass_latency_error_median"]), _pct(g["rest_latency_error_median"])]
                     for g in groups], align="l" + "r" * (9 + len(head)))
    drift = report.get("drift") or {}
    if drift:
        def ratio(x: float | None) -> str:
            return "n/a" if x is None else f"{x:.2f}x"

        from real.drift import READ_KEYS, WIDTH_KEYS

        def reads(c: dict) -> str:    # the read-size checks, when measured
            r = [f"{key[5:]} {ratio(c[key])}" for key in READ_KEYS.values() if key in c]
            return f", reads {' '.join(r)}" if r else ""

        def widths(c: dict) -> str:   # the GEMV width checks, when measured
            r = [f"{key[4:]} {ratio(c[key])}" for key in WIDTH_KEYS.values() if key in c]
            return f" (in_features {' '.join(r)})" if r else ""

        print("host vs profile (measured / profiled time): " + "; ".join(
            f"{when} disk {ratio(c.get('disk'))}, after I/O {ratio(c.get('after_io'))}, cpu {ratio(c.get('cpu'))}"
            f"{widths(c)}{reads(c)}" for when, c in drift.items()))
    rc = report.get("recalibration")
    if rc:
        g = rc["given_profile"]
        print(f"scored against the mean of {len(rc['calibrations'])} calibrations of this host, taken at "
              + ", ".join(f"{c['start_s']:.0f}-{c['end_s']:.0f} s" for c in rc["calibrations"])
              + f" (every {rc['every_s']:g} s of real runs); against the given profile: latency error median "
              f"{g['latency_error_median']:.1%}, p90 {g['latency_error_p90']:.1%}, max {g['latency_error_max']:.1%}")
    dc = report.get("drift_corrected")
    if dc:
        print(f"replayed on the profile as {dc['checks']} host checks found it during each run (mean disk "
              f"{dc['disk_ratio']:.2f}x, after I/O {dc['after_io_ratio']:.2f}x, cpu {dc['cpu_ratio']:.2f}x): "
              f"latency error median {dc['latency_error_median']:.1%}, p90 {dc['latency_error_p90']:.1%}, "
              f"max {dc['latency_error_max']:.1%} (a diagnostic on the profile as given"
              f"{'' if rc else ', which the errors above use'})")
    model = report["per_mode"].get("model")
    if model and model.get("quality"):
        q = model["quality"]
        print(f"model mode: {model['model']}, active sets {model['active_sets']}, keep {model['keep_fraction']:g}: greedy "
              f"agreement {q['greedy_agreement']:.3f}, perplexity {q['perplexity']:.2f} (dense {q['dense_perplexity']:.2f})")
    for p in report.get("plots", []):
        print(f"wrote {p}")
    return 0
