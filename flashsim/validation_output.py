"""CLI output of a validation report (`flashsim validate`, `flashsim calibrate`): the error tables
per configuration group and mode, the host's repeat floor, convergence, grids compared, and the progress
lines on stderr."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from flashsim.output import print_json, print_table


def _pct(x: float | None, sign: str = "") -> str:
    return "n/a" if x is None else f"{x:{sign}.1%}"


def _alone(rep: dict) -> str:
    """One metric's real.validation.validate_score.repeatability entry in words."""
    sim, rest = rep["simulator"], rep["other_passes"]
    return (f"the simulator's latency error median {_pct(sim['median'])}, p90 {_pct(sim['p90'])}; the other passes' "
            f"mean's median {_pct(rest['median'])}, p90 {_pct(rest['p90'])} (the host's repeatability)")


def print_convergence(conv: dict | None) -> None:
    """real.validation.validate_score.convergence of the latency, as a table: the simulator against the mean of
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


def print_raw_held_out(raw: dict | None) -> None:
    """real.validation.validate_score.raw_held_out: the figure to quote, printed first."""
    if not raw or raw.get("median") is None:
        return
    fitted = (f"; {raw['n_fitted_left_out']} configuration(s) a calibration step saw left out"
              if raw.get("n_fitted_left_out") else "")
    print(f"raw held-out latency error (runs no calibration saw, nothing divided out): median {_pct(raw['median'])}, "
          f"p90 {_pct(raw['p90'])}, max {_pct(raw['max'])} over {raw['n_configs']} configurations{fitted}")


def print_level_removed(level: dict | None) -> None:
    """real.validation.validate_score.level_removed in words: shape-only, never the score."""
    if not level:
        return
    print(f"shape-only (a level factor per mode fitted on {level.get('fitted_on', 'the calibration runs')}: "
          f"{', '.join(f'{m} {f:.3f}' for m, f in level['factor'].items())}): latency error median "
          f"{_pct(level['median'])}, p90 {_pct(level['p90'])}, max {_pct(level['max'])}; not the score")


def print_between_grids(between: dict | None) -> None:
    """real.validation.validate_score.between_grids: the real runs of one grid against another's, per pair."""
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
    """One profile on several kept grids (real.validation.validate_keep.rescore_many): a row per grid, the
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
    """The group tables' columns for the compute's two phases (real.validation.validate_score.per_group), only
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
    """real.validation.validate_score.floor as a table: the simulator's error beside the host's repeat spread
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
    from real.validation.validate_plot import scatter_plot

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
    print_raw_held_out(report.get("raw_held_out"))
    for w in (report.get("load_warning"), report.get("drift_warning")):
        if w:   # also on stderr as it happened; here so that it stays with the figures it qualifies
            print(f"warning: {w.removeprefix('WARNING: ')}")
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

        from real.validation.drift import READ_KEYS, WIDTH_KEYS

        def reads(c: dict) -> str:    # the read-size checks, when measured
            r = [f"{key[5:]} {ratio(c[key])}" for key in READ_KEYS.values() if key in c]
            return f", reads {' '.join(r)}" if r else ""

        def widths(c: dict) -> str:   # the GEMV width checks, when measured
            r = [f"{key[4:]} {ratio(c[key])}" for key in WIDTH_KEYS.values() if key in c]
            return f" (in_features {' '.join(r)})" if r else ""

        print("host vs profile (measured / profiled time): " + "; ".join(
            f"{when} disk {ratio(c.get('disk'))}, cpu {ratio(c.get('cpu'))}"
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
              f"{dc['disk_ratio']:.2f}x, cpu {dc['cpu_ratio']:.2f}x): "
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
