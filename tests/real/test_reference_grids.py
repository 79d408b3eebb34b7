"""The simulator against stored real runs: the reference grids in tests/real/data/grids/, each a whole
kept grid (`flashsim validate --keep`, real/validation/validate_keep.py: 40 configurations per mode, shape and
model, 24 steps) made right after calibrating the host, with that calibration as its profile.yaml
(scripts/reference_grid.py makes one on any host):

    25a  Intel Xeon VM, 3 passes
    29b  AMD EPYC VM, 5 passes (its calibration is devices/profiles/this-host.yaml's)
    31a  the EPYC VM on another boot, its disk 0.4-0.64x as fast as 29b's calibration, 3 passes

Nothing here compares with a number the code wrote: each bound comes from the real runs themselves.

The accuracy bound, on a grid's own calibration (validate's pass rule, issue 44), after the
calibration's level is taken out (one factor per mode, the median sim / real: the host's speed at the
calibration's moment against its speed during the grid, which moved 0.73-1.73x between grids on the
EPYC VM): over the configurations, the simulator's per-token latency error |sim - real| / real
(real: the mean over the passes) has median <= max(5%, the passes' spread median) and p90 <= max(10%, 1.25 x the passes'
spread p90); a configuration's spread is (max - min) / min of its passes' mean latencies, computed
here from runs.parquet. Why the spread: the calibration was measured at one moment of a host whose
speed moves over minutes, so it is one more sample of the host's state; a simulator that modelled
the machine exactly would still sit about one pass's deviation from the passes' mean, and the
passes' range is the scale of that. 5% / 10% are the project's targets, the bound where the host
repeats itself closer than that (25a's Intel VM: spread 6.6% median); 1.25 leaves the p90 room for
the calibration's own moment on top of the passes' range. The EPYC grids' spreads (32-38% median)
make their bounds loose: that is the host, and the cross-boot test below checks the model's shape
on them instead.

The default run rescores one grid (25a, the tight bound); the other two and the cross-boot test are
in the slow tier (each rescore replays 80 configurations: tens of seconds on 2 cores).
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


def real_pass_means(keep: Path) -> np.ndarray:
    """[config, pass] mean per-token latency of each real run, the first WARMUP_STEPS skipped, read
    straight from runs.parquet (independently of the scoring code)."""
    import pandas as pd

    df = pd.read_parquet(keep / RUNS_FILE, columns=["config", "pass", "token", "latency_s"])
    df = df.sort_values(["config", "pass", "token"])
    means = df.groupby(["config", "pass"]).latency_s.apply(lambda s: s.iloc[WARMUP_STEPS:].mean())
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


def test_latency_error_within_the_grids_own_repeat_floor(scored):
    keep, rep = scored
    runs = real_pass_means(keep)
    real = runs.mean(axis=1)
    sim = np.array([c["metrics"]["latency_s"]["sim"] for c in rep["configs"]])
    # the report pairs the same real runs with the same configurations
    assert real == pytest.approx([c["metrics"]["latency_s"]["real"] for c in rep["configs"]], rel=1e-9)
    modes = np.array([c["mode"] for c in rep["configs"]])
    level = np.array([np.median((sim / real)[modes == m]) for m in modes])
    error = np.abs(sim / level - real) / real
    spread = (runs.max(axis=1) - runs.min(axis=1)) / runs.min(axis=1)
    bound_median = max(TARGET_MEDIAN, float(np.median(spread)))
    bound_p90 = max(TARGET_P90, P90_FACTOR * float(np.percentile(spread, 90)))
    median, p90 = float(np.median(error)), float(np.percentile(error, 90))
    assert median <= bound_median, f"{keep.name}: latency error (level removed) median {median:.2%} > {bound_median:.2%}"
    assert p90 <= bound_p90, f"{keep.name}: latency error (level removed) p90 {p90:.2%} > {bound_p90:.2%}"


@pytest.mark.slow
def test_the_models_shape_holds_on_another_boots_calibration():
    """31a replayed on 29b's calibration (the same EPYC VM, another boot: the host ran about 1.7x
    slower, so the level is off by that). With one factor per mode taken out of both sides, what is
    left is the model's shape from configuration to configuration: its p90 stays within max(10%,
    1.25 x) how far the two grids' real runs of the same configurations disagree after the same
    treatment (each configuration's ratio of 31a's to 29b's real latency over its mode's median
    ratio): a simulator calibrated on one boot cannot be checked closer than the host reproduces its
    own runs between boots."""
    fit, held = GRIDS / "29b", GRIDS / "31a"
    rep = rescore(held, load_profile(str(fit / "profile.yaml")))
    modes = np.array([c["mode"] for c in rep["configs"]])
    sim = np.array([c["metrics"]["latency_s"]["sim"] for c in rep["configs"]])
    a, b = real_pass_means(fit).mean(axis=1), real_pass_means(held).mean(axis=1)
    # both grids list the same configurations in the same order (the full grid, same seed and steps)
    assert [c["config"] for c in load_kept_grid(fit)["configs"]] == [c["config"] for c in rep["configs"]]

    def level_out(ratio: np.ndarray) -> np.ndarray:
        """|ratio / its mode's median - 1|, the slower side over the faster."""
        r = ratio / np.array([np.median(ratio[modes == m]) for m in modes])
        return np.maximum(r, 1 / r) - 1

    model_shape_p90 = float(np.percentile(level_out(sim / b), 90))
    host_p90 = float(np.percentile(level_out(b / a), 90))
    bound = max(TARGET_P90, P90_FACTOR * host_p90)
    assert model_shape_p90 <= bound, f"shape error p90 {model_shape_p90:.2%} > {bound:.2%} (host {host_p90:.2%})"
