"""`flashsim trace import-routing|synth-routing` and `trace stats` of a routing trace (MoE expert routing)."""

from __future__ import annotations

import argparse
from typing import Any

from devices.errors import FlashsimError
from flashsim.output import print_json, print_table
from traces.routing import open_routing_trace


def register(tsub: argparse._SubParsersAction) -> None:
    i = tsub.add_parser(
        "import-routing", help="import published MoE routing records (JSON lines) into a routing trace",
        description="Records name a sequence, a layer, a token index, the top-k expert ids and (optionally) "
        "their router weights; see traces/routing_import.py for the accepted field names.")
    i.add_argument("records", nargs="*", metavar="FILE.jsonl", help="routing record files")
    i.add_argument("--published", metavar="NAME", help="a pinned published trace (traces/routing_published.py); "
                   "its records must be in --from or fetched by scripts/fetch_routing_trace.py")
    i.add_argument("--from", dest="from_dir", metavar="DIR", help="with --published: folder of its record files")
    i.add_argument("--out", required=True, help="routing trace directory to create")
    i.add_argument("--model", help="model name stored in the trace (required without --published)")
    i.add_argument("--n-layers", type=int, help="decoder layers of the model (default: largest layer + 1)")
    i.add_argument("--n-experts", type=int, help="routed experts per layer (default: largest id + 1)")
    i.add_argument("--phase", choices=("decode", "prefill"), default="decode", help="phase of the records' tokens")
    i.add_argument("--repository", default="", help="provenance: where the records come from")
    i.add_argument("--commit", default="", help="provenance: the commit of --repository")
    i.add_argument("--license", default="", help="provenance: the records' license")
    i.add_argument("--force", action="store_true", help="replace --out if it exists")
    i.add_argument("--json", action="store_true", help="print one JSON object")
    i.set_defaults(func=_import)

    y = tsub.add_parser(
        "synth-routing", help="write a synthetic routing trace at any MoE shape, fitted to a routing trace",
        description="Gumbel-top-k routing with a persistent latent (locality) and cross-layer coupling; "
        "with --like, fitted to the trace's popularity, reuse, SRP/SCH and cross-layer NMI "
        "(traces/routing_synth.py). Also reached as `trace synth` with a routing --like or an MoE --model.")
    add_synth_args(y)
    y.set_defaults(func=synth)


def add_synth_args(y: argparse.ArgumentParser) -> None:
    y.add_argument("--model", help="MoE spec (bundled name or HF folder) giving the shape; default: --like's shape")
    y.add_argument("--like", metavar="TRACE", help="routing trace to fit")
    y.add_argument("--tokens", type=int, help="tokens to generate (default: --like's count, else required)")
    y.add_argument("--out", required=True, help="routing trace directory to create")
    y.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    y.add_argument("--sigma", type=float, help="without --like: latent strength (locality; default 1.0)")
    y.add_argument("--phi", type=float, help="without --like: latent memory per token, in [0, 1) (default 0.8)")
    y.add_argument("--psi", type=float, help="without --like: cross-layer coupling, in [0, 1) (default 0.3)")
    y.add_argument("--skew", type=float, default=0.0, help="without --like: Zipf skew of expert popularity (default 0)")
    y.add_argument("--sequence-tokens", type=int, metavar="N", help="tokens per sequence (default: one sequence, "
                   "or --like's sequences at its token count)")
    y.add_argument("--force", action="store_true", help="replace --out if it exists")
    y.add_argument("--json", action="store_true", help="print one JSON object")


def _f(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


# ---- import -----------------------------------------------------------------------------------
def _import(args: argparse.Namespace) -> int:
    from traces.routing_import import import_routing_jsonl
    from traces.routing_published import import_published

    if args.published:
        if args.records:
            raise FlashsimError("trace import-routing: give record files or --published NAME, not both")
        out = import_published(args.published, args.out, args.from_dir, overwrite=args.force)
    else:
        if not args.records or not args.model:
            raise FlashsimError("trace import-routing: give FILE.jsonl... and --model (or --published NAME)")
        prov = {k: v for k, v in (("repository", args.repository), ("commit", args.commit),
                                   ("license", args.license)) if v}
        out = import_routing_jsonl(args.records, args.out, model=args.model, n_layers=args.n_layers,
                                   n_experts=args.n_experts, phase=args.phase, provenance=prov, overwrite=args.force)
    t = open_routing_trace(out)
    src = t.manifest.source
    summary = {"out": str(out), "model": t.manifest.model, "n_tokens": t.n_tokens, "n_moe_layers": t.n_moe_layers,
               "n_experts": t.n_experts, "top_k": t.top_k, "sequences": len(src.get("sequences", [])),
               "dropped_tokens": src.get("dropped_tokens"), "weights": src.get("weights"),
               "repository": src.get("repository"), "commit": src.get("commit"), "license": src.get("license")}
    if args.json:
        print_json(summary)
        return 0
    print(f"wrote {out}: {t.manifest.model}, {t.n_tokens} tokens in {summary['sequences']} sequence(s), "
          f"{t.n_moe_layers} MoE layers x {t.n_experts} experts, top-{t.top_k}; weights {summary['weights']}; "
          f"{summary['dropped_tokens']} token(s) dropped (missing in some layer)")
    if summary["repository"]:
        print(f"source: {summary['repository']} @ {summary['commit'] or '?'}; license: {summary['license'] or '?'}")
    return 0


# ---- stats ------------------------------------------------------------------------------------
def stats(args: argparse.Namespace) -> int:
    from traces.routing_stats import routing_stats, view_of

    t = open_routing_trace(args.trace)
    v = view_of(t, args.phase)
    if v.n_tokens == 0:
        raise FlashsimError(f"{args.trace}: no {args.phase} tokens to measure; try --phase all")
    st = routing_stats(v)
    data = {"path": str(t.path), "kind": "routing", "model": t.manifest.model, "source": t.manifest.source.get("kind"),
            "phase": args.phase, "moe_layers": t.manifest.moe_layers, **st}
    if args.json:
        print_json(data)
        return 0
    print(f"{t.path}: {t.manifest.model} routing trace ({data['source']}), {st['n_tokens']} of {t.n_tokens} tokens "
          f"measured (phase {args.phase}), {st['n_moe_layers']} MoE layers x {st['n_experts']} experts, "
          f"top-{st['top_k']}")
    cols = ["moe layer", "entropy", "max share", "reuse", "SRP@4", "SRP@16", "SRP@64", "SCH@16", "SCH@64"]

    def row(name: Any, d: dict[str, Any]) -> list[str]:
        return [str(name), _f(d["popularity_entropy"]), _f(d["max_share"]), _f(d["reuse_prev"]),
                _f(d["srp"]["4"]), _f(d["srp"]["16"]), _f(d["srp"]["64"]), _f(d["sch"]["16"]), _f(d["sch"]["64"])]

    layers = st["per_layer"]
    rows = [row(t.manifest.moe_layers[d["moe_layer"]], d) for d in layers] + [row("mean", st)]
    print_table(cols, rows, align="r" * len(cols))
    print(f"entropy: of expert popularity, 1 = uniform; reuse: share of a token's experts the previous token "
          f"used; SRP@m / SCH@m: segment routing best performance / segment cache best hit rate "
          f"(cache {st['sch_cache_experts']} experts) over m-token segments (arXiv 2505.16056)")
    print(f"cross-layer: top-1 NMI {_f(st['cross_layer_nmi'])}, top-1 transition accuracy "
          f"{_f(st['cross_layer_top1_acc'])}; mean top-1 router weight {_f(st['top1_weight'])}")
    return 0


# ---- synth ------------------------------------------------------------------------------------
def synth(args: argparse.Namespace) -> int:
    from traces.routing_stats import compare, view_of
    from traces.routing_synth import SynthParams, synthesize

    like = open_routing_trace(args.like) if args.like else None
    given = {"--sigma": args.sigma, "--phi": args.phi, "--psi": args.psi}
    if like is not None and any(v is not None for v in given.values()):
        raise FlashsimError("trace synth-routing: --like fits sigma, phi and psi; drop "
                            + ", ".join(k for k, v in given.items() if v is not None))
    for k, v in (("--phi", args.phi), ("--psi", args.psi)):
        if v is not None and not 0 <= v < 1:
            raise FlashsimError(f"{k} {v}: must be in [0, 1)")
    if args.model:
        from devices.moe_spec import load_moe_model

        spec = load_moe_model(args.model)
        shape = dict(model=spec.name, n_layers=spec.n_layers, moe_layers=list(spec.moe_layers),
                     n_experts=spec.n_experts, top_k=spec.top_k)
    elif like is not None:
        m = like.manifest
        shape = dict(model=m.model, n_layers=m.n_layers, moe_layers=list(m.moe_layers), n_experts=m.n_experts,
                     top_k=m.top_k)
    else:
        raise FlashsimError("trace synth-routing: give --model MOE_SPEC, --like TRACE, or both")
    n_tokens = args.tokens if args.tokens is not None else (like.n_tokens if like is not None else None)
    if n_tokens is None:
        raise FlashsimError("trace synth-routing: --tokens is required without --like")
    d = SynthParams()
    params = SynthParams(args.sigma if args.sigma is not None else d.sigma, args.phi if args.phi is not None else d.phi,
                         args.psi if args.psi is not None else d.psi)
    out, fit = synthesize(args.out, **shape, n_tokens=n_tokens, seed=args.seed, like=like, params=params,
                          skew=args.skew, sequence_tokens=args.sequence_tokens, overwrite=args.force)
    result = {"out": str(out), **shape, "n_tokens": n_tokens, "seed": args.seed, "params": fit["params"],
              "target": fit.get("target"), "achieved": fit["achieved"], "check": None}
    same_shape = like is not None and (like.n_experts, like.top_k, like.n_moe_layers) == \
        (shape["n_experts"], shape["top_k"], len(shape["moe_layers"]))
    if same_shape:
        result["check"] = compare(view_of(like), view_of(open_routing_trace(out)))
    if args.json:
        print_json(result)
        return 0
    p = fit["params"]
    print(f"wrote {out}: {shape['model']}, {n_tokens} tokens, {len(shape['moe_layers'])} MoE layers x "
          f"{shape['n_experts']} experts, top-{shape['top_k']}, seed {args.seed}; sigma {p['sigma']:g}, "
          f"phi {p['phi']:g}, psi {p['psi']:g}, beta {p['beta']:g}, kappa {p['kappa']:g}")
    keys = [("reuse_prev", "reuse"), ("srp.16", "SRP@16"), ("sch.16", "SCH@16"), ("cross_layer_nmi", "NMI"),
            ("top1_weight", "top-1 w")]
    from traces.routing_stats import scalar

    tgt, ach = fit.get("target"), fit["achieved"]
    rows = [[label, _f(scalar(tgt, k)) if tgt else "-", _f(scalar(ach, k))] for k, label in keys]
    print_table(["statistic", "source" if same_shape or not tgt else "source (its own shape)", "achieved"], rows,
                align="lrr")
    if tgt and not same_shape:
        print("the statistics depend on the expert count and top-k: at another shape the fitted sigma, phi, psi "
              "and beta carry over, not the source's values (NMI also rises with the expert count at few tokens)")
    if result["check"]:
        c = result["check"]
        rows = [[k, _f(r["distance"], 4), _f(r["floor"], 4), "yes" if r["passes"] else "NO"] for k, r in c["rows"].items()]
        print_table(["statistic", "distance to source", "source split-half floor", "within floor + slack"], rows,
                    align="lrrr")
        print(f"slack {c['slack']}: a statistic passes when distance <= floor + slack; "
              f"{'all pass' if c['passes'] else 'NOT all pass'}")
    return 0
