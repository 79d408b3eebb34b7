"""`flashsim report RESULTS --out DIR`: a self-contained HTML page (figures embedded, tables, the
resolved configuration) from a sweep directory or results table (see analysis.report)."""

from __future__ import annotations

import argparse

from analysis.report import build_report
from flashsim.output import print_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report", help="write a self-contained HTML report of sweep results",
        description="Write DIR/report.html (opens from disk, no server, no network) and the figures "
        "as PNG and SVG under DIR/figures/, from a sweep directory or a results .parquet/.csv.")
    p.add_argument("results", metavar="RESULTS", help="sweep directory or results table")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder")
    p.add_argument("--title", help="page title (default: the sweep's name or folder)")
    p.add_argument("--plan", metavar="FILE", help="also show a what-if plan (the output of `flashsim plan --json`)")
    p.add_argument("--validation", metavar="FILE", help="also plot a sim-vs-real table (config, metric, sim, real)")
    p.add_argument("--records", metavar="FILE", help="also plot memory over time (t_s, resident_bytes, budget_bytes)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_report)


def _report(args: argparse.Namespace) -> int:
    path = build_report(args.results, args.out, title=args.title, validation=args.validation, plan=args.plan,
                        records=args.records)
    figures = sorted(str(p) for p in (path.parent / "figures").rglob("*.png"))
    if args.json:
        print_json({"report": str(path), "figures": figures})
    else:
        print(f"report: {path} ({len(figures)} figures; open it in a browser, no server needed)")
    return 0
