"""`flashsim validate`: the JSON contract, the error summaries, bad input."""

from __future__ import annotations

import json

import pytest

from devices.model_spec import ModelSpec
from real import validate as V
from sim.cli.main import main

pytest.importorskip("torch")


def test_summary_statistics_by_hand():
    rows = [{"metrics": {m: {"error": e} for m in V.METRICS}} for e in (0.1, 0.2, 0.3, 0.4)]
    s = V.summarize(rows)
    assert s["n_configs"] == 4
    assert s["latency_error_median"] == pytest.approx(0.25)
    assert s["latency_error_p90"] == pytest.approx(0.37)   # numpy linear: 0.3 + 0.7 * 0.1
    assert s["latency_error_max"] == pytest.approx(0.4)
    assert set(s["per_metric"]) == set(V.METRICS)


def test_compare_skips_warmup_and_uses_means():
    class T:
        def __init__(self, v):
            self.latency_s = self.io_s = self.compute_s = v
            self.bytes_read = int(v * 100)

    real = [T(9.0), T(9.0), T(1.0), T(3.0)]
    sim = [T(0.0), T(0.0), T(2.0), T(2.0)]
    c = V.compare(real, sim)
    assert c["latency_s"]["real"] == pytest.approx(2.0) and c["latency_s"]["error"] == 0.0
    assert V.rel_error(1.5, 1.0) == pytest.approx(0.5) and V.rel_error(0.0, 0.0) == 0.0


def test_full_grid_has_at_least_24_configurations():
    assert len(V.grid(quick=False)) >= 24
    assert {p.k for p in V.grid(False)} == {0, 1, 2, 4, 8}
    assert len({p.budget_fraction for p in V.grid(False)}) == 2


def test_validate_json_contract_on_a_tiny_grid(monkeypatch, tmp_path, capsys):
    tiny = ModelSpec(name="validate-tiny", family="llama", n_layers=2, d_model=1024, d_ff=256, n_heads=8,
                     n_kv_heads=4, head_dim=128, vocab_size=512, ffn_kind="swiglu", dtype="fp32")
    monkeypatch.setattr(V, "validation_spec", lambda quick: tiny)
    monkeypatch.setattr(V, "grid", lambda quick: [V.GridPoint(0, True, "none", 0.5), V.GridPoint(2, False, "delta", 0.25)])
    assert main(["validate", "--quick", "--json", "--tokens", "6", "--plot", str(tmp_path / "plots"),
                 "--workdir", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("n_configs", "latency_error_median", "latency_error_p90", "latency_error_max", "per_metric"):
        assert key in out
    assert out["n_configs"] == 2 and len(out["configs"]) == 2
    assert set(out["per_metric"]) == set(V.METRICS)
    assert out["per_metric"]["bytes_read"]["max"] == 0.0      # both replay exactly the same reads
    assert 0.0 <= out["latency_error_median"] <= out["latency_error_max"]
    assert (tmp_path / "plots" / "validate_scatter.png").stat().st_size > 0
    assert list(tmp_path.glob("flashsim-validate-*")) == []   # temporary store and traces removed


def test_validate_bad_input_exits_2(capsys):
    assert main(["validate", "--tokens", "2"]) == 2
    assert main(["validate", "--profile", "no-such-device"]) == 2
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.slow
def test_validate_quick_end_to_end(capsys):
    assert main(["validate", "--quick", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n_configs"] >= 12  # the < 3 min target of --quick is measured in tests/benchmarks/test_bench_validate.py
