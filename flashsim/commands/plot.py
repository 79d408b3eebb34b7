"""`flashsim plot KIND RESULTS --out DIR`: draw one figure (PNG and SVG) from results, a validation
table, a device profile, a memory records table or a trace (see analysis.figures)."""

from __future__ import annotations

import argparse

from analysis.figures import FIGURES, make_figure
from flashsim.output import print_json


def register(sub: argparse._SubParsersAction) -> None:
    kinds = "; ".join(f"{k} (from {inp})" for k, (_, inp) in FIGURES.items())
    p = sub.add_parser(
        "plot", help="draw one figure (PNG and SVG) from results",
        description="Draw one figure into DIR/KIND.png and DIR/KIND.svg. Kinds: " + kinds + ". "
        "results = a sweep directory or results .parquet/.csv; validation = a table with columns "
        "config, metric, sim, real; device = a device name or profile file; records = a table with "
        "t_s, resident_bytes, budget_bytes; trace = a trace directory.")
    p.add_argument("kind", metavar="KIND", choices=sorted(FIGURES), help="figure kind: " + ", ".join(FIGURES))
    p.add_argument("results", metavar="RESULTS", help="what the figure is drawn from (see above)")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder")
    p.add_argument("--where", action="append", default=[], metavar="KEY=VALUE",
                   help="keep only result rows with KEY=VALUE (repeatable; e.g. device=apple-m1-max, param.window.k=4)")
    p.add_argument("--param", metavar="KEY", help="window figure: the swept parameter on the x axis")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_plot)


def _plot(args: argparse.Namespace) -> int:
    paths = make_figure(args.kind, args.results, args.out, where=args.where, param=args.param)
    if args.json:
        print_json({"kind": args.kind, "files": [str(p) for p in paths]})
    else:
        for p in paths:
            print(p)
    return 0
