"""ActivationStore: sparsity rules over captured activations, stored magnitudes, automatic K,
phases, exact |a| sums and atomic writing. Pure NumPy (no torch)."""

from __future__ import annotations

import numpy as np
import pytest

from devices.errors import FlashsimError
from devices.model_spec import ModelSpec
from traces.capture.assemble import ActivationStore, default_rule
from traces.format import PromptInfo, open_trace


def spec(n_layers=2, d_ff=8, act="silu", family="llama") -> ModelSpec:
    if family == "opt":
        cfg = {"model_type": "opt", "hidden_size": 8, "ffn_dim": d_ff, "num_hidden_layers": n_layers,
               "num_attention_heads": 2, "vocab_size": 100, "activation_function": "relu"}
    else:
        cfg = {"model_type": "llama", "hidden_size": 8, "intermediate_size": d_ff, "num_hidden_layers": n_layers,
               "num_attention_heads": 2, "vocab_size": 100, "hidden_act": act}
    return ModelSpec.from_hf_config(cfg, name="tiny")


def infos(store: ActivationStore) -> list[PromptInfo]:
    return [PromptInfo(id=f"p{i}", task=["qa", "code"][i % 2], n_prompt_tokens=p.n_prompt,
                       n_generated_tokens=int(p.token_ids.size) - p.n_prompt) for i, p in enumerate(store.pieces)]


def test_default_rule_follows_the_activation():
    assert default_rule(spec(family="opt")) == ("relu", None)
    assert default_rule(spec()) == ("threshold", 0.5)
    assert default_rule(spec(act="gelu")) == ("threshold", 0.5)


def test_threshold_by_hand(tmp_path):
    # One layer, 4 neurons, 2 tokens: |a| = 8 distinct values; threshold:0.25 keeps the 2 largest
    # of the 8 (the 0.75 quantile, "higher" method: sorted index ceil(0.75 * 7) = 6 -> 7.0).
    s = ActivationStore(1, 4)
    s.add(np.array([11, 12]), 1, np.array([[[1.0, -8.0, 3.0, 0.5], [-2.0, 7.0, 4.0, 6.0]]]))
    out = s.write(tmp_path / "t", spec(1, 4), infos(s), rule="threshold", target_fraction=0.25)
    tr = open_trace(out)
    assert tr.manifest.sparsity.thresholds == [7.0]
    np.testing.assert_array_equal(tr.mask(0), [[False, True, False, False], [False, True, False, False]])
    # auto K = 1 + the largest per-token active count (1), top magnitudes descending
    assert tr.top_k == 2
    idx, mag = tr.top(0)
    np.testing.assert_array_equal(idx, [[1, 2], [1, 3]])
    np.testing.assert_array_equal(mag, [[8.0, 3.0], [7.0, 6.0]])
    np.testing.assert_allclose(tr.abs_sum(0), [12.5, 19.0])
    np.testing.assert_array_equal(tr.phase, [0, 1])
    np.testing.assert_array_equal(tr.token_ids, [11, 12])


def test_relu_is_exactly_positive_and_topk_is_a_fixed_count(tmp_path):
    rng = np.random.default_rng(0)
    acts = rng.normal(size=(2, 10, 8)).astype(np.float32)
    acts[acts < 0.3] = 0.0
    s = ActivationStore(2, 8)
    s.add(np.arange(6), 4, acts[:, :6])
    s.add(np.arange(4), 2, acts[:, 6:])
    tr = open_trace(s.write(tmp_path / "relu", spec(family="opt", d_ff=8), infos(s), rule="relu",
                            target_fraction=None))
    for layer in range(2):
        np.testing.assert_array_equal(tr.mask(layer), acts[layer] > 0)
    assert tr.top_k == 1 + max(int((acts[layer] > 0).sum(axis=1).max()) for layer in range(2))
    np.testing.assert_array_equal(tr.phase, [0, 0, 0, 0, 1, 1, 0, 0, 1, 1])
    np.testing.assert_array_equal(tr.prompt_index, [0] * 6 + [1] * 4)

    acts = rng.normal(size=(2, 10, 8)).astype(np.float32)
    s = ActivationStore(2, 8)
    s.add(np.arange(10), 3, acts)
    tr = open_trace(s.write(tmp_path / "topk", spec(d_ff=8), [PromptInfo(id="a", task="qa", n_prompt_tokens=3,
                            n_generated_tokens=7)], rule="topk", target_fraction=0.25))
    for layer in range(2):
        m = tr.mask(layer)
        assert np.all(m.sum(axis=1) == 2)
        strongest = np.argsort(-np.abs(acts[layer]), axis=1)[:, :2]
        assert np.all(np.take_along_axis(m, strongest, axis=1))


def test_explicit_magnitude_fraction_and_mass(tmp_path):
    rng = np.random.default_rng(1)
    acts = rng.normal(size=(3, 20, 16)).astype(np.float32)
    s = ActivationStore(3, 16)
    s.add(np.arange(20), 5, acts)
    p = [PromptInfo(id="a", task="qa", n_prompt_tokens=5, n_generated_tokens=15)]
    tr = open_trace(s.write(tmp_path / "t", spec(3, 16), p, rule="threshold", target_fraction=0.3,
                            magnitude_fraction=0.25))
    assert tr.top_k == 4
    for layer in range(3):
        a16 = np.abs(acts[layer]).astype(np.float16)
        idx, mag = tr.top(layer)
        np.testing.assert_array_equal(mag, -np.sort(-a16, axis=1)[:, :4])
        np.testing.assert_array_equal(np.take_along_axis(a16, idx.astype(np.int64), axis=1), mag)
        np.testing.assert_allclose(tr.abs_sum(layer), np.abs(acts[layer]).sum(axis=1), rtol=1e-6)
        # masks come from the same fp16 magnitudes: mean active fraction is the target
        assert tr.mask(layer).mean() == pytest.approx(0.3, abs=1 / (20 * 16))


def test_bad_inputs(tmp_path):
    s = ActivationStore(1, 4)
    with pytest.raises(FlashsimError, match="nothing was captured"):
        s.write(tmp_path / "t", spec(1, 4), [], rule="relu", target_fraction=None)
    with pytest.raises(ValueError):
        s.add(np.arange(3), 1, np.zeros((1, 2, 4)))
    with pytest.raises(FlashsimError, match="NaN"):
        s.add(np.arange(2), 1, np.array([[[1, np.nan, 0, 0], [0, 0, 0, 0]]], np.float32))
    s.add(np.arange(2), 1, np.ones((1, 2, 4)))
    with pytest.raises(FlashsimError, match="magnitude-fraction"):
        s.write(tmp_path / "t", spec(1, 4), infos(s), rule="relu", target_fraction=None, magnitude_fraction=1.5)
    assert list(tmp_path.iterdir()) == []


def test_write_failure_leaves_nothing(tmp_path, monkeypatch):
    import traces.capture.assemble as assemble

    s = ActivationStore(2, 8)
    s.add(np.arange(5), 2, np.random.default_rng(2).normal(size=(2, 5, 8)))

    def boom(*_a, **_k):
        raise OSError("no space left on device")

    monkeypatch.setattr(assemble, "top_k_fp16", boom)
    with pytest.raises(OSError):
        s.write(tmp_path / "t", spec(), infos(s), rule="threshold", target_fraction=0.5, magnitude_fraction=0.5)
    assert list(tmp_path.iterdir()) == []
