"""Re-thresholding at load time from the stored top-K magnitudes (traces.rethreshold)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devices.errors import FlashsimError
from devices.model_spec import ModelSpec
from traces.capture.assemble import ActivationStore
from traces.format import PromptInfo, open_trace
from traces.rethreshold import rethreshold
from traces.sparsity import calibrate_threshold


def _spec(d_ff: int, n_layers: int, relu: bool = False) -> ModelSpec:
    if relu:
        cfg = {"model_type": "opt", "hidden_size": 8, "ffn_dim": d_ff, "num_hidden_layers": n_layers,
               "num_attention_heads": 2, "vocab_size": 100, "activation_function": "relu"}
    else:
        cfg = {"model_type": "llama", "hidden_size": 8, "intermediate_size": d_ff, "num_hidden_layers": n_layers,
               "num_attention_heads": 2, "vocab_size": 100, "hidden_act": "silu"}
    return ModelSpec.from_hf_config(cfg, name="tiny")


def make_trace(path, acts, rule="threshold", fraction=0.5, magnitude_fraction=None, relu=False):
    L, T, N = acts.shape
    s = ActivationStore(L, N)
    s.add(np.arange(T), T // 2, acts)
    p = [PromptInfo(id="a", task="qa", n_prompt_tokens=T // 2, n_generated_tokens=T - T // 2)]
    return open_trace(s.write(path, _spec(N, L, relu), p, rule=rule, target_fraction=fraction,
                              magnitude_fraction=magnitude_fraction))


def _acts(seed=0, shape=(3, 40, 32)):
    rng = np.random.default_rng(seed)
    # heavy-tailed, with per-token scale: some tokens have far more large values than others
    return (rng.standard_t(3, size=shape) * rng.uniform(0.2, 3, size=shape[:2] + (1,))).astype(np.float32)


def test_own_rule_reproduces_the_masks(tmp_path):
    acts = _acts()
    for rule, f in (("threshold", 0.3), ("topk", 0.25)):
        tr = make_trace(tmp_path / rule, acts, rule, f)
        again = rethreshold(tr, f"{rule}:{f}")
        for layer in range(tr.n_layers):
            np.testing.assert_array_equal(again.packed_masks(layer), tr.packed_masks(layer))
        if rule == "threshold":
            assert again.manifest.sparsity.thresholds == tr.manifest.sparsity.thresholds


def test_sparser_rules_from_full_magnitudes_match_direct_computation(tmp_path):
    acts = _acts(1)
    tr = make_trace(tmp_path / "t", acts, "threshold", 0.5, magnitude_fraction=1.0)
    r = rethreshold(tr, "threshold:0.1")
    assert r.manifest.sparsity.rule == "threshold" and r.manifest.sparsity.target_fraction == 0.1
    assert r.manifest.provenance["rethresholded"]["from"]["target_fraction"] == 0.5
    for layer in range(3):
        mag = np.abs(acts[layer]).astype(np.float16).astype(np.float32)
        thr = calibrate_threshold(mag, 0.1)
        np.testing.assert_array_equal(r.mask(layer), mag >= thr)
        assert r.mask(layer).mean() == pytest.approx(0.1, abs=1 / mag.size)
    # the source trace is untouched; other arrays are shared
    assert tr.manifest.sparsity.target_fraction == 0.5
    assert r.top_k == tr.top_k and r.n_tokens == tr.n_tokens
    np.testing.assert_array_equal(r.abs_sum(0), tr.abs_sum(0))
    t = rethreshold(tr, "topk:0.125")
    assert np.all(np.bitwise_count(t.packed_masks(2)).sum(axis=1) == 4)


def test_hand_example_from_stored_top2(tmp_path):
    # 1 layer, 4 neurons, 3 tokens; K = 2 stored per token.
    acts = np.array([[[9.0, 1.0, 0.0, 0.5], [0.1, 0.2, 6.0, 5.0], [4.0, 0.0, 0.0, 3.0]]], np.float32)
    tr = make_trace(tmp_path / "t", acts, "topk", 0.5, magnitude_fraction=0.5)
    assert tr.top_k == 2
    # threshold:0.25 -> 3 of 12 values: sorted index ceil(0.75 * 11) = 9 of the zero-filled stored
    # values [0]*6 + [1, 3, 4, 5, 6, 9] -> 5.0; every token's 2nd stored value (1, 5, 3) ... token 1
    # has 5.0 >= 5.0, so its unstored neurons might reach the threshold: refused.
    with pytest.raises(FlashsimError, match=r"layer 0 \(1 of 3 tokens, first token 1\)"):
        rethreshold(tr, "threshold:0.25")
    # threshold:0.15 -> index ceil(0.85 * 11) = 10 -> 6.0 > every 2nd value: exact
    r = rethreshold(tr, "threshold:0.15")
    assert r.manifest.sparsity.thresholds == [6.0]
    np.testing.assert_array_equal(r.mask(0), [[1, 0, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]])
    r = rethreshold(tr, "topk:0.25")
    np.testing.assert_array_equal(r.mask(0), [[1, 0, 0, 0], [0, 0, 1, 0], [1, 0, 0, 0]])
    with pytest.raises(FlashsimError, match="needs the 3 strongest neurons per token but the trace stores 2"):
        rethreshold(tr, "topk:0.75")


def test_relu_only_for_relu_models(tmp_path):
    acts = np.maximum(_acts(2), 0)
    tr = make_trace(tmp_path / "opt", acts, "relu", None, relu=True)
    r = rethreshold(tr, "relu")
    for layer in range(3):
        np.testing.assert_array_equal(r.packed_masks(layer), tr.packed_masks(layer))
    small = make_trace(tmp_path / "opt-small", acts, "relu", None, magnitude_fraction=0.1, relu=True)
    with pytest.raises(FlashsimError, match="more than the 4 stored magnitudes"):
        rethreshold(small, "relu")
    swiglu = make_trace(tmp_path / "swiglu", _acts(3), "threshold", 0.5)
    with pytest.raises(FlashsimError, match="only for ReLU FFNs"):
        rethreshold(swiglu, "relu")


def test_no_magnitudes_and_bad_rules(tmp_path):
    tr = make_trace(tmp_path / "t", _acts(4), "threshold", 0.3, magnitude_fraction=0.0)
    assert tr.top_k == 0
    with pytest.raises(FlashsimError, match="stores no magnitudes"):
        rethreshold(tr, "threshold:0.1")
    with pytest.raises(FlashsimError, match="--sparsity"):
        rethreshold(tr, "median:0.3")


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), f_capture=st.sampled_from([0.2, 0.4, 0.6]),
       f_new=st.floats(0.02, 0.6))
def test_property_rethreshold_is_exact_or_refuses(tmp_path_factory, seed, f_capture, f_new):
    """With auto K, re-thresholding either equals the direct computation on all |a| or refuses, and
    it never refuses a rule at most as dense as the capture's (every |a| above the capture's
    threshold, plus each token's next one, is stored)."""
    acts = _acts(seed, (2, 12, 24))
    tr = make_trace(tmp_path_factory.mktemp("t") / "t", acts, "threshold", f_capture)
    try:
        r = rethreshold(tr, f"threshold:{f_new}")
    except FlashsimError as e:
        assert "stored magnitudes" in str(e) or "stores only the top" in str(e)
        assert f_new > f_capture
        return
    for layer in range(2):
        mag = np.abs(acts[layer]).astype(np.float16).astype(np.float32)
        np.testing.assert_array_equal(r.mask(layer), mag >= calibrate_threshold(mag, f_new))
