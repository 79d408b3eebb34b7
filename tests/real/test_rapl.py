"""RAPL counters (real/bench/rapl.py) on a fake powercap tree: joules per zone, a wrapped counter, the
psys zone counted alone, and the one-line reason where the counters are absent (issue 46)."""

from __future__ import annotations

from pathlib import Path

import pytest

from real.bench.rapl import RaplMeter, measured_energy


def zone(root: Path, name: str, label: str, uj: int, max_uj: int = 10**9) -> Path:
    z = root / name
    z.mkdir(parents=True)
    (z / "name").write_text(label + "\n")
    (z / "energy_uj").write_text(f"{uj}\n")
    (z / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return z


def test_joules_per_zone_and_wrap(tmp_path: Path) -> None:
    pkg = zone(tmp_path, "intel-rapl:0", "package-0", 5_000_000)
    dram = zone(tmp_path / "intel-rapl:0", "intel-rapl:0:0", "dram", 999_000_000)
    m = RaplMeter(tmp_path)
    assert m.unavailable() is None and [z.name for z in m.zones] == ["package-0", "package-0/dram"]
    m.start()
    (pkg / "energy_uj").write_text("7500000\n")          # +2.5 J
    (dram / "energy_uj").write_text("500000\n")           # wrapped: +1.5 J
    j = m.stop()
    assert j["package-0"] == pytest.approx(2.5) and j["package-0/dram"] == pytest.approx(1.5)
    e = measured_energy(m, {**j, "seconds": 2.0}, token_s=0.1, tokens=10)
    assert e["watts"] == pytest.approx({"package-0": 1.25, "package-0/dram": 0.75})
    assert e["joules_per_token"] == pytest.approx((1.25 + 0.75) * 0.1) and "DRAM" in e["covers"]


def test_psys_counted_alone(tmp_path: Path) -> None:
    zone(tmp_path, "intel-rapl:0", "package-0", 0)
    zone(tmp_path, "intel-rapl:1", "psys", 0)
    m = RaplMeter(tmp_path)
    e = measured_energy(m, {"package-0": 4.0, "psys": 10.0, "seconds": 1.0}, token_s=0.5, tokens=2)
    assert e["joules_per_token"] == pytest.approx(5.0) and "psys" in e["covers"]


def test_absent_counters_say_why(tmp_path: Path) -> None:
    m = RaplMeter(tmp_path / "nope")
    assert "exposes no RAPL" in m.unavailable()
    assert measured_energy(m, None, 0.1, 3) == {"available": False, "reason": m.unavailable()}
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no intel-rapl zones" in RaplMeter(empty).unavailable()


def test_real_run_reports_energy(tmp_path: Path, capsys) -> None:
    """`real run` (shape mode) carries the measured energy (or why not) beside the simulated one."""
    import json

    pytest.importorskip("torch")
    from flashsim.main import main
    from real.runtime.shape_mode import shape_trace_like
    from real.weights.convert import write_shape_store
    from real.weights.store import open_store
    from tests.real.conftest import tiny_spec
    from traces.format import open_trace

    store = open_store(write_shape_store(tiny_spec(d_model=1024, d_ff=256, n_layers=2), tmp_path / "store", seed=3,
                                         dtype="fp32", layout="both"))
    trace = open_trace(shape_trace_like(store.spec, tmp_path / "trace", 6, seed=5, active_fraction=0.2, hot_skew=0.3))
    argv = ["real", "run", "--store", str(store.path), "--trace", str(trace.path), "--set", "window.k=2",
            "--set", "predictor.rank=0", "--dram-budget", "64MiB"]
    assert main([*argv, "--json"]) == 0
    e = json.loads(capsys.readouterr().out)["energy"]
    here = RaplMeter()
    assert e["measured"]["available"] == (here.unavailable() is None)
    assert e["measured"]["available"] or e["measured"]["reason"] == here.unavailable()
    sim = e["simulated"]
    assert sim["profile"] == "this-host" and sim["joules_per_token"] > sim["joules_per_token_without_flash"] > 0
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "energy measured" in out and "energy simulated (this-host)" in out
