"""The GSI perplexity estimate (adapt/drop_quality.py), hand-computed on the 2-layer document."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapt.drop_quality import GsiPerplexity, MeasuredPerplexity
from adapt.importance import block_names
from tests.adapt.conftest import tiny_doc

NAMES = block_names(2)  # mha:0 ffn:0 mha:1 ffn:1


def mask(*blocks: str) -> np.ndarray:
    return np.array([n in blocks for n in NAMES])


def test_exact_on_every_prefix_of_a_full_file():
    doc = tiny_doc(steps=4)
    q = GsiPerplexity(doc, NAMES)
    order = ["mha:1", "ffn:0", "mha:0", "ffn:1"]
    assert q.ppl(mask()) == pytest.approx(10.0, rel=1e-12)
    for k, expect in enumerate([11.0, 15.0, 40.0, 1000.0], start=1):
        assert q.ppl(mask(*order[:k])) == pytest.approx(expect, rel=1e-12)


def test_exact_on_single_blocks():
    q = GsiPerplexity(tiny_doc(steps=2), NAMES)
    for b, p in [("mha:1", 11.0), ("mha:0", 12.0), ("ffn:0", 14.0), ("ffn:1", 900.0)]:
        assert q.ppl(mask(b)) == pytest.approx(p, rel=1e-12)


def test_mixed_set_adds_one_shot_increments_to_the_prefix():
    q = GsiPerplexity(tiny_doc(steps=2), NAMES)
    # prefix mha:1, ffn:0 (ppl 15), plus mha:0 (one-shot 12 vs dense 10): 15 * 12/10 = 18
    assert q.ppl(mask("mha:1", "ffn:0", "mha:0")) == pytest.approx(18.0, rel=1e-12)
    # no prefix (mha:1 kept): ffn:0 and mha:0 by one-shot: 10 * 14/10 * 12/10 = 16.8
    assert q.ppl(mask("ffn:0", "mha:0")) == pytest.approx(16.8, rel=1e-12)
    assert q.log_ppl(mask("ffn:0", "mha:0")) == pytest.approx(math.log(16.8), rel=1e-12)


def test_null_perplexity_is_infinite():
    doc = tiny_doc(steps=2)
    doc["one_shot"][3]["ppl_alone"] = None
    q = GsiPerplexity(doc, NAMES)
    assert q.ppl(mask("ffn:1")) == math.inf and math.isfinite(q.ppl(mask("mha:0")))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0.5, 3.0), min_size=6, max_size=6), st.integers(0, 6))
def test_prefixes_exact_for_any_numbers(ratios, k):
    """Random 3-layer GSI files: the estimate of every prefix is the file's ppl_after."""
    names = block_names(3)
    order = [names[i] for i in (4, 1, 5, 0, 2, 3)]
    p, gsi = 20.0, []
    for b, r in zip(order, ratios):
        p *= r
        gsi.append((b, p))
    from adapt.importance import make_gsi_document

    doc = make_gsi_document(dense_ppl=20.0, gsi=gsi, one_shot=[(b, 20.0 + i) for i, b in enumerate(names)],
                            model_name="t", n_layers=3, text_sha256="", text_source="builtin", n_tokens=4)
    q = GsiPerplexity(doc, names)
    d = np.array([n in order[:k] for n in names])
    assert q.ppl(d) == pytest.approx(20.0 if k == 0 else gsi[k - 1][1], rel=1e-9)


def test_measured_perplexity_measures_each_set_once():
    calls = []

    def measure(sets):
        calls.append(sets)
        return [10.0 + len(s) for s in sets]

    q = MeasuredPerplexity(measure, NAMES)
    q.prefetch([mask("mha:0"), mask("mha:0"), mask()])
    assert calls == [[["mha:0"], []]]
    assert q.ppl(mask("mha:0")) == 11.0 and q.log_ppl(mask()) == pytest.approx(math.log(10.0))
    assert q.ppl(mask("mha:0", "ffn:1")) == 12.0
    assert calls[1] == [["mha:0", "ffn:1"]] and len(calls) == 2
