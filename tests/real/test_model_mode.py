"""Model mode: a llama-family model token by token with the FFN streamed from the store and
computed sparsely under the policy stack. Dense equivalence (every neuron kept) against the HF
forward, quality metrics, records in the simulator's schema, bad input."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from devices import load_profile
from devices.errors import FlashsimError
from devices.model_spec import ModelSpec
from sim.config import RunConfig
from sim.records import TOKEN_COLUMNS

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from real.convert import convert_state_dict
    from real.store import open_store

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=200, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    model = transformers.LlamaForCausalLM(cfg).eval()
    spec = ModelSpec.from_hf_config(cfg.to_dict(), name="tiny-llama")
    root = tmp_path_factory.mktemp("model")
    store = open_store(convert_state_dict(model.state_dict(), spec, root / "store", dtype="fp32", layout="both"))
    ids = np.random.default_rng(0).integers(0, 200, 16)
    return model, spec, store, ids, root


def _cfg(k: int, prefetch: str = "delta", bundled: bool = True, budget: str = "64MiB") -> RunConfig:
    return RunConfig().with_overrides([
        "residency=window", f"window.k={k}", "predictor=oracle", f"prefetch={prefetch}",
        f"bundling.bundled={str(bundled).lower()}", "workload.prompt_tokens=0", f"memory.dram_budget_bytes={budget}"])


@pytest.mark.parametrize("k,prefetch,bundled", [(0, "none", True), (4, "delta", False)])
def test_every_neuron_kept_matches_the_dense_forward(tiny_llama, tmp_path, k, prefetch, bundled):
    from real.model_mode import run_model

    model, spec, store, ids, _ = tiny_llama
    run, q = run_model(model, spec, store, ids, load_profile("this-host"), _cfg(k, prefetch, bundled),
                       keep_fraction=1.0, workdir=tmp_path)
    assert q["max_abs_diff"] <= 1e-4
    assert q["greedy_agreement"] == 1.0
    assert q["perplexity"] == pytest.approx(q["dense_perplexity"], rel=1e-5)
    # every neuron was computed at every step, and the cache really served or read them all
    assert all(t.computed == spec.n_layers * spec.d_ff for t in run.tokens)
    assert sum(t.bytes_read for t in run.tokens) >= spec.n_layers * spec.d_ff * store.bundle_bytes
    assert any("ORACLE" in n for n in run.notes)


def test_sparse_run_quality_and_records(tiny_llama, tmp_path):
    from real.model_mode import run_model
    from real.records import write_executed_trace
    from sim.engine import simulate
    from traces.format import open_trace

    model, spec, store, ids, _ = tiny_llama
    cfg = _cfg(2)
    run, q = run_model(model, spec, store, ids, load_profile("this-host"), cfg, keep_fraction=0.25, workdir=tmp_path)
    assert q["max_abs_diff"] > 1e-4          # dropping 75% of the neurons changes the logits ...
    assert 0.0 <= q["greedy_agreement"] <= 1.0 and np.isfinite(q["perplexity"])
    assert [f.name for f in dataclasses.fields(run.tokens[0])] == list(TOKEN_COLUMNS)
    k_active = int(np.ceil(0.25 * spec.d_ff))
    assert all(t.computed == spec.n_layers * k_active for t in run.tokens)
    ex = write_executed_trace(tmp_path / "exec", run, run.view, store.spec)
    sim = simulate(open_trace(ex), store.spec, load_profile("this-host"), cfg, fast=False)
    assert [t.computed for t in sim.tokens] == [t.computed for t in run.tokens]
    assert [t.hits for t in sim.tokens] == [t.hits for t in run.tokens]


def test_wrong_model_for_the_store(tiny_llama):
    from real.model_mode import check_store_matches

    _, spec, store, _, _ = tiny_llama
    other = spec.model_copy(update={"d_ff": spec.d_ff * 2})
    with pytest.raises(FlashsimError, match="convert the model"):
        check_store_matches(store, other)


def test_cli_model_mode_bad_input_exits_2(tiny_llama, tmp_path, capsys):
    from sim.cli.main import main

    _, _, store, _, _ = tiny_llama
    assert main(["real", "run", "--store", str(tmp_path / "missing"), "--model", "smollm2-135m",
                 "--text", "x"]) == 2
    assert main(["real", "run", "--store", str(store.path), "--model", "smollm2-135m"]) == 2   # no --text
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--text" in err


@pytest.mark.slow
def test_smollm2_dense_equivalence(tmp_path):
    """SmolLM2-135M from its store: every neuron kept -> the HF logits (<= 1e-4)."""
    from real.convert import convert_model
    from real.model_mode import run_model
    from real.store import open_store
    from traces.capture.models import load_hf_model

    loaded = load_hf_model("smollm2-135m")
    store = open_store(convert_model("smollm2-135m", tmp_path / "store", dtype="fp32"))
    ids = np.asarray(loaded.tokenizer("The quick brown fox jumps over the lazy dog. " * 2)["input_ids"])[:16]
    run, q = run_model(loaded.model, loaded.spec, store, ids, load_profile("this-host"), _cfg(0, "none", budget="2GiB"),
                       keep_fraction=1.0, workdir=tmp_path)
    assert q["max_abs_diff"] <= 1e-4 and q["greedy_agreement"] == 1.0
