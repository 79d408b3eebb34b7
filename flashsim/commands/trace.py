"""`flashsim trace stats|synth|profile`: statistics of a trace, synthetic traces, the SelectInfer profiler."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from devices import load_model
from devices.errors import FlashsimError
from flashsim.output import output_file, print_json, print_table
from traces.format import open_trace
from traces.profiler import load_neuron_profile, profile_traces, save_profile
from traces.routing import is_routing_trace
from traces.stats import PHASES, trace_stats


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trace", help="trace statistics, synthetic traces and the offline neuron profiler")
    tsub = p.add_subparsers(dest="trace_cmd", metavar="stats|synth|profile|import-routing|synth-routing")
    p.set_defaults(func=lambda args: _usage(p))

    s = tsub.add_parser("stats", help="sparsity, reuse across tokens and hot-neuron skew of a trace")
    s.add_argument("trace", help="trace directory")
    s.add_argument("--phase", choices=PHASES, default="all",
                   help="which tokens are measured: all (default), decode or prefill")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.add_argument("--plot", metavar="DIR", help="also write PNG and SVG figures into DIR")
    s.set_defaults(func=_stats)

    y = tsub.add_parser(
        "synth", help="write a synthetic trace fitted to a trace or to parameters",
        description="Per-neuron on/off Markov chains with heterogeneous rates (hot-neuron skew), a "
        "mixture of persistence and prompt-level context classes fitted to window coverage k = 1..8, "
        "and optional |a| magnitudes; see docs/capture-and-traces.md and traces/synthetic.py.")
    y.add_argument("--model", help="model spec (bundled name, HF folder or spec YAML); default with --like: "
                   "the source trace's model")
    y.add_argument("--tokens", type=int, help="tokens to generate (default with --like: the source's count)")
    y.add_argument("--out", required=True, help="output trace directory (must not exist unless --force)")
    y.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    y.add_argument("--like", metavar="TRACE", help="fit every layer to this trace's statistics")
    y.add_argument("--phase", choices=PHASES, default="all", help="with --like: which source tokens to fit")
    y.add_argument("--active-fraction", type=float, metavar="F", help="share of neurons active per token")
    y.add_argument("--overlap", type=float, metavar="P", help="overlap with the previous token |A_t ∩ A_t-1|/|A_t|")
    y.add_argument("--hot-skew", type=float, metavar="H",
                   help="fraction of neurons that give 80%% of active events (0.8 = no skew)")
    y.add_argument("--prompt-tokens", type=int, metavar="N",
                   help="cut the trace into prompts of N tokens (chains restart at each); default: the "
                   "source's prompt lengths with --like, else one prompt")
    y.add_argument("--magnitudes", action=argparse.BooleanOptionalAction, default=True,
                   help="store synthetic |a| of the strongest neurons (default on)")
    y.add_argument("--force", action="store_true", help="replace --out if it exists")
    y.add_argument("--json", action="store_true", help="print one JSON object")
    y.set_defaults(func=_synth)

    f = tsub.add_parser("profile", help="SelectInfer offline profiler: neuron scores and rankings")
    f.add_argument("traces", nargs="+", metavar="TRACE", help="trace directories of one model shape")
    f.add_argument("--out", required=True, metavar="FILE.npz", help="profile file to write")
    f.add_argument("--json", action="store_true", help="print one JSON object")
    f.set_defaults(func=_profile)

    from flashsim.commands.trace_routing import register as register_routing

    register_routing(tsub)


def _usage(p: argparse.ArgumentParser) -> int:
    p.print_help()
    return 2


def _f(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


# ---- stats ------------------------------------------------------------------------------------
def _stats(args: argparse.Namespace) -> int:
    if is_routing_trace(args.trace):
        from flashsim.commands.trace_routing import stats as routing_stats

        if args.plot:
            raise FlashsimError("trace stats --plot draws activation traces; a routing trace has its numbers in "
                                "--json")

        return routing_stats(args)
    trace = open_trace(args.trace)
    st = trace_stats(trace, phase=args.phase)
    data = st.to_json()
    figures = []
    if args.plot:
        from analysis.figures.trace_stats import plot_trace_stats

        figures = [str(p) for p in plot_trace_stats(data, args.plot)]
        data["figures"] = figures
    if args.json:
        print_json(data)
        return 0
    kind = "synthetic" if st.synthetic else "captured"
    print(f"{st.path}: {st.model} ({kind}), {st.n_layers} layers x {st.n_neurons} neurons, "
          f"{st.n_tokens} of {st.n_tokens_trace} tokens measured (phase {st.phase}), top-K {st.top_k}")
    ks = ("2", "4", "8", "16")
    cols = ["layer", "active", "overlap"] + [f"cov@{k}" for k in ks] + ["hot80", "hot80_mass"]

    def row(name: Any, d: dict[str, Any]) -> list[Any]:
        return ([name, _f(d["active_fraction"]), _f(d["overlap_prev"])]
                + [_f(d["window_coverage"].get(k)) for k in ks]
                + [_f(d["hot80_fraction"]), _f(d["hot80_mass_fraction"])])

    rows = [row(d["layer"], d) for d in data["per_layer"]] + [row("all", data)]
    print_table(cols, rows, align="r" * len(cols))
    if data["magnitude_coverage"] is not None:
        note = ("" if data["magnitude_coverage"] >= 0.5 else
                " (hot80_mass describes the strongest activations only)")
        print(f"stored top-K magnitudes hold {data['magnitude_coverage']:.1%} of the total |a|{note}")
    if data["task_hot_overlap"]:
        pairs = ", ".join(f"{a}/{b} {_f(p['jaccard'], 2)}" for p in data["task_hot_overlap"]
                          for a, b in [p["tasks"]])
        print(f"hot-80% set overlap across tasks (Jaccard, all layers pooled): {pairs}")
    for fig in figures:
        print(f"wrote {fig}")
    return 0


# ---- synth ------------------------------------------------------------------------------------
def _synth(args: argparse.Namespace) -> int:
    if _wants_routing(args):
        from flashsim.commands.trace_routing import synth as routing_synth

        for flag, v in (("--active-fraction", args.active_fraction), ("--overlap", args.overlap),
                        ("--hot-skew", args.hot_skew), ("--prompt-tokens", args.prompt_tokens)):
            if v is not None:
                raise FlashsimError(f"trace synth: {flag} is for activation traces; a routing trace takes the "
                                    "options of `trace synth-routing`")
        ns = argparse.Namespace(**{**vars(args), "sigma": None, "phi": None, "psi": None, "skew": 0.0,
                                   "sequence_tokens": None})
        return routing_synth(ns)
    from traces.synthetic import synthesize

    params = {"--active-fraction": args.active_fraction, "--overlap": args.overlap, "--hot-skew": args.hot_skew}
    given = [k for k, v in params.items() if v is not None]
    like = None
    if args.like:
        if given:
            raise FlashsimError(f"trace synth: --like fits every statistic; drop {', '.join(given)}")
        like = open_trace(args.like)
        spec = load_model(args.model) if args.model else like.spec
        n_tokens = args.tokens if args.tokens is not None else like.n_tokens
    else:
        missing = [k for k, v in params.items() if v is None]
        if missing:
            raise FlashsimError(f"trace synth: give --like TRACE, or all of --active-fraction, --overlap and "
                                f"--hot-skew (missing {', '.join(missing)})")
        if not args.model or args.tokens is None:
            raise FlashsimError("trace synth: --model and --tokens are required without --like")
        spec = load_model(args.model)
        n_tokens = args.tokens
    provenance = {"command": _synth_command(args, spec.name, n_tokens), "numpy": np.__version__}
    out = synthesize(args.out, spec, n_tokens, args.seed, like=like, like_phase=args.phase,
                     active_fraction=args.active_fraction, overlap=args.overlap, hot_skew=args.hot_skew,
                     magnitudes=args.magnitudes, prompt_tokens=args.prompt_tokens, overwrite=args.force,
                     provenance=provenance, progress=True)
    trace = open_trace(out, verify=False)
    syn = trace.manifest.synthetic or {}
    summary = {"out": str(out), "model": spec.name, "n_layers": spec.n_layers, "n_neurons": spec.d_ff,
               "n_tokens": n_tokens, "top_k": trace.top_k, "seed": args.seed, "mode": syn.get("mode"),
               "achieved": syn.get("achieved"), "tasks": syn.get("tasks"),
               "layers": [{"layer": i, "source_layer": lay.get("source_layer"), "target": lay["target"],
                           "achieved": lay["achieved"]} for i, lay in enumerate(syn.get("layers", []))]}
    if args.json:
        print_json(summary)
        return 0
    print(f"wrote {out}: {spec.name}, {spec.n_layers} layers x {spec.d_ff} neurons, {n_tokens} tokens, "
          f"top-K {trace.top_k}, seed {args.seed} ({syn.get('mode')})")
    cols = ["layer", "src", "active t/a", "overlap t/a", "cov@8 t/a", "hot80 t/a"]

    def ta(t: dict, a: dict, key: str, sub: str | None = None) -> str:
        tv = t.get(key) if sub is None else (t.get(key) or {}).get(sub)
        av = a.get(key) if sub is None else (a.get(key) or {}).get(sub)
        return f"{_f(tv)}/{_f(av)}"

    rows = [[lay["layer"], "-" if lay["source_layer"] is None else lay["source_layer"],
             ta(lay["target"], lay["achieved"], "active_fraction"),
             ta(lay["target"], lay["achieved"], "overlap_prev"),
             ta(lay["target"], lay["achieved"], "window_coverage", "8"),
             ta(lay["target"], lay["achieved"], "hot80_fraction")] for lay in summary["layers"]]
    print_table(cols, rows, align="r" * len(cols))
    print("t/a = target (fitted to) / achieved on the written trace; '-' = not a target in this mode")
    tasks = syn.get("tasks")
    if tasks:
        _print_tasks(tasks)
    return 0


def _print_tasks(tasks: dict) -> None:
    if not tasks.get("task_aware"):
        print(f"tasks: not task-aware ({tasks.get('reason')})")
        return
    check = tasks["profile_check"]
    cnt, mag = check["count"], check.get("magnitude")
    print(f"tasks: {', '.join(tasks['fitted_tasks'])} fitted"
          + (f"; {', '.join(tasks['unfitted_tasks'])} unfitted (< {tasks['min_task_tokens']} tokens)"
             if tasks["unfitted_tasks"] else ""))
    rows = [[k, _f(tasks["active_fraction"]["target"].get(k[5:])) if k.startswith("base.") else "-",
             _f(tasks["active_fraction"]["achieved"].get(k[5:])) if k.startswith("base.") else "-",
             f"{_f(cnt['overlap'][k]['mean'])}/{_f(cnt['split_half_floor'][k])}",
             "-" if mag is None else f"{_f(mag['overlap'][k]['mean'])}/{_f(mag['split_half_floor'][k])}"]
            for k in cnt["overlap"]]
    print_table(["ranking", "active t", "active a", "count-score overlap/floor", "|a|-score overlap/floor"],
                rows, align="lrrrr")
    verdict = " and ".join(f"{name} {'reaches' if res['passes'] else 'does NOT reach'}"
                           for name, res in [("count", cnt), ("|a|", mag)] if res is not None)
    print(f"profiler top-n sets, n = {cnt['top_n']} per layer (chance {_f(cnt['chance'])}), mean over layers; "
          f"floor = the source's split-half overlap: {verdict} it")


def _wants_routing(args: argparse.Namespace) -> bool:
    """A routing --like trace, or an MoE --model without --like, makes `trace synth` a routing synthesis."""
    if args.like:
        return is_routing_trace(args.like)
    if args.model:
        from devices.moe_spec import is_moe_model

        return is_moe_model(args.model)
    return False


def _synth_command(args: argparse.Namespace, model: str, n_tokens: int) -> str:
    """The command line that regenerates this trace (resolved defaults made explicit)."""
    parts = ["flashsim trace synth", f"--model {model}", f"--tokens {n_tokens}", f"--out {args.out}",
             f"--seed {args.seed}"]
    if args.like:
        parts += [f"--like {args.like}", f"--phase {args.phase}"]
    else:
        parts += [f"--active-fraction {args.active_fraction}", f"--overlap {args.overlap}",
                  f"--hot-skew {args.hot_skew}"]
    if args.prompt_tokens is not None:
        parts.append(f"--prompt-tokens {args.prompt_tokens}")
    parts.append("--magnitudes" if args.magnitudes else "--no-magnitudes")
    return " ".join(parts)


# ---- profile ----------------------------------------------------------------------------------
def _profile(args: argparse.Namespace) -> int:
    output_file(args.out, "FILE.npz", "--out")     # refused before any work
    traces = [open_trace(p) for p in args.traces]
    prof = profile_traces(traces)
    out = save_profile(prof, args.out)
    load_neuron_profile(out)          # read back: what the selective policy will see
    top = max(1, round(0.1 * prof.n_neurons))
    sec = prof.secondary_ranking()[:, :top]
    tasks = []
    for task in prof.tasks:
        base = prof.base_ranking(task)[:, :top]
        shared = np.mean([len(np.intersect1d(base[layer], sec[layer])) / top for layer in range(prof.n_layers)])
        mass = prof.scores_task[task]
        share = float(np.sort(mass, axis=1)[:, ::-1][:, :top].sum() / mass.sum()) if mass.sum() > 0 else None
        tasks.append({"task": task, "tokens": prof.meta["tokens_per_task"][task],
                      "top10_score_share": share, "top10_shared_with_secondary": float(shared)})
    summary = {"out": str(out), "model": prof.meta["model"], "n_layers": prof.n_layers,
               "n_neurons": prof.n_neurons, "score": prof.meta["score"], "traces": prof.meta["traces"],
               "tasks": tasks}
    if args.json:
        print_json(summary)
        return 0
    print(f"wrote {out}: {prof.meta['model']}, {prof.n_layers} layers x {prof.n_neurons} neurons, "
          f"score = {prof.meta['score']}, {len(traces)} trace(s)")
    rows = [[t["task"], t["tokens"], _f(t["top10_score_share"]), _f(t["top10_shared_with_secondary"])]
            for t in tasks]
    print_table(["task", "tokens", "top-10% score share", "top-10% shared with model ranking"], rows,
                align="lrrr")
    return 0
