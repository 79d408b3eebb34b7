"""`flashsim sweep SPEC --out DIR`: run a grid of simulations from a sweep file, resumably.

The sweep machinery lives in `analysis.sweep` (engines, storage) and `analysis.sweep_spec` (the
file format); this module only parses flags and prints the outcome.
"""

from __future__ import annotations

import argparse

from analysis.sweep import ENGINES, run_sweep
from analysis.sweep_spec import load_spec
from analysis.tables import load_results
from flashsim.output import print_json, print_table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep", help="run a grid of simulations from a sweep file (resumable)",
        description="Run every point of a sweep file (YAML or TOML; see docs/sweep-plot-report.md) and append "
        "each finished point to a Parquet dataset in DIR/results with DIR/manifest.json. Killed at any "
        "moment, the same command resumes: finished points are skipped, none is written twice.")
    p.add_argument("spec", metavar="SPEC", help="sweep file (.yaml, .yml or .toml)")
    p.add_argument("--out", required=True, metavar="DIR", help="sweep directory (new, empty, or to resume)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="worker processes (default: the CPUs this process may use)")
    p.add_argument("--engine", choices=ENGINES, default="local",
                   help="local process pool (default) or a Dask distributed cluster")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="Dask scheduler address (tcp://host:8786); default with --engine dask: a local cluster")
    p.add_argument("--dry-run", action="store_true", help="list the points and check the names, run nothing")
    p.add_argument("--no-progress", action="store_true", help="no progress on stderr (default: a bar on a terminal, one line per stage in a log)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_sweep)


def _sweep(args: argparse.Namespace) -> int:
    if args.dry_run:
        return _dry_run(args)
    o = run_sweep(args.spec, args.out, workers=args.workers, engine=args.engine, scheduler=args.scheduler,
                  progress=False if args.no_progress else None)
    table = load_results(o.out_dir).table
    errors = table[table["status"] == "error"][["label", "device", "error"]]
    if args.json:
        print_json({**o.to_dict(), "n_failed_total": len(errors), "errors": errors.to_dict("records")})
        return 0
    print(f"sweep: {o.n_points} points in {o.out_dir}: {o.n_skipped} already done, {o.n_run} run now "
          f"in {o.wall_s:.1f} s ({o.points_per_s:.1f} points/s, {o.engine}, {o.workers} "
          f"worker{'s' if o.workers != 1 else ''}); {len(errors)} of {len(table)} did not run (status 'error')")
    if len(errors):
        print(f"\nfailed points ({len(errors)}):")
        rows = [[label, device, err if len(err) <= 90 else err[:87] + "..."]
                for label, device, err in errors.head(10).values.tolist()]
        print_table(["point", "device", "error"], rows)
        if len(errors) > 10:
            print(f"... and {len(errors) - 10} more (all messages: flashsim report {o.out_dir} --out DIR)")
    print(f"\nnext: flashsim report {o.out_dir} --out {o.out_dir}/report")
    return 0


DRY_RUN_FULL_CHECK = 100_000   # points a dry run builds to find duplicates (a few seconds); larger grids are counted


def _dry_run(args: argparse.Namespace) -> int:
    import itertools

    from analysis.sweep_point import check_points
    from analysis.sweep_spec import check_grid_size, expand, iter_points, probe_points

    loaded = load_spec(args.spec)
    n = check_grid_size(loaded)          # counted first: any grid answers at once
    if n <= DRY_RUN_FULL_CHECK:          # as the real run will: two entries giving one point refused
        expand(loaded)
    points = list(itertools.islice(iter_points(loaded), 50))
    check_points(points + probe_points(loaded))   # every name and value once, not the product
    rows = [[p.index, p.point_id, p.label(), p.device,
             "device" if p.dram_budget_bytes is None else p.dram_budget_bytes] for p in points]
    if args.json:
        print_json({"n_points": n, "points": [{**p.to_dict(), "point_id": p.point_id} for p in points]})
        return 0
    print(f"{n} points (nothing run: --dry-run)")
    print_table(["#", "point_id", "point", "device", "dram_budget_bytes"], rows)
    if n > len(rows):
        print(f"... and {n - len(rows)} more")
    return 0
