"""How the simulator's error is scored against real runs (`flashsim validate`, and `--rescore` of a
kept grid): per configuration, per grid, per group (times in seconds, sizes in bytes, errors as
fractions).

Per metric the error is |mean_sim - mean_real| / mean_real over a run's steps, the first
`WARMUP_STEPS` skipped on both sides (cold caches, thread start-up and allocator warm-up belong to
neither model). Metrics: latency_s (per-token latency), io_s, compute_s, bytes_read, and where both
sides' records have them stall_s and mem_mgmt_s (the parts of the latency spent waiting for reads
and moving cache rows) and the compute's two phases: ffn_compute_s (the sparse FFN: gathering the
computed rows and their products) and other_compute_s (compute_s - ffn_compute_s: attention,
lm_head and the framework around them). Grids kept before the records carried the FFN's compute
(`ffn_compute_s` NaN) are scored without the phases. Summaries over configurations: median, p90
and max (`summarize`); the groups mode x bundling x prefetch with signed errors (`per_group`).

With repeated real runs (--repeats) the real mean is the mean over the runs, their spread is the
noise floor, and how far the host repeats itself is scored on the headline's scale
(`repeatability`): each real pass alone, against the simulator and against the mean of the other
passes. On a shared host whose state moves over minutes the second is the floor under the first: no
model of the machine's typical run can be checked closer than the runs agree with each other.
`convergence` says whether more passes would help: the simulator against the mean of n passes for
each n, and an estimate of the error that unlimited passes would leave (the simulator's squared
error less the sampling variance of the passes' mean). What stays is the model's error plus the
calibration's (the host's state while it was calibrated against its average state over the passes):
more --repeats cannot narrow that part.

Over several kept grids (`--rescore A B ...`), `between_grids` scores the host against itself: the
real runs of one grid against another's on the configurations they share, raw and after one factor
per mode. That is the floor under the calibration's part: two measurements of the same
configurations that disagree by x after the best single factor leave no simulator calibrated once
closer than about x / sqrt(2) to each. Its counterpart for the simulator is `level_removed`: the
simulator's error after one factor per mode, shape-only, its factor fitted on the calibration's runs
and never on the runs it scores (a summary carries it only when some configurations were fitted on).
Every summary leads with `raw_held_out`: the error on the configurations no calibration saw, nothing
divided out: the figure to quote.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

METRICS = ("latency_s", "io_s", "compute_s", "bytes_read")
OPTIONAL_METRICS = ("stall_s", "mem_mgmt_s", "ffn_compute_s", "other_compute_s")   # where both sides have them
DERIVED_METRICS = {"other_compute_s": lambda t: t.compute_s - t.ffn_compute_s}
WARMUP_STEPS = 2
# the metrics the floor and the pass rule cover: the total per token, its I/O and its compute
FLOOR_METRICS = ("latency_s", "io_s", "compute_s")
# the pass rule's fixed targets (median, p90) and how far above the host's own p90 the simulator's may be
TARGET_MEDIAN, TARGET_P90, FLOOR_P90_FACTOR = 0.05, 0.10, 1.25
MAX_SUBSETS = 64   # `convergence` scores at most this many subsets of n passes per configuration


def rel_error(sim: float, real: float) -> float:
    if real == 0:
        return 0.0 if sim == 0 else float("inf")
    return abs(sim - real) / abs(real)


def compare(real_tokens: list, sim_tokens: list, repeats: list[list] | None = None) -> dict[str, dict[str, float]]:
    """Per metric: real and simulated means over the measured steps, and the relative error (the
    OPTIONAL_METRICS only when both sides' records have them). `repeats`: the records of further
    real runs of the same configuration; the real mean is then the mean over all runs, `spread`
    = (max - min) / min of the runs' means (the real runs' own disagreement), and each run is also
    scored alone (leave one out, `summarize`'s `repeatability`): `pass_errors`, the simulator's
    error against that run, and `rest_errors`, the error of the other runs' mean against it."""
    out = {}
    runs = [real_tokens, *(repeats or [])]
    both = [toks[0] for toks in (*runs, sim_tokens) if toks]
    extra = [m for m in OPTIONAL_METRICS if len(both) == len(runs) + 1 and all(_has(t, m) for t in both)]
    for m in (*METRICS, *extra):
        means = np.array([np.mean([_value(t, m) for t in toks[WARMUP_STEPS:]]) for toks in runs], float)
        s = float(np.mean([_value(t, m) for t in sim_tokens[WARMUP_STEPS:]]))
        real = float(means.mean())
        out[m] = {"real": real, "sim": s, "error": rel_error(s, real)}
        if len(runs) > 1:
            out[m]["spread"] = rel_error(float(means.max()), float(means.min())) if real else 0.0
            out[m]["real_runs"] = means.tolist()
            rest = (means.sum() - means) / (len(means) - 1)
            out[m]["pass_errors"] = [rel_error(s, float(x)) for x in means]
            out[m]["rest_errors"] = [rel_error(float(r), float(x)) for r, x in zip(rest, means)]
    return out


def _value(token: Any, metric: str) -> float:
    derive = DERIVED_METRICS.get(metric)
    return derive(token) if derive else getattr(token, metric)


def _has(token: Any, metric: str) -> bool:
    """Whether a record carries `metric` (a NaN is a column kept before the records had it)."""
    try:
        return bool(np.isfinite(_value(token, metric)))
    except AttributeError:
        return False


def error_stats(errors: Any) -> dict[str, float]:
    """median, p90 and max of relative errors."""
    e = np.asarray(errors, float)
    return {"median": float(np.median(e)), "p90": float(np.percentile(e, 90)), "max": float(e.max())}


def median_range(values: Any) -> dict[str, float]:
    """median, min and max of values (a score over grids or pairs of grids)."""
    v = np.asarray(values, float)
    return {"median": float(np.median(v)), "min": float(v.min()), "max": float(v.max())}


def per_mode_factor(modes: list[str], ratios: Any) -> tuple[dict[str, float], np.ndarray]:
    """The median of `ratios` per mode (in first-seen order), and every ratio divided by its mode's:
    one factor per mode taken out (`level_removed`, `between_grids`)."""
    modes_a, r = np.asarray(modes), np.asarray(ratios, float)
    factor = {m: float(np.median(r[modes_a == m])) for m in dict.fromkeys(modes)}
    return factor, r / np.array([factor[m] for m in modes])


def repeatability(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Each real pass of each configuration scored alone, on the same footing by the simulator and
    by the mean of the configuration's other passes (`compare`'s `pass_errors` / `rest_errors`,
    pooled over configurations and passes): per metric {"simulator": stats, "other_passes": stats}
    (`error_stats`). The other passes' error is what the host's own repeatability allows: a model
    that predicted the typical real run exactly would score about that against a single pass, so a
    simulator error at or below it cannot be told from the host's noise. {} without repeated runs."""
    out = {}
    for m in metrics_of(rows):
        sim = [e for r in rows for e in r["metrics"].get(m, {}).get("pass_errors", [])]
        rest = [e for r in rows for e in r["metrics"].get(m, {}).get("rest_errors", [])]
        if sim and rest:
            out[m] = {"simulator": error_stats(sim), "other_passes": error_stats(rest)}
    return out


def convergence(rows: list[dict[str, Any]], metric: str = "latency_s") -> dict[str, Any]:
    """How the simulator's error on `metric` falls as more real passes are averaged (module docstring);
    {} without repeated runs.

    `by_passes`: for n = 1 .. the most passes a configuration has, `error_stats` of the simulator
    against the mean of n of a configuration's passes, pooled over the configurations with n or more
    and over their subsets of n passes (all of them, or MAX_SUBSETS spread evenly over them in
    itertools.combinations order). `unlimited`: `error_stats` over the configurations of
    sqrt(max(0, d^2 - v)), with d = (sim - mean) / mean over the configuration's P passes and v =
    their sample variance (ddof 1) / mean^2 / P, the variance of that mean: d^2 - v is an unbiased
    estimate of the squared error against the mean of unlimited passes, so this is what more passes
    cannot remove (noise the passes share, such as the calibration's moment, stays in it)."""
    items = [(m["sim"], np.asarray(m["real_runs"], float)) for r in rows
             if len((m := r["metrics"].get(metric, {})).get("real_runs", ())) > 1]
    if not items:
        return {}
    by_passes = []
    for n in range(1, max(len(x) for _, x in items) + 1):
        errors = []
        for sim, x in items:
            if len(x) < n:
                continue
            errors += [rel_error(sim, float(x[list(c)].mean())) for c in _subsets(len(x), n)]
        by_passes.append({"passes": n, "configs": sum(len(x) >= n for _, x in items), **error_stats(errors)})
    left = []
    for sim, x in items:
        mean = float(x.mean())
        d2 = ((sim - mean) / mean) ** 2 if mean else 0.0
        v = float(x.var(ddof=1)) / mean ** 2 / len(x) if mean else 0.0
        left.append(float(np.sqrt(max(0.0, d2 - v))))
    return {"by_passes": by_passes, "unlimited": error_stats(left)}


def _subsets(p: int, n: int) -> list[tuple[int, ...]]:
    """The subsets of n of range(p) `convergence` scores: all of them in itertools.combinations
    (lexicographic) order, or MAX_SUBSETS spread evenly over that order, each found from its rank
    without listing the others (C(p, n) grows past memory for a few dozen passes)."""
    total = math.comb(p, n)
    if total <= MAX_SUBSETS:
        return list(itertools.combinations(range(p), n))
    return [_combination(p, n, int(r)) for r in np.linspace(0, total - 1, MAX_SUBSETS).round()]


def _combination(p: int, n: int, rank: int) -> tuple[int, ...]:
    """The rank-th n-subset of range(p) in lexicographic order."""
    out, first = [], 0
    for left in range(n, 0, -1):
        while (c := math.comb(p - first - 1, left - 1)) <= rank:   # subsets that start at `first`
            rank -= c
            first += 1
        out.append(first)
        first += 1
    return tuple(out)


def summarize(rows: list[dict[str, Any]], exclude: Any = ()) -> dict[str, Any]:
    """Error statistics over configurations (module docstring), the diagnostics, and `floor` (the
    simulator beside the host's repeat spread, and the pass rule; `exclude`: configuration labels a
    fitting step saw, left out of the floor's score)."""
    if not rows:
        return {"n_configs": 0, "latency_error_median": None, "latency_error_p90": None, "latency_error_max": None,
                "per_metric": {}}
    per, noise = {}, {}
    for m in metrics_of(rows):
        per[m] = error_stats([r["metrics"][m]["error"] for r in rows if m in r["metrics"]])
        sp = [r["metrics"][m]["spread"] for r in rows if "spread" in r["metrics"].get(m, {})]
        if sp:
            noise[m] = error_stats(sp)
    lat = per["latency_s"]
    excluded = set(exclude)
    held = [r for r in rows if r.get("config") not in excluded]
    out = {"raw_held_out": raw_held_out(held, len(rows) - len(held)),
           "n_configs": len(rows), "latency_error_median": lat["median"], "latency_error_p90": lat["p90"],
           "latency_error_max": lat["max"], "per_metric": per}
    if noise:   # (max - min) / min of the repeated real runs: errors below this are noise
        out["noise_floor"] = noise
    fit = [r for r in rows if r.get("config") in excluded]
    level = level_removed(held, fit_rows=fit) if fit and held else {}
    if level:
        out["level_removed"] = level
    rep = repeatability(rows)
    if rep:
        out["repeatability"] = rep
        out["convergence"] = {"latency_s": convergence(rows)}
    out["floor"] = floor(rows, exclude)
    return out


def floor(rows: list[dict[str, Any]], exclude: Any = ()) -> dict[str, Any]:
    """The simulator's error beside the host's own repeat spread, per FLOOR_METRICS, and the pass rule.

    Both are scored on one footing, one real pass at a time (`compare`'s `pass_errors` and
    `rest_errors`), pooled over the configurations and their passes:
      sim_error:   |sim - pass| / pass, the simulator against that pass;
      real_repeat: |mean of the configuration's other passes - pass| / pass, the host against itself.
    A model that predicted the host's typical run exactly would score about real_repeat, so that is
    the floor a shared host puts under any check; `excess_p50` / `excess_p90` = sim - repeat. The
    rule per metric: sim_error_p50 <= max(TARGET_MEDIAN, real_repeat_p50) and sim_error_p90 <=
    max(TARGET_P90, FLOOR_P90_FACTOR x real_repeat_p90); `pass` when every metric passes. Without
    repeated passes the repeat figures are None and the fixed targets alone apply (the sim error is
    then against the single pass). `exclude`: configuration labels a fitting step saw, left out of
    the score (listed in `excluded_configs`)."""
    excluded = set(exclude)
    scored = [r for r in rows if r["config"] not in excluded] if excluded else rows
    out: dict[str, Any] = {"n_configs": len(scored),
                           "excluded_configs": sorted(excluded & {r["config"] for r in rows}) if excluded else [],
                           "rule": f"per metric: sim p50 <= max({TARGET_MEDIAN:.0%}, repeat p50) and sim p90 <= "
                                   f"max({TARGET_P90:.0%}, {FLOOR_P90_FACTOR:g} x repeat p90)",
                           "metrics": {}}
    ok = bool(scored)
    for m in FLOOR_METRICS:
        entries = [r["metrics"][m] for r in scored if m in r["metrics"]]
        if not entries:
            continue
        sim = [e for x in entries for e in x.get("pass_errors", [x["error"]])]
        rest = [e for x in entries for e in x.get("rest_errors", [])]
        s50, s90 = float(np.median(sim)), float(np.percentile(sim, 90))
        r50 = float(np.median(rest)) if rest else None
        r90 = float(np.percentile(rest, 90)) if rest else None
        limit50 = max(TARGET_MEDIAN, r50 or 0.0)
        limit90 = max(TARGET_P90, FLOOR_P90_FACTOR * (r90 or 0.0))
        passed = s50 <= limit50 and s90 <= limit90
        ok = ok and passed
        out["metrics"][m] = {"sim_error_p50": s50, "sim_error_p90": s90, "real_repeat_p50": r50, "real_repeat_p90": r90,
                             "excess_p50": s50 - r50 if rest else None, "excess_p90": s90 - r90 if rest else None,
                             "limit_p50": limit50, "limit_p90": limit90, "pass": passed}
    out["pass"] = ok and bool(out["metrics"])
    return out


def raw_held_out(rows: list[dict[str, Any]], n_fitted: int = 0, metric: str = "latency_s") -> dict[str, Any]:
    """The score a user reads first: the simulator's error on `metric` over the configurations no
    calibration step saw (`rows`, the fitted ones already left out), nothing divided out; median,
    p90 and max over configurations of |mean sim - mean real| / mean real."""
    errs = [r["metrics"][metric]["error"] for r in rows if metric in r["metrics"]]
    return {"metric": metric, "n_configs": len(errs), "n_fitted_left_out": n_fitted,
            **(error_stats(errs) if errs else {"median": None, "p90": None, "max": None})}


def _ratios(rows: list[dict[str, Any]], metric: str) -> list[tuple[str, float]]:
    return [(r["mode"], m["sim"] / m["real"]) for r in rows
            if "mode" in r and (m := r["metrics"].get(metric)) and m.get("real", 0) > 0 and m.get("sim", 0) > 0]


def level_removed(rows: list[dict[str, Any]], metric: str = "latency_s",
                  fit_rows: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Shape-only, never the score: the simulator's error on `metric` over `rows` with a level taken
    out, one factor per mode (`factor`: the median of sim / real over the mode's `fit_rows`)
    dividing every simulated value of that mode; `error_stats` of what is left. The factor is fitted
    on the calibration's runs (`fit_rows`: `summarize` passes the configurations a fitting step
    saw, and scores the others), never on the runs it scores, so what is left is the model's shape
    plus a level the calibration did not catch. `fit_rows=None` fits on `rows` themselves: an
    in-sample diagnostic (scripts/ablation.py compares machine-model terms with it), labelled so.
    Modes without fit rows are left out; {} when nothing is left."""
    fitted_in_sample = fit_rows is None
    fit = _ratios(rows if fit_rows is None else fit_rows, metric)
    if not fit:
        return {}
    factor, _ = per_mode_factor([m for m, _ in fit], [x for _, x in fit])
    left = np.array([x / factor[m] for m, x in _ratios(rows, metric) if m in factor])
    if left.size == 0:
        return {}
    return {"metric": metric, "shape_only": True,
            "fitted_on": "the scored runs (in sample)" if fitted_in_sample else f"{len(fit)} calibration run(s)",
            "factor": factor, **error_stats(np.abs(left - 1))}


def signed_error(metric: dict[str, float]) -> float:
    """(sim - real) / real of one metric's entry in `compare`: > 0 = the simulator is slow."""
    return (metric["sim"] - metric["real"]) / metric["real"] if metric["real"] else 0.0


def per_group(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The configurations grouped by mode x bundling x prefetch (the windows and budgets pooled),
    in grid order: per group the signed median latency and I/O errors (the direction the model is
    off in: a group whose sign holds over grids is the model's, one that flips with the host's
    state at calibration is the host's) with the signed latency error's quartiles, the signed
    median compute error (in unbundled model mode with a delta prefetch the real decoder computes
    slowly through the time the simulator books as a stall: compare compute plus stall there) and,
    where the records carry them, its two phases' (`ffn_compute_signed_median`,
    `other_compute_signed_median`: which side of the compute the error is on), the |latency error|
    median and p90, the median |drift-corrected| error where the rows have one, and with repeated
    runs each pass scored alone (`repeatability`'s latency medians: `pass_latency_error_median`,
    the simulator's, and `rest_latency_error_median`, the other passes'; None with one run): a
    group whose simulator error stays above its other passes' is where the model, not the host, is
    off."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["mode"], r["bundled"], r["prefetch"]), []).append(r)
    out = []
    for (mode, bundled, prefetch), rs in groups.items():
        lat = np.array([signed_error(r["metrics"]["latency_s"]) for r in rs])
        g = {"mode": mode, "bundled": bundled, "prefetch": prefetch, "n_configs": len(rs),
             "latency_signed_median": float(np.median(lat)), "latency_error_median": float(np.median(np.abs(lat))),
             "latency_error_p90": float(np.percentile(np.abs(lat), 90)),
             "latency_signed_q25": float(np.percentile(lat, 25)), "latency_signed_q75": float(np.percentile(lat, 75))}
        for m in ("io_s", "compute_s", "ffn_compute_s", "other_compute_s"):   # the phases only where recorded
            v = [signed_error(r["metrics"][m]) for r in rs if m in r["metrics"]]
            g[f"{m[:-2]}_signed_median"] = float(np.median(v)) if v else None
        dc = [r["drift_corrected"]["latency_error"] for r in rs if r.get("drift_corrected")]
        g["drift_corrected_median"] = float(np.median(dc)) if dc else None
        alone = repeatability(rs).get("latency_s")
        g["pass_latency_error_median"] = alone["simulator"]["median"] if alone else None
        g["rest_latency_error_median"] = alone["other_passes"]["median"] if alone else None
        out.append(g)
    return out


def metrics_of(rows: list[dict[str, Any]]) -> list[str]:
    """METRICS, then each optional metric some row has."""
    return [*METRICS, *(m for m in OPTIONAL_METRICS if any(m in r["metrics"] for r in rows))]


def _matched(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, float, float]]:
    """(mode, real latency in a, real latency in b) of the configurations two reports share: the same
    mode, grid point and budget in bytes, in grids of the same steps and seed."""
    if (a.get("tokens"), a.get("seed")) != (b.get("tokens"), b.get("seed")):
        return []
    key = lambda r: (r["mode"], r["config"], r["budget_bytes"])     # noqa: E731
    bs = {key(r): r for r in b["configs"]}
    return [(r["mode"], r["metrics"]["latency_s"]["real"], bs[key(r)]["metrics"]["latency_s"]["real"])
            for r in a["configs"] if key(r) in bs]


def between_grids(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """How far the host reproduces its own real runs from one grid to another: the floor under any
    score of a simulator that is calibrated once.

    For each pair of reports (grids in the order given) that share configurations (`_matched`), on
    the real latency means r = b / a of those configurations: `factor` per mode, the median r (how
    much slower the host ran the second grid: what a calibration made at one grid's moment carries
    into the other's score), `raw` and `scaled` (`error_stats` of max(r, 1/r) - 1: how much slower
    the slower grid ran a configuration, before and after dividing by its mode's factor). `scaled` is
    what a calibration that caught each grid's host speed exactly would still leave: the two grids'
    measurements of the same configurations disagree by that much, so no simulator can come closer
    than about that to both. If the two grids stray from the host's typical run independently and
    alike, each one's share is the pair's / sqrt(2) (`share_p90`, `share_median`). `summary`: over the
    pairs, {median, min, max} of the scaled median and p90. {} with fewer than two comparable grids."""
    pairs = []
    for i, a in enumerate(reports):
        for b in reports[i + 1:]:
            matched = _matched(a, b)
            if not matched:
                continue
            r = np.array([y / x for _, x, y in matched], float)
            factor, scaled = per_mode_factor([m for m, _, _ in matched], r)
            raw_e, scaled_e = np.maximum(r, 1 / r) - 1, np.maximum(scaled, 1 / scaled) - 1
            st = error_stats(scaled_e)
            pairs.append({"a": a.get("rescored_from"), "b": b.get("rescored_from"), "n_configs": len(matched),
                          "passes": [a.get("repeats"), b.get("repeats")], "factor": factor,
                          "raw": error_stats(raw_e), "scaled": st,
                          "share_median": st["median"] / math.sqrt(2), "share_p90": st["p90"] / math.sqrt(2)})
    if not pairs:
        return {}
    return {"pairs": pairs, "summary": {f"scaled_{k}": median_range([p["scaled"][k] for p in pairs])
                                        for k in ("median", "p90")}}
