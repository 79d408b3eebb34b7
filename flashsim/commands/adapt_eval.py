"""`flashsim adapt eval`: every controller under every budget and timeline, as one comparison table.

    flashsim adapt eval [--model smollm2-135m] [--trace DIR] [--device NAME] [--gsi FILE]
                        [--budgets 0.8,0.6] [--timelines SPEC[;SPEC...]] [--controllers A,B,...]
                        [--weights FILE] [--quality estimate|real] [--batch B] [--prompt-tokens P]
                        [--tokens N] [--decide-every N] [--static-ratio R] [--headroom H]
                        [--json] [--plot DIR]

Each (controller, budget or timeline) pair is one episode (adapt/episode.py): the decode phase of
the workload replayed against the memory timeline, the time of every step from the simulator
(`dense` preset + `prune.blocks`, on --device), the footprint from sim.blocks.BlockMemory, the quality
from the GSI file's estimate (adapt/drop_quality.py) or, with `--quality real`, measured on the real
model with the dropped blocks skipped (real.studies.pruning.skipped_blocks, one pass per distinct set over the
GSI file's calibration text; needs torch). Budgets and timeline sizes are
fractions of the full need (all weights + the KV cache at the workload's last step) unless given with
a unit; timeline syntax: adapt/timelines.py.

A controller "fails" an episode when it exceeds the budget at any step (violations > 0); the static
baselines are allowed to, every other controller must not. The learned controller runs when its
module and weights exist (--weights, or the shipped adapt/data/learned-<model>.safetensors);
otherwise the output says why it was skipped.

--json prints one object:
  model, device, trace, gsi {path, model, steps, blocks, dense_ppl}, quality ("estimate" | "real"),
  workload {batch, prompt_tokens, decode_tokens, kv_tokens_max}, decide_every,
  full_need_bytes (weights + KV at the last step, nothing dropped), always_bytes (never dropped),
  horizon_s (the episode's simulated duration with nothing dropped), simulator_runs,
  controllers (names run), skipped {name: reason},
  timelines [{label, kind, min_bytes, max_bytes, changes}],
  rows [{controller, timeline, status ("ok" | "FAIL" | "FAIL (allowed)"), violations (steps over
        budget), max_over_bytes, ppl (exp of the mean log perplexity over steps), worst_ppl,
        tokens_per_s, duration_s, mean_dropped, decisions, changes, peak_footprint_bytes, decide_us,
        steps}],
  figures [paths] and records (CSV path) with --plot.
"""

from __future__ import annotations

import argparse
import hashlib
import os
from pathlib import Path
from typing import Any

from devices.errors import FlashsimError
from devices.progress import Stage, note, phase
from flashsim.output import print_json, print_table
from traces.outputs import replace_output

DEFAULT_DEVICE = "jetson-orin-nano-8gb"
DEFAULT_BUDGETS = "0.8,0.6"
# The timelines: a co-runner arrives and stays (step), one that grows and restarts (sawtooth),
# and random arrivals (bursts); each relative to the full need and the dense episode's duration.
DEFAULT_TIMELINES = ("step:t=30%,from=1.0,to=0.6;sawtooth:period=40%,low=0.6,high=1.0;"
                     "bursts:seed=3,rate=6,depth=0.2,dur=15%,base=1.0")
STATIC = ("static-ratio", "static-window")


def register(asub: argparse._SubParsersAction) -> None:
    from adapt.controllers import CONTROLLER_NAMES, DEFAULT_CONTROLLERS
    from adapt.episode import Workload

    w = Workload()
    p = asub.add_parser(
        "eval", help="compare adaptation controllers under memory budgets and timelines",
        description="Replay memory budgets and timelines with each controller: violations, perplexity, "
        "tok/s (docs/adapt.md).")
    p.add_argument("--model", help="model whose blocks are pruned (default: the trace's model)")
    p.add_argument("--trace", help="trace directory for the simulator's timing (default: the shipped "
                   "smollm2-135m trace)")
    p.add_argument("--device", default=DEFAULT_DEVICE, help=f"device profile (default {DEFAULT_DEVICE})")
    p.add_argument("--gsi", metavar="FILE", help="GSI file (default: the shipped one for the model, "
                   "adapt/data/<model>.gsi.json)")
    p.add_argument("--budgets", default=DEFAULT_BUDGETS, metavar="B,B",
                   help=f"constant budgets: fractions of the full need, N%% or sizes (default {DEFAULT_BUDGETS}; "
                   "'' for none)")
    p.add_argument("--timelines", action="append", metavar="SPEC[;SPEC]",
                   help="memory timelines, ';'-separated or repeated (default: step, sawtooth, bursts; "
                   "'' for none); syntax in docs/adapt.md")
    p.add_argument("--controllers", default=",".join(DEFAULT_CONTROLLERS), metavar="A,B",
                   help=f"of {', '.join(CONTROLLER_NAMES)} (default {','.join(DEFAULT_CONTROLLERS)})")
    p.add_argument("--weights", metavar="FILE.safetensors", help="learned controller weights "
                   "(default: the shipped file, when there is one)")
    p.add_argument("--quality", choices=("estimate", "real"), default="estimate",
                   help="perplexity from the GSI estimate, or measured on the real model (needs torch)")
    p.add_argument("--batch", type=int, default=w.batch, help=f"sequences decoded together (default {w.batch})")
    p.add_argument("--prompt-tokens", type=int, default=w.prompt_tokens,
                   help=f"prompt tokens per sequence (default {w.prompt_tokens})")
    p.add_argument("--tokens", type=int, default=w.decode_tokens,
                   help=f"decode steps per episode (default {w.decode_tokens})")
    p.add_argument("--decide-every", type=int, default=8, metavar="N",
                   help="decision point every N decode steps, besides budget changes and KV overflow (default 8)")
    p.add_argument("--static-ratio", type=float, default=0.25, metavar="R",
                   help="fraction of blocks static-ratio drops (default 0.25)")
    p.add_argument("--headroom", type=float, default=None, metavar="H",
                   help="heuristic restore hysteresis: restore only below (1-H) x available (default 0.05)")
    p.add_argument("--json", action="store_true", help="print JSON (keys: flashsim/commands/adapt_eval.py)")
    p.add_argument("--plot", metavar="DIR", help="write DIR/adapt.png, .svg and DIR/adapt_records.csv")
    p.set_defaults(func=run)


def _parse_controllers(text: str) -> list[str]:
    from adapt.controllers import CONTROLLER_NAMES
    from devices.errors import unknown_name

    names = [c.strip() for c in text.split(",") if c.strip()]
    if not names:
        raise FlashsimError("--controllers: give at least one of " + ", ".join(CONTROLLER_NAMES))
    for n in names:
        if n not in CONTROLLER_NAMES:
            raise FlashsimError(f"--controllers: {unknown_name('controller', n, CONTROLLER_NAMES)}")
    return list(dict.fromkeys(names))


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from adapt.controllers import learned_unavailable, make_controller
    from adapt.drop_quality import GsiPerplexity
    from adapt.episode import EpisodeSetup, StepTimer, Workload, requality, run_episode
    from adapt.importance import gsi_path_for, importance_vector, read_gsi_file
    from adapt.timelines import parse_budgets, parse_timelines
    from devices import load_model, load_profile
    from sim.blocks import BlockMemory
    from sim.policies.presets import preset_config
    from traces.format import open_trace

    # ---- everything the user typed is checked before the first simulation ----
    workload = Workload(args.batch, args.prompt_tokens, args.tokens)
    controllers = _parse_controllers(args.controllers)
    specs = parse_budgets(args.budgets) if args.budgets.strip() else []
    for text in (args.timelines if args.timelines is not None else [DEFAULT_TIMELINES]):
        specs += parse_timelines(text)
    if not specs:
        raise FlashsimError("--budgets and --timelines are both empty: nothing to evaluate")
    if args.plot and Path(args.plot).is_file():
        raise FlashsimError(f"--plot {args.plot}: is a file; give a folder")
    if args.decide_every < 1:
        raise FlashsimError(f"--decide-every must be >= 1, got {args.decide_every}")
    if args.weights and not Path(args.weights).is_file():
        raise FlashsimError(f"--weights {args.weights}: no such file")

    if args.trace:
        trace = open_trace(args.trace)
    else:
        from traces.data import shipped_trace_path

        trace = open_trace(shipped_trace_path())
    spec = load_model(args.model) if args.model else trace.spec
    profile = load_profile(args.device)
    blocks = BlockMemory.from_spec(spec)
    gsi_path = gsi_path_for(spec.name, args.gsi)
    doc = read_gsi_file(gsi_path)
    importance = importance_vector(doc, blocks.names)
    estimate = GsiPerplexity(doc, blocks.names)

    skipped: dict[str, str] = {}
    if "learned" in controllers:
        why = learned_unavailable(args.weights)
        if why:
            skipped["learned"] = why
            controllers.remove("learned")
    if not controllers:
        raise FlashsimError("no controller left to run: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()))

    base = preset_config("dense")
    if args.model and (spec.n_layers, spec.d_ff) != (trace.n_layers, trace.n_neurons):
        base = base.with_overrides(["sim.rescale=true"])
    timer = StepTimer(trace, spec if args.model else None, profile, base, workload)
    setup = EpisodeSetup(blocks, importance, estimate, timer, workload, args.decide_every)
    ctx = setup.context()
    timelines = [(s, s.build(ctx)) for s in specs]
    kv_max = int(setup.kv_tokens[-1])

    results = []
    with Stage("adapt eval", len(timelines) * len(controllers), "episodes") as stage:
        for spec_t, tl in timelines:
            for name in controllers:
                stage.set_postfix(f"{name} on {spec_t.label}")
                ctrl = make_controller(name, spec=spec, kv_tokens_max=kv_max, static_ratio=args.static_ratio,
                                       headroom=args.headroom, weights=args.weights)
                results.append(run_episode(setup, ctrl, tl, spec_t.label))
                stage.update()

    quality_name = "estimate"
    if args.quality == "real":
        measured = _real_quality(args, spec, doc, blocks.names)
        results = requality(results, measured, spec.n_layers)
        quality_name = "real"

    rows = []
    for r in results:
        s = r.summary
        status = "ok" if s["violations"] == 0 else ("FAIL (allowed)" if r.controller in STATIC else "FAIL")
        rows.append({"controller": r.controller, "timeline": r.timeline, "status": status, **s})
    out: dict[str, Any] = {
        "model": spec.name, "device": profile.name, "trace": str(trace.path),
        "gsi": {"path": str(gsi_path), "model": doc["model"]["name"], "steps": len(doc["gsi"]),
                "blocks": len(blocks.names), "dense_ppl": doc["dense_ppl"]},
        "quality": quality_name,
        "workload": {"batch": workload.batch, "prompt_tokens": workload.prompt_tokens,
                     "decode_tokens": workload.decode_tokens, "kv_tokens_max": kv_max},
        "decide_every": args.decide_every, "full_need_bytes": ctx.full_need_bytes,
        "always_bytes": blocks.always_bytes, "horizon_s": ctx.horizon_s, "simulator_runs": timer.runs,
        "controllers": controllers, "skipped": skipped,
        "timelines": [{"label": s.label, "kind": s.kind, "min_bytes": int(min(tl.available_bytes)),
                       "max_bytes": int(max(tl.available_bytes)), "changes": len(tl.t_s) - 1}
                      for s, tl in timelines],
        "rows": rows,
    }
    if args.plot:
        out.update(_plot(results, Path(args.plot)))
    if args.json:
        print_json(out)
        return 0
    _print(out, np)
    return 0


def _real_quality(args: argparse.Namespace, spec: Any, doc: dict, names: tuple[str, ...]) -> Any:
    """MeasuredPerplexity on the real model: the GSI file's text and token count, blocks skipped."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise FlashsimError("--quality real needs torch (pip install -e '.[real]'); use --quality estimate") from None
    from adapt.drop_quality import MeasuredPerplexity
    from real.studies.gsi import BUILTIN_TEXT, perplexity, tokenize_text
    from real.studies.pruning import skipped_blocks
    from traces.capture.models import load_hf_model

    src = doc["text"].get("source", "builtin")
    if src == "builtin":
        text = BUILTIN_TEXT
    else:
        try:
            text = Path(src).read_text(encoding="utf-8")
        except OSError as e:
            raise FlashsimError(f"--quality real: the GSI file's calibration text {src} cannot be read ({e})") from None
    if hashlib.sha256(text.encode("utf-8")).hexdigest() != doc["text"].get("sha256"):
        raise FlashsimError(f"--quality real: the calibration text {src} differs from the one the GSI file was "
                            "computed on (sha256 mismatch)")
    with phase(f"loading {args.model or spec.name}"):
        model, tokenizer, _ = load_hf_model(args.model or spec.name, notify=note)
    ids = tokenize_text(tokenizer, text, int(doc["text"]["n_tokens"]))

    def measure(sets: list[list[str]]) -> list[float]:
        # one teacher-forced pass per set, blocks skipped (not zeroed): the GSI file's perplexity
        # definition (real.studies.gsi.perplexity) on its own text, so a GSI prefix reproduces its ppl_after
        note(f"measuring the perplexity of {len(sets)} dropped sets on the real model")
        out = []
        for s in sets:
            with skipped_blocks(model, s):
                out.append(perplexity(model, ids))
        return out

    return MeasuredPerplexity(measure, names)


def _plot(results: list, out_dir: Path) -> dict[str, Any]:
    import pandas as pd

    from analysis.figures import draw_figure
    from analysis.figures.common import save

    frames = []
    for r in results:
        f = r.records
        frames.append(pd.DataFrame({
            "controller": r.controller, "timeline": r.timeline, "step": f["step"], "t_s": f["t_s"],
            "resident_bytes": f["footprint_bytes"], "budget_bytes": f["available_bytes"],
            "n_dropped": f["n_dropped"], "action": f["action"]}))
    records = pd.concat(frames, ignore_index=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "adapt_records.csv"
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        records.to_csv(tmp, index=False)
        replace_output(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    figs = save(draw_figure("adapt", records), out_dir, "adapt")
    return {"figures": [str(p) for p in figs], "records": str(path)}


def _print(out: dict[str, Any], np: Any) -> None:
    from devices.units import format_bytes

    w = out["workload"]
    g = out["gsi"]
    print(f"{out['model']} on {out['device']}: batch {w['batch']}, prompt {w['prompt_tokens']}, "
          f"{w['decode_tokens']} decode steps; full need {format_bytes(out['full_need_bytes'])} "
          f"(never dropped {format_bytes(out['always_bytes'])}); dense episode {out['horizon_s'] * 1e3:.1f} ms")
    print(f"quality: {out['quality']} (GSI {g['path']}: {g['steps']}/{g['blocks']} steps, dense ppl "
          f"{g['dense_ppl']:.3f}); decision every {out['decide_every']} steps + budget changes")
    for name, why in out["skipped"].items():
        print(f"skipped {name}: {why}")
    rows = [(r["controller"], r["timeline"], r["status"], r["violations"], format_bytes(r["max_over_bytes"]),
             f"{r['ppl']:.3f}", f"{r['worst_ppl']:.3f}", f"{r['tokens_per_s']:.1f}", f"{r['mean_dropped']:.1f}",
             r["changes"]) for r in out["rows"]]
    print_table(["controller", "timeline", "status", "violations", "max over", "ppl", "worst ppl", "tok/s",
                 "dropped", "changes"], rows, align="lllrrrrrrr")
    if "figures" in out:
        print("wrote " + ", ".join(out["figures"]) + f", {out['records']}")
