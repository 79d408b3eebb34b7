"""Measured quality in the planner (analysis/quality_table.py, analysis/quality_evidence.py): the lookup on
a hand-made table, the shipped table's provenance, the evidence chosen for a model by its size, the default
quality floor, and the planner ranking quantized against sparse configurations by it."""

from __future__ import annotations

import json
import math

import pytest

from analysis.planner import plan
from analysis.quality_evidence import DEFAULT_MAX_PPL_RATIO, parse_max_ppl_ratio, quality_evidence
from analysis.quality_table import QualityTable, config_bits, load_quality_table, published
from devices import load_model, load_profile
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
    p2 = plan(smol, smol.spec, nano, grid=GRID, quality=lossy, min_agreement=floor, max_ppl_ratio=None)
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


def test_smollm2_measurement_is_not_applied_to_a_3b_model() -> None:
    """A 135M model loses far more to int4 than a 3B one: a 3B plan takes the published ratio nearest in size."""
    table = load_quality_table()
    ev = quality_evidence(load_model("llama-3.2-3b"), table)
    assert ev.table is None and "smollm2-135m" in ev.skipped
    q4 = ev.lookup(4, 1.0)
    assert q4["ppl_ratio"] == pytest.approx(8.9700 / 8.5302, abs=1e-4) and q4["agreement"] is None  # not x1.214, 0.651
    assert q4["evidence"]["kind"] == "published" and "OpenLLaMA-3B-v2 Q4_0" in q4["evidence"]["short"]
    assert "ggml-org/ci" in q4["evidence"]["source"] and "3.43B" in q4["evidence"]["source"]
    assert ev.lookup(8, 1.0)["ppl_ratio"] == pytest.approx(1.0046, abs=1e-4)
    assert ev.lookup(None, 1.0)["evidence"]["kind"] == "exact"
    assert ev.lookup(None, 0.9) is None and ev.lookup(4, 0.9) is None   # sparse: nothing measured at 3B
    assert ev.unknown()["kind"] == "none" and "--quality-table" in ev.unknown()["source"]
    assert "LLaMA-7B Q4_0" in quality_evidence(load_model("mistral-7b"), table).lookup(4, 1.0)["basis"]
    smol = quality_evidence(load_model("smollm2-135m"), table).lookup(4, 1.0)
    assert smol["evidence"]["kind"] == "measured" and smol["agreement"] == pytest.approx(0.651, abs=1e-3)
    # a table measured on a local model of the planned size rates its sparse configurations too
    doc = _doc()
    doc["model"] = {"name": "my-local-3b", "total_params": 3_000_000_000}
    local = quality_evidence(load_model("llama-3.2-3b"), QualityTable(doc))
    q = local.lookup(None, 0.9)
    assert q["evidence"]["kind"] == "measured" and q["ppl_ratio"] == pytest.approx(1.01)


GRID_3B = (("quantized", ("quantized.bits=8",)), ("quantized", ("quantized.bits=4",)), ("llm-in-a-flash", ("window.k=5",)))


def test_default_floor_keeps_int4_from_best_on_a_3b_model(smol) -> None:
    """The old plan named int4 best for Llama-3.2-3B (agreement 0.65, SmolLM2's): under the default floor
    (perplexity <= 1.05x, OpenLLaMA-3B's Q4_0 is x1.052) the best is int8, and every row names its evidence."""
    nano = load_profile("jetson-orin-nano-8gb")
    p = plan(smol, load_model("llama-3.2-3b"), nano, grid=GRID_3B, rescale=True, tolerance_bytes=4 * 2**30,
             max_ppl_ratio=DEFAULT_MAX_PPL_RATIO)
    rows = {r["label"]: r for r in p.rows}
    int4 = rows["quantized quantized.bits=4"]
    assert int4["tokens_per_s"] == max(r["tokens_per_s"] for r in p.rows)   # the fastest, and refused
    assert not int4["feasible"] and int4["reasons"] == [
        "quality too low: perplexity x1.0516 > 1.05 (published: OpenLLaMA-3B-v2 Q4_0)"]
    assert p.best["label"] == "quantized quantized.bits=8" and p.best["ppl_ratio"] <= DEFAULT_MAX_PPL_RATIO
    sparse = rows["llm-in-a-flash window.k=5"]
    assert sparse["quality_evidence"]["kind"] == "none" and sparse["reasons"][0].startswith("quality unknown")
    assert [r["quality_evidence"]["kind"] for r in p.rows] == ["published", "published", "none"]
    floor = p.quality["floor"]
    assert floor["max_ppl_ratio"] == 1.05 and "at most 1.05x the native model's" in floor["rule"]
    assert any("OpenLLaMA-3B-v2 (3.43B parameters, nearest in size" in n for n in p.notes)
    # the user lowers the floor: int4 is then the best
    p2 = plan(smol, load_model("llama-3.2-3b"), nano, grid=GRID_3B[:2], rescale=True, tolerance_bytes=4 * 2**30,
              max_ppl_ratio=1.06)
    assert p2.best["label"] == "quantized quantized.bits=4" and "1.06x" in p2.quality["floor"]["rule"]


def test_max_ppl_ratio_parsing() -> None:
    assert parse_max_ppl_ratio("1.1") == 1.1 and parse_max_ppl_ratio("none") is None
    for bad in ("0.9", "x", "nan"):
        with pytest.raises(FlashsimError, match="--max-ppl-ratio"):
            parse_max_ppl_ratio(bad)


@pytest.mark.slow   # the whole 3B plan (~20 s on the shared host)
def test_plan_cli_3b_names_a_best_that_meets_the_printed_floor(capsys) -> None:
    from flashsim.commands.plan import print_plan, run_plan
    from flashsim.main import build_parser

    args = build_parser().parse_args(["plan", "--model", "llama-3.2-3b", "--device", "jetson-orin-nano-8gb"])
    p = run_plan(args)   # one plan, read both ways (the CLI prints one or the other)
    d = json.loads(json.dumps(p.to_json()))
    floor = d["quality"]["floor"]
    assert d["best"]["ppl_ratio"] <= floor["max_ppl_ratio"] == 1.05
    assert d["best"]["label"] != "quantized quantized.bits=4"
    assert all(r["quality_evidence"] for r in d["configurations"] if r["fits"])
    print_plan(p)
    out = capsys.readouterr().out
    assert "quality floor: best is the fastest configuration whose perplexity is at most 1.05x" in out
    assert "published: OpenLLaMA-3B-v2 Q8_0" in out and "none at this size" in out


def test_plan_cli_bad_quality_options_are_one_line_errors(tmp_path, capsys) -> None:
    from flashsim.main import main

    base = ["plan", "--model", "llama-3.2-3b", "--device", "jetson-orin-nano-8gb"]
    for extra, expect in ((["--max-ppl-ratio", "0.9"], "--max-ppl-ratio 0.9: must be a number >= 1"),
                          (["--max-ppl-ratio", "lots"], "--max-ppl-ratio 'lots'"),
                          (["--quality-table", str(tmp_path / "none.json")], "no quality table")):
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err
        assert expect in err and len(err.strip().splitlines()) == 1, err
