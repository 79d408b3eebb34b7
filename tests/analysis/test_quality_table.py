"""Measured quality in the planner (analysis/quality_table.py): the lookup on a hand-made table, the
shipped table's provenance, and the planner ranking quantized against sparse configurations by it."""

from __future__ import annotations

import json
import math

import pytest

from analysis.planner import plan
from analysis.quality_table import QualityTable, config_bits, load_quality_table, published
from devices import load_profile
from devices.errors import FlashsimError
from traces.data import shipped_trace_path
from traces.format import open_trace


def _doc(int4_agreement: float = 0.65, int4_ppl: float = 1.2) -> dict:
    rows = [
        {"bits": None, "keep": 1.0, "mass_kept": 1.0, "agreement": 1.0, "ppl_ratio": 1.0},
        {"bits": None, "keep": 0.5, "mass_kept": 0.9, "agreement": 0.9, "ppl_ratio": 1.01},
        {"bits": None, "keep": 0.1, "mass_kept": 0.5, "agreement": 0.4, "ppl_ratio": 4.0},
        {"bits": 4, "keep": 1.0, "mass_kept": 1.0, "agreement": int4_agreement, "ppl_ratio": int4_ppl},
        {"bits": 4, "keep": 0.5, "mass_kept": 0.9, "agreement": int4_agreement - 0.05, "ppl_ratio": int4_ppl * 1.05},
    ]
    return {"kind": "flashsim-quant-quality", "model": {"name": "smollm2-135m"}, "text": {"n_tokens": 599},
            "rows": rows}


def test_lookup_hand_computed() -> None:
    t = QualityTable(_doc())
    assert t.lookup(None, 1.0)["agreement"] == 1.0 and t.lookup(4, 1.0)["ppl_ratio"] == 1.2
    mid = t.lookup(None, 0.7)          # halfway between mass 0.5 and 0.9
    assert mid["agreement"] == pytest.approx(0.65) and mid["ppl_ratio"] == pytest.approx(math.sqrt(4.0 * 1.01))
    assert not mid["bound"] and "interpolated" in mid["basis"]
    low = t.lookup(None, 0.3)          # below the curve: the lowest row, as a bound
    assert low["bound"] and low["agreement"] == 0.4 and low["ppl_ratio"] == 4.0
    assert t.lookup(8, 1.0) is None and t.lookup(None, math.nan) is None


def test_config_bits_and_published() -> None:
    assert config_bits("quantized", ("quantized.bits=8",)) == 8
    assert config_bits("quantized", ()) == 4
    assert config_bits("llm-in-a-flash", ("window.k=5", "precision=quantized", "quantized.bits=4")) == 4
    assert config_bits("selectinfer", ("selective.load_ratio=0.7",)) is None
    q4 = {e["model"]: e["ppl_ratio"] for e in published(4)}
    assert q4["LLaMA-7B"] == pytest.approx(6.1565 / 5.9066, abs=1e-4)
    assert all(e["ppl_ratio"] < 1.001 for e in published(8) if e["model"].startswith("LLaMA"))
    assert published(None) == []


def test_shipped_table_has_provenance_and_orders_int8_above_int4() -> None:
    t = load_quality_table()
    d = t.doc
    assert d["model"]["name"] == "smollm2-135m" and d["command"].startswith("flashsim real quant-quality")
    assert d["text"]["source"] == "prompts" and len(d["text"]["sha256"]) == 64 and d["date"]
    n8, n4 = t.lookup(8, 1.0), t.lookup(4, 1.0)
    assert 1.0 >= n8["agreement"] > n4["agreement"] and n8["ppl_ratio"] < n4["ppl_ratio"]
    # quality falls with the mass kept, for every precision
    for bits in (None, 8, 4):
        a = [t.lookup(bits, m)["agreement"] for m in (1.0, 0.95, 0.9, 0.8)]
        assert a == sorted(a, reverse=True)


def test_bad_table_files(tmp_path) -> None:
    with pytest.raises(FlashsimError, match="no quality table"):
        load_quality_table(tmp_path / "none.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kind": "other", "rows": []}))
    with pytest.raises(FlashsimError, match="not a quality table"):
        load_quality_table(bad)
    bad.write_text(json.dumps({"kind": "flashsim-quant-quality", "rows": [{"bits": 4}]}))
    with pytest.raises(FlashsimError, match="lacks"):
        load_quality_table(bad)


# the sparse row with the oracle predictor: it keeps ~0.62 of the mass on this trace (the preset's
# realistic predictor selects nearly every SwiGLU neuron and keeps ~0.99)
SPARSE = "llm-in-a-flash window.k=5 predictor=oracle"
GRID = (("dense", ()), ("quantized", ("quantized.bits=4",)), ("llm-in-a-flash", ("window.k=5", "predictor=oracle")))


@pytest.fixture(scope="module")
def smol():
    return open_trace(shipped_trace_path())


def test_planner_ranks_quantized_against_sparse_by_measured_quality(smol) -> None:
    nano = load_profile("jetson-orin-nano-8gb")
    # the sparse configuration's measured quality = the native curve at its simulated mass kept
    mass = {r["label"]: r["activation_mass_kept"] for r in plan(smol, smol.spec, nano, grid=GRID, quality=None).rows}
    m = mass[SPARSE]
    assert 0.5 < m < 0.95
    a_sparse = QualityTable(_doc()).lookup(None, m)["agreement"]
    lossy = QualityTable(_doc(int4_agreement=a_sparse - 0.1))
    p = plan(smol, smol.spec, nano, grid=GRID, quality=lossy)
    rows = {r["label"]: r for r in p.rows}
    q4, sparse = rows["quantized quantized.bits=4"], rows[SPARSE]
    assert q4["agreement"] == pytest.approx(a_sparse - 0.1, abs=1e-4) and q4["weight_bits"] == 4
    assert q4["published_ppl_ratio"] and sparse["weight_bits"] is None
    assert sparse["agreement"] == pytest.approx(a_sparse, abs=1e-4)
    ranking = [r["label"] for r in p.quality["ranking"]]
    assert ranking.index(SPARSE) < ranking.index("quantized quantized.bits=4")
    assert ranking[0] == "dense" and p.quality["axis"] == "agreement"
    # a floor between them excludes the quantized configuration, by its measured quality
    floor = round(a_sparse - 0.05, 3)
    p2 = plan(smol, smol.spec, nano, grid=GRID, quality=lossy, min_agreement=floor)
    rows2 = {r["label"]: r for r in p2.rows}
    assert not rows2["quantized quantized.bits=4"]["feasible"]
    assert any("quality too low: measured agreement" in x for x in rows2["quantized quantized.bits=4"]["reasons"])
    assert rows2[SPARSE]["feasible"]
    # with a better int4 the order flips
    good = QualityTable(_doc(int4_agreement=min(0.999, a_sparse + 0.05), int4_ppl=1.001))
    p3 = plan(smol, smol.spec, nano, grid=GRID, quality=good)
    ranking3 = [r["label"] for r in p3.quality["ranking"]]
    assert ranking3.index("quantized quantized.bits=4") < ranking3.index(SPARSE)


def test_planner_without_table_keeps_the_proxy(smol) -> None:
    nano = load_profile("jetson-orin-nano-8gb")
    p = plan(smol, smol.spec, nano, grid=GRID, quality=None)
    assert p.quality is None and all(r["agreement"] is None for r in p.rows)
    assert any("does not see quantization error" in n for n in p.notes)
    with pytest.raises(FlashsimError, match="--min-agreement"):
        plan(smol, smol.spec, nano, grid=GRID, quality=None, min_agreement=0.5)
    with pytest.raises(FlashsimError, match="--min-agreement 1.5"):
        plan(smol, smol.spec, nano, grid=GRID, min_agreement=1.5)


def test_plan_cli_min_agreement_json(capsys) -> None:
    from flashsim.main import main

    rc = main(["plan", "--model", "smollm2-135m", "--device", "jetson-orin-nano-8gb", "--trace",
               str(shipped_trace_path()), "--min-agreement", "0.9", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["min_agreement"] == 0.9
    rows = {r["label"]: r for r in d["configurations"]}
    int4, int8 = rows["quantized quantized.bits=4"], rows["quantized quantized.bits=8"]
    assert not int4["feasible"] and any("measured agreement" in x for x in int4["reasons"])
    assert int8["feasible"] and int8["agreement"] > 0.9 and int8["published_ppl_ratio"]
    assert d["best"]["agreement"] >= 0.9
    q = d["quality"]
    assert q["measured_on"] == "smollm2-135m" and q["axis"] == "agreement" and q["command"]
    assert [r["label"] for r in d["comparisons"][0]["rows"]] == [
        "selectinfer selective.load_ratio=0.7 selective.compute_ratio=0.4", "quantized quantized.bits=4"]


def test_plan_cli_bad_min_agreement(capsys) -> None:
    from flashsim.main import main

    assert main(["plan", "--model", "smollm2-135m", "--device", "this-host", "--min-agreement", "2"]) == 2
    err = capsys.readouterr().err
    assert "--min-agreement 2" in err and len(err.strip().splitlines()) == 1
