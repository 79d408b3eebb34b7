"""scripts/reference_grid.py's slimming of a kept grid: what rescoring reads survives unchanged, the
stored magnitudes go, and a grid it cannot slim is left as it was. (Regenerating a grid is a
calibration and a full validation: tens of minutes of real runs, not a test.)"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from devices import load_profile
from devices.errors import FlashsimError
from real.validation import validate_keep as K
from tests.real.test_validate_keep import _sim_grid
from traces.format import open_trace

pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "reference_grid.py"


def _script():
    spec = importlib.util.spec_from_file_location("reference_grid", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _kept(tmp_path: Path) -> Path:
    replays, _ = _sim_grid(tmp_path, (1.2, 1.3))
    return K.write_kept_grid(tmp_path / "kept", replays, {"profile": "this-host", "tokens": 12, "quick": True,
                                                          "seed": 0, "repeats": 2}, t0=0.0,
                             profile=load_profile("this-host"))


def test_slim_keeps_what_rescoring_reads_and_drops_the_magnitudes(tmp_path):
    keep = _kept(tmp_path)
    before = K.rescore(keep)
    (old_trace,) = {c["trace"] for c in K.load_kept_grid(keep)["configs"]}
    assert open_trace(keep / old_trace).top_k > 0
    _script().slim(keep)
    doc = K.load_kept_grid(keep)
    (new_trace,) = {c["trace"] for c in doc["configs"]}
    assert new_trace != old_trace and sorted(p.name for p in (keep / "traces").iterdir()) == [new_trace.split("/")[1]]
    assert open_trace(keep / new_trace).top_k == 0                  # the magnitudes are gone, the trace valid
    assert new_trace == f"traces/{K.trace_digest(keep / new_trace)}"  # named by its digest, as validate names them
    assert "\n" not in (keep / "grid.json").read_text()               # compact JSON
    after = K.rescore(keep)
    assert [c["metrics"] for c in after["configs"]] == [c["metrics"] for c in before["configs"]]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".kept")]   # no temporary left


def test_slim_refuses_a_grid_it_would_score_differently_and_leaves_it(tmp_path, monkeypatch):
    keep = _kept(tmp_path)
    mod = _script()
    text = (keep / "grid.json").read_text()
    calls = iter([[{"latency_s": (1.0, 1.0)}], [{"latency_s": (1.0, 2.0)}]])
    monkeypatch.setattr(mod, "_scored", lambda report: next(calls))
    with pytest.raises(FlashsimError, match="scores differently"):
        mod.slim(keep)
    assert (keep / "grid.json").read_text() == text and json.loads(text)["version"] == K.KEEP_VERSION
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".kept")]
