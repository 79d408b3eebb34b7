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
    from real.weights.convert import convert_state_dict
    from real.weights.store import open_store

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
    from real.runtime.model_mode import run_model

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


@pytest.mark.parametrize("residency, keep, in_place", [("naive", 1.0, True), ("naive", 0.25, True),
                                                      ("dense", 1.0, True), ("dense", 0.25, False),
                                                      ("window", 1.0, False)])
def test_contiguous_rows_are_computed_in_place(tiny_llama, tmp_path, monkeypatch, residency, keep, in_place):
    """Where the simulator prices a step's FFN on contiguous rows (Residency.gathers_at: naive's rows
    read in neuron order, dense's whole FFN) the backend computes on the cache's rows without a
    gather; a window, or dense under a sparser predictor, gathers. Every neuron kept, the logits
    still match the dense forward (the down GEMV on the row layout: another summation order)."""
    import real.runtime.sparse_ffn
    from real.runtime.model_mode import run_model

    model, spec, store, ids, _ = tiny_llama
    calls = []
    gather = real.runtime.sparse_ffn.gather_rows
    monkeypatch.setattr(real.runtime.sparse_ffn, "gather_rows", lambda *a: calls.append(1) or gather(*a))
    sets = [f"residency={residency}", "predictor=oracle", "prefetch=none", "workload.prompt_tokens=0",
            "memory.dram_budget_bytes=64MiB"]
    run, q = run_model(model, spec, store, ids, load_profile("this-host"), RunConfig().with_overrides(sets),
                       keep_fraction=keep, workdir=tmp_path)
    assert (not calls) == in_place
    assert all(t.computed == spec.n_layers * round(keep * spec.d_ff) for t in run.tokens)
    if keep == 1.0:
        assert q["max_abs_diff"] <= 1e-4 and q["greedy_agreement"] == 1.0


def test_sparse_run_quality_and_records(tiny_llama, tmp_path):
    from real.runtime.model_mode import run_model
    from real.runtime.run_outputs import write_executed_trace
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
    from real.runtime.model_mode import check_store_matches

    _, spec, store, _, _ = tiny_llama
    other = spec.model_copy(update={"d_ff": spec.d_ff * 2})
    with pytest.raises(FlashsimError, match="convert the model"):
        check_store_matches(store, other)


def test_cli_model_mode_bad_input_exits_2(tiny_llama, tmp_path, capsys):
    from flashsim.main import main

    _, _, store, _, _ = tiny_llama
    assert main(["real", "run", "--store", str(tmp_path / "missing"), "--model", "smollm2-135m",
                 "--text", "x"]) == 2
    assert main(["real", "run", "--store", str(store.path), "--model", "smollm2-135m"]) == 2   # no --text
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--text" in err


@pytest.mark.slow
def test_smollm2_dense_equivalence(tmp_path):
    """SmolLM2-135M from its store: every neuron kept -> the HF logits (<= 1e-4)."""
    from real.runtime.model_mode import run_model
    from real.weights.convert import convert_model
    from real.weights.store import open_store
    from traces.capture.models import load_hf_model

    loaded = load_hf_model("smollm2-135m")
    store = open_store(convert_model("smollm2-135m", tmp_path / "store", dtype="fp32"))
    ids = np.asarray(loaded.tokenizer("The quick brown fox jumps over the lazy dog. " * 2)["input_ids"])[:16]
    run, q = run_model(loaded.model, loaded.spec, store, ids, load_profile("this-host"), _cfg(0, "none", budget="2GiB"),
                       keep_fraction=1.0, workdir=tmp_path)
    assert q["max_abs_diff"] <= 1e-4 and q["greedy_agreement"] == 1.0


# ---- predictors ------------------------------------------------------------------------------------
def test_previous_predictor_computes_the_previous_tokens_set(tiny_llama, tmp_path):
    from real.runtime.model_mode import prepare, run_prepared
    from sim import bitsets

    model, spec, store, ids, _ = tiny_llama
    ref = prepare(model, spec, store, ids, keep_fraction=0.25, workdir=tmp_path)
    cfg = _cfg(0, "none")
    run, q = run_prepared(ref, model, spec, store, load_profile("this-host"), cfg, predictor="previous")
    assert q["predictor"] == "previous" and run.config["model_predictor"] == "previous"
    assert any("PREVIOUS" in n for n in run.notes)
    executed = np.stack([bitsets.unpack(run.executed[layer], spec.d_ff) for layer in range(spec.n_layers)])
    assert np.array_equal(executed[:, 0], ref.truth[:, 0])               # token 0: its own set (no previous)
    assert np.array_equal(executed[:, 1:], ref.truth[:, :-1])            # then the previous token's true set
    # recall/precision of those sets against the truth, by hand
    used = np.concatenate([ref.truth[:, :1], ref.truth[:, :-1]], axis=1)
    tp = (used & ref.truth).sum()
    assert q["predictor_recall"] == pytest.approx(tp / ref.truth.sum())
    assert q["predictor_precision"] == pytest.approx(tp / used.sum())
    # the oracle on the same dense pass: perfect sets
    _, qo = run_prepared(ref, model, spec, store, load_profile("this-host"), cfg, predictor="oracle")
    assert qo["predictor_recall"] == qo["predictor_precision"] == 1.0
    # a budget the predicted sets do not fit: one line, not a traceback
    small = int(store.spec.non_ffn_bytes + (len(ids) + 1) * store.spec.kv_bytes_per_token
                + spec.n_layers * 10 * store.spec.ffn_neuron_bytes)          # room for ~10 neurons a layer
    with pytest.raises(FlashsimError, match="DRAM budget too small for predictor previous"):
        run_prepared(ref, model, spec, store, load_profile("this-host"), _cfg(4, "delta", budget=str(small)),
                     predictor="previous")


def test_lowrank_predictor_in_model_mode(tiny_llama, tmp_path):
    from real.runtime.model_mode import prepare, run_prepared
    from real.runtime.run_outputs import write_executed_trace
    from real.studies import predictor_train as PT
    from sim import bitsets
    from sim.engine import simulate
    from traces.format import open_trace

    model, spec, store, ids, _ = tiny_llama
    seqs = [np.random.default_rng(i).integers(0, 200, 24).tolist() for i in range(6)]
    pairs = PT.collect_pairs(model, seqs)
    pred = PT.train_from_pairs(pairs, rank=8, epochs=5, seed=0, rule="topk", fraction=0.25, meta={"model": spec.name})
    path = PT.save_predictor(pred, tmp_path / "p.safetensors")
    ref = prepare(model, spec, store, ids, keep_fraction=0.25, workdir=tmp_path / "w")
    cfg = _cfg(2)
    run, q = run_prepared(ref, model, spec, store, load_profile("this-host"), cfg, predictor=f"lowrank:{path}")
    expect = np.stack([pred.predict(layer, ref.ffn_inputs[layer]) for layer in range(spec.n_layers)])
    executed = np.stack([bitsets.unpack(run.executed[layer], spec.d_ff) for layer in range(spec.n_layers)])
    assert np.array_equal(executed, expect)                              # the predictor's sets were computed
    assert run.config["predictor"]["name"] == "recorded" and run.config["predictor"]["rank"] == 8
    assert 0.0 < q["live_agreement"] <= 1.0 and 0.0 <= q["predictor_recall"] <= 1.0
    assert q["predicted_fraction"] == pytest.approx(expect.mean())
    assert any("low-rank predictor" in n for n in run.notes)
    # the simulator replays what ran (oracle on the executed sets)
    ex = write_executed_trace(tmp_path / "exec", run, run.view, store.spec)
    sim = simulate(open_trace(ex), store.spec, load_profile("this-host"), cfg, fast=False)
    assert [t.computed for t in sim.tokens] == [t.computed for t in run.tokens]
    # a predictor of another shape is refused
    other = PT.LowRankPredictor(pred.A[:1], pred.B[:1], pred.bias[:1], 0.5, {**pred.meta, "n_layers": 1})
    PT.save_predictor(other, tmp_path / "o.safetensors")
    with pytest.raises(FlashsimError, match="train one for this model"):
        run_prepared(ref, model, spec, store, load_profile("this-host"), cfg, predictor=f"lowrank:{tmp_path / 'o.safetensors'}")


def test_cli_compares_predictors(tmp_path, capsys):
    import json

    from flashsim.main import main
    from real.weights.convert import convert_model
    from tests.real.test_predictor_train import make_tiny_folder

    folder = make_tiny_folder(tmp_path / "tiny")
    convert_model(str(folder), tmp_path / "store", dtype="fp32", progress=False)
    assert main(["real", "train-predictor", "--model", str(folder), "--limit-prompts", "4", "--rank", "4", "--epochs",
                 "2", "--sparsity", "topk:0.25", "--out", str(tmp_path / "p.safetensors"), "--json"]) == 0
    (tmp_path / "t.txt").write_text("A held-out line of text, not among the prompts.")
    capsys.readouterr()
    base = ["real", "run", "--store", str(tmp_path / "store"), "--model", str(folder), "--text", str(tmp_path / "t.txt"),
            "--max-tokens", "12", "--keep", "0.25", "--set", "window.k=2", "--dram-budget", "64MiB", "--threads", "1"]
    assert main(base + ["--predictor", "oracle", "--predictor", "previous", "--predictor",
                        f"lowrank:{tmp_path / 'p.safetensors'}", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["predictor"] for r in out["comparison"]] == ["oracle", "previous", f"lowrank:{tmp_path / 'p.safetensors'}"]
    for r in out["runs"]:
        assert r["quality"]["tokens"] == 12 and np.isfinite(r["quality"]["perplexity"])
    assert out["comparison"][0]["predictor_recall"] == 1.0
    assert main(base + ["--predictor", "previous"]) == 0
    assert "predictor" in capsys.readouterr().out
    # bad predictor names and files: one line, exit 2, before the model loads
    assert main(base + ["--predictor", "magic"]) == 2
    assert main(base + ["--predictor", "lowrank:/no/such.safetensors"]) == 2
    assert main(base + ["--predictor", "oracle", "--predictor", "previous", "--records", str(tmp_path / "r.parquet")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "oracle, previous or lowrank" in err and "no such predictor file" in err


def test_a_simulated_predictor_runs_as_the_oracle_and_says_so(tiny_llama, tmp_path):
    """The presets' noisy predictor is simulated from statistics: model mode cannot compute its sets on a
    real model, so it runs the true active sets under the oracle slot (the simulator replays the same) and
    the run's notes say so."""
    from real.runtime.model_mode import run_model

    model, spec, store, ids, _ = tiny_llama
    cfg = _cfg(2).with_overrides(["predictor=noisy", "noisy.recall=0.9", "noisy.precision=0.5"])
    run, _ = run_model(model, spec, store, ids, load_profile("this-host"), cfg, keep_fraction=0.25, workdir=tmp_path)
    assert any("noisy predictor is simulated from statistics" in n for n in run.notes)
    k_active = int(np.ceil(0.25 * spec.d_ff))
    assert all(t.computed == spec.n_layers * k_active for t in run.tokens)
