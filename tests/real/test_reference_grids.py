"""The simulator against stored real runs: the reference grids in tests/real/data/grids/, each a whole
kept grid (`flashsim validate --keep`, real/validation/validate_keep.py: 40 configurations per mode, shape and
model, 24 steps) made right after calibrating the host, with that calibration as its profile.yaml
(scripts/reference_grid.py makes one on any host):

    25a  Intel Xeon VM, 3 passes
    29b  AMD EPYC VM, 5 passes (its calibration is devices/profiles/this-host.yaml's)
    31a  the EPYC VM on another boot, its disk 0.4-0.64x as fast as 29b's calibration, 3 passes

Nothing here compares with a number the code wrote: each figure is recomputed from runs.parquet.

The check is validate's pass rule exactly (real/validation/validate_score.py `floor`, issue 44), with
nothing taken out: per metric (total per token, I/O, compute), pooled over configurations and passes,
the simulator against each real pass alone (|sim - pass| / pass) has median <= max(5%, repeat median)
and p90 <= max(10%, 1.25 x repeat p90), where repeat is the leave-one-out error of the host against
itself (|mean of the configuration's other passes - pass| / pass). By that rule every grid FAILS
today; the test asserts the documented verdict per metric (docs/calibrate-and-validate.md, "What holds
today", says which and why), so a change that moves a verdict must move the documentation with it:

    25a  FAIL  total 15.0% / 22.0% vs 5.0% / 10.0%; I/O 5.9% / 14.9% vs 5.0% / 12.0%;
               compute 22.1% / 82.3% vs 5.0% / 12.1%
    29b  FAIL  total 22.4% / 35.9% vs 9.9% / 32.4%; I/O 17.6% / 33.7% vs 10.5% / 32.5%;
               compute 25.1% / 77.6% vs 10.5% / 33.4%
    31a  FAIL  total and I/O pass (13.3% / 35.6% vs 16.2% / 48.7%; 17.3% / 38.2% vs 20.8% / 67.4%);
               compute fails (25.4% / 81.6% vs 10.3% / 28.7%)

Why: the simulator runs faster than the grid's real runs. In shape mode the whole latency is off by
about one level (sim / real 0.75-0.82: the host was slower during the grid than while it was
calibrated); in model mode the compute is 35% short at the median and up to 85% for unbundled reads
with prefetch (framework compute slowed by the reader threads more than the profile's host-CPU terms
give).

The default run checks one grid (25a); the other two are in the slow tier (each rescore replays 80
configurations: tens of seconds on 2 cores).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from devices import load_profile
from real.validation.validate_keep import RUNS_FILE, load_kept_grid, rescore
from real.validation.validate_score import WARMUP_STEPS

GRIDS = Path(__file__).resolve().parent / "data" / "grids"
REFERENCE = ("25a", "29b", "31a")
FAST = "25a"
TARGET_MEDIAN, TARGET_P90, P90_FACTOR = 0.05, 0.10, 1.25


def grid_params() -> list:
    return [pytest.param(g, marks=() if g == FAST else pytest.mark.slow, id=g) for g in REFERENCE]


@pytest.fixture(scope="module", params=grid_params())
def scored(request) -> tuple[Path, dict]:
    """(grid folder, its rescore report on its own calibration), once per grid for the module."""
    keep = GRIDS / request.param
    return keep, rescore(keep)


def real_pass_means(keep: Path, metric: str = "latency_s") -> np.ndarray:
    """[config, pass] mean per-token `metric` of each real run, the first WARMUP_STEPS skipped, read
    straight from runs.parquet (independently of the scoring code)."""
    import pandas as pd

    df = pd.read_parquet(keep / RUNS_FILE, columns=["config", "pass", "token", metric])
    df = df.sort_values(["config", "pass", "token"])
    means = df.groupby(["config", "pass"])[metric].apply(lambda s: s.iloc[WARMUP_STEPS:].mean())
    return means.unstack("pass").to_numpy()


def test_the_three_reference_grids_are_there():
    for name in REFERENCE:
        doc = load_kept_grid(GRIDS / name)
        assert (GRIDS / name / "profile.yaml").is_file()
        assert doc["version"] == 2 and not doc["quick"] and doc["repeats"] >= 3 and doc["tokens"] == 24
        assert sorted(doc["modes"]) == ["model", "shape"] and len(doc["configs"]) == 80


def test_the_simulator_reads_exactly_the_bytes_the_real_reader_read(scored):
    # every pass of every configuration of both modes: padding and coalescing included
    _, rep = scored
    assert rep["n_configs"] == 80
    assert all(e == 0.0 for c in rep["configs"] for e in c["metrics"]["bytes_read"]["pass_errors"])


# validate's pass rule on each grid, as measured (module docstring): {metric: (sim p50, sim p90, pass)}
DOCUMENTED = {
    "25a": {"latency_s": (0.150, 0.220, False), "io_s": (0.059, 0.149, False), "compute_s": (0.221, 0.823, False)},
    "29b": {"latency_s": (0.224, 0.359, False), "io_s": (0.176, 0.337, False), "compute_s": (0.251, 0.776, False)},
    "31a": {"latency_s": (0.133, 0.356, True), "io_s": (0.173, 0.382, True), "compute_s": (0.254, 0.816, False)},
}


def pass_rule(keep: Path, rep: dict, metric: str) -> dict:
    """validate's pass rule on one metric, recomputed from runs.parquet and the report's simulated means:
    the simulator against each pass alone, the host's leave-one-out repeat error, the limits."""
    runs = real_pass_means(keep, metric)
    sim = np.array([c["metrics"][metric]["sim"] for c in rep["configs"]])
    n = runs.shape[1]
    sim_err = np.abs(sim[:, None] - runs) / runs
    others = (runs.sum(axis=1, keepdims=True) - runs) / (n - 1)
    repeat = np.abs(others - runs) / runs
    r50, r90 = float(np.median(repeat)), float(np.percentile(repeat, 90))
    s50, s90 = float(np.median(sim_err)), float(np.percentile(sim_err, 90))
    lim50, lim90 = max(TARGET_MEDIAN, r50), max(TARGET_P90, P90_FACTOR * r90)
    return {"sim_p50": s50, "sim_p90": s90, "limit_p50": lim50, "limit_p90": lim90,
            "pass": s50 <= lim50 and s90 <= lim90}


def test_validates_pass_rule_exactly_gives_the_documented_verdict(scored):
    """No level taken out, the leave-one-out repeat error (not the passes' full range): the rule
    `flashsim validate` applies. The verdict and the simulator's figures are those documented."""
    keep, rep = scored
    real = real_pass_means(keep).mean(axis=1)
    # the report pairs the same real runs with the same configurations
    assert real == pytest.approx([c["metrics"]["latency_s"]["real"] for c in rep["configs"]], rel=1e-9)
    verdicts = {}
    for metric, (p50, p90, passes) in DOCUMENTED[keep.name].items():
        mine = pass_rule(keep, rep, metric)
        code = rep["floor"]["metrics"][metric]
        # the scoring code and this independent recomputation agree
        assert mine["sim_p50"] == pytest.approx(code["sim_error_p50"], rel=1e-6)
        assert mine["limit_p90"] == pytest.approx(code["limit_p90"], rel=1e-6)
        assert mine["pass"] == code["pass"]
        # and what the documentation says holds (figures to 0.1 point)
        assert mine["sim_p50"] == pytest.approx(p50, abs=1e-3) and mine["sim_p90"] == pytest.approx(p90, abs=1e-3)
        verdicts[metric] = mine["pass"]
        assert mine["pass"] == passes, f"{keep.name} {metric}: {mine}; update the docs' verdict if this moved"
    assert rep["floor"]["pass"] == all(verdicts.values())


# 31a scored on 29b's calibration (module docstring of the test below): what was measured
CROSS_BOOT = {"raw_median": 0.568, "raw_p90": 0.604, "shape_median": 0.440, "shape_p90": 0.484,
              "verdict": {"latency_s": False, "io_s": False, "compute_s": False}}


def cross_boot() -> dict:
    """31a's real runs against the simulator on 29b's calibration: the raw held-out latency error,
    validate's pass rule per metric, and the shape-only error with one factor per mode fitted on the
    calibration boot's own grid (29b's runs against the simulator on 29b's profile), never on 31a's."""
    fit, held = GRIDS / "29b", GRIDS / "31a"
    rep = rescore(held, load_profile(str(fit / "profile.yaml")))
    own = rescore(fit)
    # both grids list the same configurations in the same order (the full grid, same seed and steps)
    assert [c["config"] for c in own["configs"]] == [c["config"] for c in rep["configs"]]
    modes = np.array([c["mode"] for c in rep["configs"]])
    sim = np.array([c["metrics"]["latency_s"]["sim"] for c in rep["configs"]])
    real = real_pass_means(held).mean(axis=1)
    raw = np.abs(sim - real) / real
    fit_ratio = np.array([c["metrics"]["latency_s"]["sim"] / c["metrics"]["latency_s"]["real"] for c in own["configs"]])
    factor = {m: float(np.median(fit_ratio[modes == m])) for m in set(modes)}
    shape = np.abs(sim / np.array([factor[m] for m in modes]) - real) / real
    return {"raw_median": float(np.median(raw)), "raw_p90": float(np.percentile(raw, 90)),
            "shape_median": float(np.median(shape)), "shape_p90": float(np.percentile(shape, 90)),
            "verdict": {m: pass_rule(held, rep, m)["pass"] for m in ("latency_s", "io_s", "compute_s")}}


@pytest.mark.slow
def test_held_out_on_another_boots_calibration_gives_the_documented_figures():
    """31a replayed on 29b's calibration (the same EPYC VM, another boot: the host ran about 1.7x
    slower). The figure to quote is the raw held-out error; the shape-only figure takes out a level
    fitted on the calibration boot's runs (29b), never on the runs it scores (before, the factor was
    31a's own median, which hid the level the calibration missed)."""
    got = cross_boot()
    assert got["verdict"] == CROSS_BOOT["verdict"]
    for k in ("raw_median", "raw_p90", "shape_median", "shape_p90"):
        assert got[k] == pytest.approx(CROSS_BOOT[k], abs=1e-3), (k, got)
