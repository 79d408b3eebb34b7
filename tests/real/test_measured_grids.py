"""The validation grids committed with the repository (docs/measured/grids/): each is a whole kept
grid (real/validate_keep.py, format version 2: all 40 configurations of each mode it ran) with the
profile it was validated with, and the simulator scores it as `scores.json` says.

What this holds fixed:
* bytes: the simulator counts exactly the bytes the real reader moved in every configuration of
  both modes (padding and coalescing included). A change to the layout's accounting fails here;
* the scores: a change to the simulator that moves any grid's latency error, median or p90, on its
  own calibration or on the committed `this-host`, fails here until `scores.json` is written again
  (`python scripts/measured_scores.py`), so every fidelity change shows in the diff beside the code
  that made it, and docs/validation.md's table can be checked against it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devices import load_profile
from real.validate_keep import load_kept_grid, rescore

GRIDS = Path(__file__).resolve().parents[2] / "docs" / "measured" / "grids"
KEPT = sorted(p.parent for p in GRIDS.glob("*/grid.json"))


def test_the_committed_grids_are_there():
    assert len(KEPT) >= 2 and all((k / "profile.yaml").is_file() and (k / "scores.json").is_file() for k in KEPT)


@pytest.mark.parametrize("keep", KEPT, ids=lambda p: p.name)
def test_a_committed_grid_scores_as_recorded(keep: Path):
    doc = load_kept_grid(keep)
    assert doc["version"] == 2 and not doc["quick"] and doc["repeats"] >= 2
    expected = json.loads((keep / "scores.json").read_text())
    for key, profile in (("kept", None), ("this-host", load_profile("this-host"))):
        rep = rescore(keep, profile)
        # a whole grid of the modes it ran (29a ran shape mode alone, with eight passes)
        assert rep["n_configs"] == len(doc["configs"]) == 40 * len(doc["modes"])
        assert set(rep["per_mode"]) == set(doc["modes"])
        # bytes: exact in every real pass of every configuration (the simulator reads what the real
        # reader read; the mean over the passes may differ in its last bit)
        assert all(e == 0.0 for c in rep["configs"] for e in c["metrics"]["bytes_read"]["pass_errors"])
        got = {k: rep[k] for k in ("latency_error_median", "latency_error_p90", "latency_error_max")}
        assert got == pytest.approx(expected[key], rel=1e-9, abs=1e-12), (
            f"{keep.name} on {key}: the simulator now scores {got}; if the change is meant, run "
            "`python scripts/measured_scores.py` and update docs/validation.md")


def _real_only(keep: Path) -> dict:
    """A rescore report's real side, without replaying anything: each configuration's real latency
    mean over its passes (validate_score.compare of the runs against themselves)."""
    from real.validate_keep import ROW_KEYS, kept_runs
    from real.validate_score import compare

    doc = load_kept_grid(keep)
    rows = [{**{k: c[k] for k in ROW_KEYS}, "metrics": compare(runs[0], runs[0], runs[1:])}
            for c, runs in zip(doc["configs"], kept_runs(keep, doc))]
    return {"rescored_from": str(keep), "repeats": doc["repeats"], "tokens": doc["tokens"], "seed": doc["seed"],
            "configs": rows}


def test_the_hosts_reproducibility_between_committed_grids():
    # docs/validation.md, "The host against itself": two grids' real runs of the same configurations
    # after one factor per mode. The Intel Xeon VM's 22a and 22b agree to 5.1% p90, the EPYC VM's
    # closest pair, 29a and 29b (shape mode, minutes apart), to 8.1%, and its 28a and 30a to 18.9%
    from real.validate_score import between_grids

    def pair(a: str, b: str) -> dict:
        (p,) = between_grids([_real_only(GRIDS / a), _real_only(GRIDS / b)])["pairs"]
        return p

    intel, close, far = pair("22a", "22b"), pair("29a", "29b"), pair("28a", "30a")
    assert intel["n_configs"] == 80 and close["n_configs"] == 40 and set(close["factor"]) == {"shape"}
    assert intel["scaled"]["p90"] == pytest.approx(0.051, abs=0.0005)
    assert close["scaled"]["p90"] == pytest.approx(0.081, abs=0.0005)
    assert far["scaled"]["p90"] == pytest.approx(0.189, abs=0.0005)
    assert far["factor"] == pytest.approx({"shape": 1.155, "model": 1.309}, abs=0.0005)
