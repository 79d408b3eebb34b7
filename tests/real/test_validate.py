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


def tiny_grids(monkeypatch, tmp_path):
    """A tiny shape-mode spec and a tiny random llama (with its store) in place of SmolLM2."""
    import numpy as np
    import transformers

    from real.convert import convert_state_dict
    from real.store import open_store

    tiny = ModelSpec(name="validate-tiny", family="llama", n_layers=2, d_model=1024, d_ff=256, n_heads=8,
                     n_kv_heads=4, head_dim=128, vocab_size=512, ffn_kind="swiglu", dtype="fp32")
    monkeypatch.setattr(V, "validation_spec", lambda quick: tiny)
    monkeypatch.setattr(V, "grid", lambda quick: [V.GridPoint(0, True, "none", 0.5), V.GridPoint(2, False, "delta", 0.25)])
    monkeypatch.setattr(V, "model_grid", lambda quick: [V.GridPoint(0, True, "none", 0.5), V.GridPoint(2, True, "delta", 0.5)])
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=200, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    model = transformers.LlamaForCausalLM(cfg).eval()
    mspec = ModelSpec.from_hf_config(cfg.to_dict(), name="tiny-llama")
    store = open_store(convert_state_dict(model.state_dict(), mspec, tmp_path / "mstore", dtype="fp32", layout="both"))
    calls = []

    def setup(n_tokens, workdir):
        calls.append(n_tokens)
        return model, mspec, store, np.random.default_rng(0).integers(0, 200, n_tokens)

    monkeypatch.setattr(V, "model_setup", setup)
    return calls


def test_validate_json_contract_on_a_tiny_grid(monkeypatch, tmp_path, capsys):
    calls = tiny_grids(monkeypatch, tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    assert main(["validate", "--quick", "--json", "--tokens", "6", "--plot", str(tmp_path / "plots"),
                 "--workdir", str(work)]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("n_configs", "latency_error_median", "latency_error_p90", "latency_error_max", "per_metric", "per_mode"):
        assert key in out
    assert out["n_configs"] == 4 and len(out["configs"]) == 4 and calls == [6]
    assert [c["mode"] for c in out["configs"]] == ["shape", "shape", "model", "model"]
    assert set(out["per_metric"]) == set(V.METRICS)
    # both replay exactly the same reads: shape mode's rows are exactly 4 KiB; the tiny llama's 768 B bundles
    # sit in 4 KiB padded strides, which the real reads move and the simulator's layout does not count
    assert out["per_mode"]["shape"]["per_metric"]["bytes_read"]["max"] == 0.0
    pad = 1 - (3 * 64 * 4) / 4096
    assert out["per_mode"]["model"]["per_metric"]["bytes_read"]["max"] == pytest.approx(pad)
    assert out["per_mode"]["model"]["per_metric"]["bytes_read"]["median"] == pytest.approx(pad)
    assert 0.0 <= out["latency_error_median"] <= out["latency_error_max"]
    for mode in ("shape", "model"):
        pm = out["per_mode"][mode]
        assert pm["n_configs"] == 2 and set(pm["per_metric"]) == set(V.METRICS)
        errs = [c["metrics"]["latency_s"]["error"] for c in out["configs"] if c["mode"] == mode]
        assert pm["latency_error_max"] == pytest.approx(max(errs))
    assert out["per_mode"]["model"]["model"] == "tiny-llama"
    assert 0.0 <= out["per_mode"]["model"]["quality"]["greedy_agreement"] <= 1.0
    assert (tmp_path / "plots" / "validate_scatter.png").stat().st_size > 0
    assert list(work.iterdir()) == []   # temporary store and traces removed
    # one mode only; and the text report
    assert main(["validate", "--quick", "--tokens", "6", "--modes", "model", "--workdir", str(work)]) == 0
    text = capsys.readouterr().out
    assert "2 configurations (model: 2)" in text and "greedy agreement" in text


def test_store_cache_key_follows_the_source_and_settings(tmp_path, monkeypatch):
    f = tmp_path / "w.gguf"
    f.write_bytes(b"x" * 10)
    k1 = V.store_cache_key("m", str(f))
    assert V.store_cache_key("m", str(f)) == k1 and V.store_cache_key("other", str(f)) != k1
    f.write_bytes(b"x" * 11)
    k2 = V.store_cache_key("m", str(f))
    assert k2 != k1
    monkeypatch.setitem(V.STORE_SETTINGS, "dtype", "fp16")
    assert V.store_cache_key("m", str(f)) != k2


def test_cached_store_converts_once(tmp_path, monkeypatch):
    """The store cache: converted on first use, reused after, converted again when damaged."""
    import real.convert as C

    monkeypatch.setenv("FLASHSIM_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "weights.gguf"
    src.write_bytes(b"w")
    conversions = []

    def fake_convert(model, out, **kw):
        from real.convert import write_shape_store
        from tests.real.conftest import tiny_spec

        conversions.append(kw)
        return write_shape_store(tiny_spec(), out, seed=0, dtype=kw["dtype"], layout=kw["layout"], overwrite=True)

    monkeypatch.setattr(C, "convert_model", fake_convert)
    p1 = V.cached_store("m", str(src))
    assert p1.parent == tmp_path / "cache" / "stores" and len(conversions) == 1
    assert conversions[0]["dtype"] == "fp32" and conversions[0]["layout"] == "both"
    assert V.cached_store("m", str(src)) == p1 and len(conversions) == 1
    (p1 / "manifest.json").write_text("{}")                      # damaged: converted again
    assert V.cached_store("m", str(src)) == p1 and len(conversions) == 2


def test_validate_bad_input_exits_2(capsys):
    assert main(["validate", "--tokens", "2"]) == 2
    assert main(["validate", "--profile", "no-such-device"]) == 2
    assert main(["validate", "--modes", "shape,magic"]) == 2
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.slow
def test_validate_quick_end_to_end(capsys):
    assert main(["validate", "--quick", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n_configs"] >= 20 and out["per_mode"]["model"]["n_configs"] == 8  # the < 3 min target of --quick is measured in tests/benchmarks/test_bench_validate.py
