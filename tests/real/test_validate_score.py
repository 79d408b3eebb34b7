"""The scoring of the simulator against real runs (real/validation/validate_score.py), by hand: no real run,
no torch."""

from __future__ import annotations

import pytest

from real.validation import validate_score as S


def test_summary_statistics_by_hand():
    rows = [{"metrics": {m: {"error": e} for m in S.METRICS}} for e in (0.1, 0.2, 0.3, 0.4)]
    s = S.summarize(rows)
    assert s["n_configs"] == 4
    assert s["latency_error_median"] == pytest.approx(0.25)
    assert s["latency_error_p90"] == pytest.approx(0.37)   # numpy linear: 0.3 + 0.7 * 0.1
    assert s["latency_error_max"] == pytest.approx(0.4)
    assert set(s["per_metric"]) == set(S.METRICS)


def test_compare_skips_warmup_and_uses_means():
    class T:
        def __init__(self, v):
            self.latency_s = self.io_s = self.compute_s = v
            self.bytes_read = int(v * 100)

    real = [T(9.0), T(9.0), T(1.0), T(3.0)]
    sim = [T(0.0), T(0.0), T(2.0), T(2.0)]
    c = S.compare(real, sim)
    assert c["latency_s"]["real"] == pytest.approx(2.0) and c["latency_s"]["error"] == 0.0
    assert S.rel_error(1.5, 1.0) == pytest.approx(0.5) and S.rel_error(0.0, 0.0) == 0.0


def test_compare_with_repeats_averages_runs_and_reports_their_spread():
    class T:
        def __init__(self, v):
            self.latency_s = self.io_s = self.compute_s = v
            self.bytes_read = 100

    run = lambda v: [T(50.0), T(50.0), T(v), T(v)]   # noqa: E731  (two warm-up steps, then v)
    c = S.compare(run(2.0), run(3.0), [run(4.0), run(3.0)])
    lat = c["latency_s"]
    assert lat["real"] == pytest.approx(3.0) and lat["error"] == 0.0        # mean of 2, 4, 3
    assert lat["real_runs"] == [2.0, 4.0, 3.0] and lat["spread"] == pytest.approx((4.0 - 2.0) / 2.0)
    assert "spread" not in S.compare(run(2.0), run(3.0))["latency_s"]
    rows = [{"metrics": c}, {"metrics": S.compare(run(2.0), run(2.0), [run(2.2)])}]
    noise = S.summarize(rows)["noise_floor"]["latency_s"]
    assert noise["median"] == pytest.approx((1.0 + 0.1) / 2) and noise["max"] == pytest.approx(1.0)
    assert "noise_floor" not in S.summarize([{"metrics": S.compare(run(1.0), run(1.0))}])
    # each pass alone: the simulator (3) against 2, 4, 3 -> 0.5, 0.25, 0; the other passes' mean
    # (3.5, 2.5, 3) against the same -> 0.75, 0.375, 0
    assert lat["pass_errors"] == pytest.approx([0.5, 0.25, 0.0])
    assert lat["rest_errors"] == pytest.approx([0.75, 0.375, 0.0])
    # pooled with the second row (sim 2 against 2 and 2.2: 0, 1/11; 2.2 against 2 and 2 against 2.2: 0.1, 1/11)
    rep = S.summarize(rows)["repeatability"]["latency_s"]
    assert rep["simulator"]["median"] == pytest.approx(1 / 11) and rep["simulator"]["max"] == pytest.approx(0.5)
    assert rep["other_passes"]["median"] == pytest.approx(0.1) and rep["other_passes"]["max"] == pytest.approx(0.75)
    assert "repeatability" not in S.summarize([{"metrics": S.compare(run(1.0), run(1.0))}])
    assert [c["passes"] for c in S.summarize(rows)["convergence"]["latency_s"]["by_passes"]] == [1, 2, 3]


def test_compare_adds_stall_and_mem_mgmt_when_records_have_them():
    class T:
        def __init__(self, v, extra=True):
            self.latency_s = self.io_s = self.compute_s = v
            self.bytes_read = 100
            if extra:
                self.stall_s, self.mem_mgmt_s = v / 2, 0.0

    c = S.compare([T(1.0)] * 4, [T(1.5)] * 4)
    assert c["stall_s"]["real"] == 0.5 and c["stall_s"]["error"] == pytest.approx(0.5)
    assert c["mem_mgmt_s"]["error"] == 0.0 and c["bytes_read"]["error"] == 0.0
    assert "stall_s" not in S.compare([T(1.0, False)] * 3, [T(1.0)] * 3)
    rows = [{"metrics": c}, {"metrics": S.compare([T(1.0, False)] * 3, [T(1.0, False)] * 3)}]
    s = S.summarize(rows)
    assert list(s["per_metric"]) == [*S.METRICS, "stall_s", "mem_mgmt_s"]   # the optional ones some row has
    assert s["per_metric"]["stall_s"]["max"] == pytest.approx(0.5)   # over the rows that have it


def test_compare_scores_the_compute_phases_where_every_side_recorded_them():
    """ffn_compute_s as recorded, other_compute_s = compute_s - ffn_compute_s; a NaN (a grid kept
    before the records had the column) on any side leaves both out."""
    class T:
        def __init__(self, compute, ffn):
            self.latency_s = self.io_s = self.compute_s = compute
            self.ffn_compute_s, self.bytes_read = ffn, 100

    c = S.compare([T(10.0, 4.0)] * 4, [T(9.0, 5.0)] * 4, [[T(14.0, 4.0)] * 4])
    assert c["ffn_compute_s"]["real"] == pytest.approx(4.0) and c["ffn_compute_s"]["error"] == pytest.approx(0.25)
    # other: real (6 + 10) / 2 = 8, sim 4 -> 0.5; against each pass: 4 vs 6, 4 vs 10
    assert c["other_compute_s"]["real"] == pytest.approx(8.0) and c["other_compute_s"]["error"] == pytest.approx(0.5)
    assert c["other_compute_s"]["pass_errors"] == pytest.approx([1 / 3, 0.6])
    assert c["other_compute_s"]["rest_errors"] == pytest.approx([4 / 6, 0.4])
    nan = float("nan")
    for real, sim, more in (([T(10.0, nan)] * 4, [T(9.0, 5.0)] * 4, None), ([T(10.0, 4.0)] * 4, [T(9.0, 5.0)] * 4,
                                                                               [[T(10.0, nan)] * 4])):
        c = S.compare(real, sim, more)
        assert "ffn_compute_s" not in c and "other_compute_s" not in c and c["compute_s"]["sim"] == 9.0
    rows = [{"mode": "shape", "bundled": True, "prefetch": "none",
             "metrics": S.compare([T(10.0, 4.0)] * 4, [T(9.0, 5.0)] * 4)}]
    g = S.per_group(rows)[0]
    assert g["ffn_compute_signed_median"] == pytest.approx(0.25)           # (5 - 4) / 4
    assert g["other_compute_signed_median"] == pytest.approx(-1 / 3)       # (4 - 6) / 6


def test_per_group_by_hand():
    """Rows grouped by mode x bundling x prefetch in grid order; signed errors (sim - real) / real."""
    def row(mode, bundled, prefetch, real, sim, io_real, io_sim, cmp_sim, dc=None):   # compute: real 6.0
        r = {"mode": mode, "bundled": bundled, "prefetch": prefetch,
             "metrics": {"latency_s": {"real": real, "sim": sim}, "io_s": {"real": io_real, "sim": io_sim},
                         "compute_s": {"real": 6.0, "sim": cmp_sim}}}
        if dc is not None:
            r["drift_corrected"] = {"latency_error": dc}
        return r

    rows = [row("shape", True, "delta", 10.0, 11.0, 4.0, 5.0, 6.6, 0.02),
            row("shape", True, "delta", 10.0, 13.0, 4.0, 4.0, 6.3, 0.04),
            row("shape", True, "delta", 10.0, 9.0, 4.0, 3.0, 5.4, 0.06), row("model", False, "none", 20.0, 19.0, 8.0, 8.0, 5.4)]
    g = S.per_group(rows)
    assert [(x["mode"], x["bundled"], x["prefetch"], x["n_configs"]) for x in g] == [("shape", True, "delta", 3),
                                                                                    ("model", False, "none", 1)]
    assert g[0]["latency_signed_median"] == pytest.approx(0.1)            # of +10%, +30%, -10%
    assert g[0]["latency_error_median"] == pytest.approx(0.1)              # of 10%, 30%, 10%
    assert g[0]["latency_error_p90"] == pytest.approx(0.26)                # numpy's linear p90 of (0.1, 0.1, 0.3)
    assert g[0]["io_signed_median"] == pytest.approx(0.0)                  # of +25%, 0, -25%
    assert g[0]["drift_corrected_median"] == pytest.approx(0.04)
    # numpy's linear quartiles of (-0.1, +0.1, +0.3): 0.0 and +0.2; compute of +10%, +5%, -10%: +5%
    assert g[0]["latency_signed_q25"] == pytest.approx(0.0) and g[0]["latency_signed_q75"] == pytest.approx(0.2)
    assert g[0]["compute_signed_median"] == pytest.approx(0.05) and g[1]["compute_signed_median"] == pytest.approx(-0.1)
    assert g[1]["latency_signed_median"] == pytest.approx(-0.05) and g[1]["drift_corrected_median"] is None
    # single passes: none in these rows; two passes in the model row (simulator 0.1 and 0.3, the
    # other pass 0.2 and 0.25 against each): medians 0.2 and 0.225
    assert g[0]["pass_latency_error_median"] is None and g[0]["rest_latency_error_median"] is None
    rows[3]["metrics"]["latency_s"].update(pass_errors=[0.1, 0.3], rest_errors=[0.2, 0.25])
    g = S.per_group(rows)
    assert g[1]["pass_latency_error_median"] == pytest.approx(0.2)
    assert g[1]["rest_latency_error_median"] == pytest.approx(0.225)


def test_convergence_by_hand():
    def row(sim, runs):
        return {"metrics": {"latency_s": {"sim": sim, "real_runs": runs}}}

    rows = [row(3.0, [2.0, 4.0, 3.0]), row(2.5, [2.0, 2.2]), {"metrics": {"latency_s": {"sim": 1.0}}}]
    conv = S.convergence(rows)
    one, two, three = conv["by_passes"]
    # one pass: 3 against 2, 4, 3 (0.5, 0.25, 0) and 2.5 against 2, 2.2 (0.25, 0.3/2.2)
    assert one["configs"] == 2 and one["median"] == pytest.approx(0.25) and one["max"] == pytest.approx(0.5)
    # two: 3 against 3, 2.5, 3.5 (0, 0.2, 1/7); 2.5 against 2.1 (0.4/2.1)
    assert two["configs"] == 2 and two["median"] == pytest.approx((1 / 7 + 0.4 / 2.1) / 2)
    assert two["max"] == pytest.approx(0.2)
    # three: only the first configuration has three passes; its mean is the simulator's
    assert three["configs"] == 1 and three["max"] == 0.0
    # unlimited: the first's d^2 = 0 is below its mean's variance (floored at 0); the second's
    # d^2 = (0.4/2.1)^2 less v = 0.02 / 2.1^2 / 2
    second = ((0.4 / 2.1) ** 2 - 0.02 / 2.1 ** 2 / 2) ** 0.5
    assert conv["unlimited"]["median"] == pytest.approx(second / 2) and conv["unlimited"]["max"] == pytest.approx(second)
    assert S.convergence([rows[2]]) == {}
    summary = S.summarize([{"metrics": {m: {"error": 0.0, "sim": 1.0, "real": 1.0} for m in S.METRICS}}])
    assert "convergence" not in summary


def test_convergence_samples_many_subsets_evenly():
    runs = [1.0 + 0.01 * i for i in range(12)]     # C(12, 6) = 924 subsets of six passes
    conv = S.convergence([{"metrics": {"latency_s": {"sim": 1.0, "real_runs": runs}}}])
    assert [c["passes"] for c in conv["by_passes"]] == list(range(1, 13))
    # the extreme subsets of six lie at either end of combinations' order: both are scored
    assert conv["by_passes"][5]["max"] == pytest.approx(S.rel_error(1.0, sum(runs[6:]) / 6))
    assert conv["by_passes"][5]["p90"] < conv["by_passes"][5]["max"]


def _report(name: str, latencies: dict[tuple[str, str], float], tokens: int = 24, seed: int = 0) -> dict:
    rows = [{"mode": mode, "config": config, "budget_bytes": 1 << 20,
             "metrics": {"latency_s": {"real": real}}} for (mode, config), real in latencies.items()]
    return {"rescored_from": name, "repeats": 3, "tokens": tokens, "seed": seed, "configs": rows}


def test_between_grids_by_hand():
    # b / a: shape 1.1 and 1.2 (factor: their median 1.15), model 0.5 (factor 0.5). Raw: how much
    # slower the slower grid ran each, 0.1, 0.2 and 1.0 (2x); after the factor 1.15 / 1.1 - 1 =
    # 1/22, 1.2 / 1.15 - 1 = 1/23 and 0: median 1/23, p90 (numpy linear) 1/23 + 0.8 (1/22 - 1/23)
    a = _report("a", {("shape", "s1"): 1.0, ("shape", "s2"): 2.0, ("model", "m1"): 1.0, ("shape", "only a"): 3.0})
    b = _report("b", {("shape", "s1"): 1.1, ("shape", "s2"): 2.4, ("model", "m1"): 0.5})
    other_steps = _report("c", {("shape", "s1"): 5.0}, tokens=12)     # not the same runs: no pair with it
    out = S.between_grids([a, b, other_steps])
    (p,) = out["pairs"]
    assert (p["a"], p["b"], p["n_configs"], p["passes"]) == ("a", "b", 3, [3, 3])
    assert p["factor"] == pytest.approx({"shape": 1.15, "model": 0.5})
    assert p["raw"]["median"] == pytest.approx(0.2) and p["raw"]["max"] == pytest.approx(1.0)
    assert p["scaled"]["median"] == pytest.approx(1 / 23)
    assert p["scaled"]["p90"] == pytest.approx(1 / 23 + 0.8 * (1 / 22 - 1 / 23))
    assert p["scaled"]["max"] == pytest.approx(1 / 22)
    assert p["share_p90"] == pytest.approx(p["scaled"]["p90"] / 2 ** 0.5)
    assert out["summary"]["scaled_median"] == pytest.approx({"median": 1 / 23, "min": 1 / 23, "max": 1 / 23})
    # the order of the two grids does not change how far apart they are
    (q,) = S.between_grids([b, a])["pairs"]
    assert q["scaled"] == pytest.approx(p["scaled"]) and q["factor"]["model"] == pytest.approx(2.0)
    assert S.between_grids([a]) == {} and S.between_grids([a, other_steps]) == {}


def test_level_removed_by_hand():
    # sim / real: shape 1.0, 1.2, 1.1 (factor 1.1: what is left 1/1.1 and 1.2/1.1, off by 1/11 each,
    # and 0), model 0.5 (factor 0.5, nothing left): median of [1/11, 1/11, 0, 0] = 1/22
    def row(mode, sim, real):
        return {"mode": mode, "metrics": {m: {"sim": sim, "real": real, "error": abs(sim - real) / real if real else 0.0}
                                          for m in S.METRICS}}

    rows = [row("shape", 2.0, 2.0), row("shape", 1.2, 1.0), row("shape", 3.3, 3.0), row("model", 1.0, 2.0)]
    lv = S.level_removed(rows)     # in sample (fit_rows=None): a diagnostic, labelled so
    assert lv["factor"] == pytest.approx({"shape": 1.1, "model": 0.5})
    assert lv["median"] == pytest.approx(1 / 22) and lv["max"] == pytest.approx(1 / 11)
    assert lv["shape_only"] and lv["fitted_on"] == "the scored runs (in sample)"
    # a summary never fits the level on the runs it scores: without calibration runs, no level-removed figure
    assert "level_removed" not in S.summarize(rows)
    assert S.level_removed([row("shape", 1.0, 0.0)]) == {} and "level_removed" not in S.summarize(
        [{"metrics": {m: {"error": 0.1} for m in S.METRICS}}])


def test_level_removed_is_fitted_on_the_calibration_runs_only():
    """The factor comes from the configurations a calibration step saw (left out of the score) and
    divides the others: fitted on sim / real = 2 (the calibration runs), scored rows at 1.0 are left
    off by 1/2 (before: the factor was the scored runs' own median and left nothing)."""
    def row(cfg, sim, real):
        return {"config": cfg, "mode": "shape",
                "metrics": {m: {"sim": sim, "real": real, "error": abs(sim - real) / real} for m in S.METRICS}}

    rows = [row("fit-a", 2.0, 1.0), row("fit-b", 4.0, 2.0), row("x", 1.0, 1.0), row("y", 3.0, 3.0)]
    s = S.summarize(rows, exclude=["fit-a", "fit-b"])
    assert list(s)[0] == "raw_held_out"                           # the figure to quote comes first
    assert s["raw_held_out"]["median"] == 0.0 and s["raw_held_out"]["n_configs"] == 2
    assert s["raw_held_out"]["n_fitted_left_out"] == 2
    lv = s["level_removed"]
    assert lv["factor"] == {"shape": 2.0} and lv["median"] == pytest.approx(0.5)
    assert lv["fitted_on"] == "2 calibration run(s)" and lv["shape_only"]


def test_floor_by_hand():
    # one configuration, three passes 2, 4, 3, the simulator at 3 (test above): the simulator against
    # each pass 0.5, 0.25, 0 (p50 0.25, p90 0.45); the other passes' mean against each 0.75, 0.375, 0
    # (p50 0.375, p90 0.675): excess -0.125 / -0.225, limits max(5%, 0.375) and max(10%, 1.25 x 0.675)
    class T:
        def __init__(self, v):
            self.latency_s = self.io_s = self.compute_s = v
            self.bytes_read = 100

    run = lambda v: [T(50.0), T(50.0), T(v), T(v)]   # noqa: E731
    rows = [{"config": "a", "metrics": S.compare(run(2.0), run(3.0), [run(4.0), run(3.0)])}]
    f = S.summarize(rows)["floor"]
    lat = f["metrics"]["latency_s"]
    assert set(f["metrics"]) == {"latency_s", "io_s", "compute_s"}
    assert lat["sim_error_p50"] == pytest.approx(0.25) and lat["sim_error_p90"] == pytest.approx(0.45)
    assert lat["real_repeat_p50"] == pytest.approx(0.375) and lat["real_repeat_p90"] == pytest.approx(0.675)
    assert lat["excess_p50"] == pytest.approx(-0.125) and lat["excess_p90"] == pytest.approx(-0.225)
    assert lat["limit_p90"] == pytest.approx(1.25 * 0.675) and lat["pass"] and f["pass"]
    # a simulator at 6: against 2, 4, 3 -> 2, 0.5, 1 (p50 1 > 0.375): fails
    bad = [{"config": "a", "metrics": S.compare(run(2.0), run(6.0), [run(4.0), run(3.0)])}]
    assert not S.floor(bad)["pass"] and not S.floor(bad)["metrics"]["io_s"]["pass"]
    # one pass: no repeat spread, the fixed targets alone (error 0.04 passes 5% / 10%, 0.06 fails)
    one = S.floor([{"config": "a", "metrics": S.compare(run(1.0), run(1.04))}])
    assert one["metrics"]["latency_s"]["real_repeat_p50"] is None and one["pass"]
    assert not S.floor([{"config": "a", "metrics": S.compare(run(1.0), run(1.06))}])["pass"]
    # a configuration a fitting step saw is listed and left out of the score
    ex = S.floor(bad + rows, exclude=["a"])
    assert ex["excluded_configs"] == ["a"] and ex["n_configs"] == 0 and not ex["pass"]
