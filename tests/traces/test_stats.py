"""Trace statistics: hand-computed values on a tiny trace, prompt boundaries and phases, and a
property check of the bit-operation code against a plain set-based reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devices.errors import FlashsimError
from tests.traces.test_format import write_trace
from traces.format import open_trace
from traces.stats import hot_cdf, hot_fraction, tokens_before_in_prompt, trace_stats

N = 4
# Two prompts: A = tokens 0..3 (task qa), B = tokens 4..6 (task code). Sets of active neurons:
SETS = [{0, 1}, {1, 2}, {0, 1}, {3}, {0}, {0, 1}, {2}]
PROMPT = [0, 0, 0, 0, 1, 1, 1]
PHASE = [0, 0, 1, 1, 0, 1, 1]          # prefill, prefill, decode, decode | prefill, decode, decode


def _masks(sets, n=N):
    m = np.zeros((1, len(sets), n), bool)
    for t, s in enumerate(sets):
        m[0, t, list(s)] = True
    return m


@pytest.fixture
def tiny(tmp_path):
    return open_trace(write_trace(tmp_path / "t", _masks(SETS), np.array(PROMPT, np.int32),
                                  np.array(PHASE, np.uint8), ["qa", "code"]))


def test_hand_computed(tiny):
    s = trace_stats(tiny).to_json()
    assert s["n_tokens"] == 7 and s["n_layers"] == 1 and s["n_neurons"] == 4
    assert s["active_fraction"] == pytest.approx(11 / 28)
    # overlap: t1 1/2, t2 1/2, t3 0/1, t5 1/2, t6 0/1 (t0, t4 start a prompt) -> 3/8
    assert s["overlap_prev"] == pytest.approx(3 / 8)
    # k = 2: t2 {0,1} in {1,2}|{0,1}: 2/2; t3 0/1; t6 {2} in {0}|{0,1}: 0/1 -> 2/4
    assert s["window_coverage"]["2"] == pytest.approx(0.5)
    assert s["window_coverage"]["3"] == pytest.approx(0.0)        # t3 only: {3} never seen
    assert s["window_coverage"]["4"] is None                      # no prompt has 4 earlier tokens
    # counts n0..n3 = 4, 4, 2, 1: 80% of 11 events needs 3 of 4 neurons
    assert s["hot80_fraction"] == pytest.approx(0.75)
    assert s["per_layer"][0]["overlap_prev"] == s["overlap_prev"]


def test_prompt_boundary_is_not_crossed(tmp_path):
    # If t4 were compared with t3 (another prompt) the overlap would change: {0} vs {3} -> 0/1.
    # Make them identical across the boundary: a cross-prompt comparison would count a hit.
    sets = [{0}, {1}, {2}, {2}]
    one = trace_stats(open_trace(write_trace(tmp_path / "a", _masks(sets), np.array([0, 0, 1, 1], np.int32),
                                             tasks=["x", "x"])))
    assert one.overall["overlap_prev"] == pytest.approx(0.5)      # t1 0/1, t3 1/1
    assert one.overall["window_coverage"]["2"] is None


def test_decode_phase_uses_prefill_history(tiny):
    s = trace_stats(tiny, phase="decode").to_json()
    assert s["n_tokens"] == 4
    # measured t2, t3, t5, t6: hits 1 + 0 + 1 + 0 over 2 + 1 + 2 + 1
    assert s["overlap_prev"] == pytest.approx(2 / 6)
    p = trace_stats(tiny, phase="prefill").to_json()
    assert p["n_tokens"] == 3 and p["overlap_prev"] == pytest.approx(1 / 2)   # t1 only


def test_task_hot_overlap(tiny):
    s = trace_stats(tiny).to_json()
    assert s["tasks"] == {"code": 3, "qa": 4}
    # qa counts 2,3,1,1 -> hot {1,0,2}; code counts 2,1,1,0 -> hot {0,1,2}: Jaccard 1
    (pair,) = s["task_hot_overlap"]
    assert pair["tasks"] == ["code", "qa"] and pair["jaccard"] == pytest.approx(1.0)


def test_hot_helpers():
    c = np.array([4, 4, 2, 1])
    assert hot_fraction(c) == 0.75
    assert hot_cdf(c, [0.25, 0.5, 1.0]) == pytest.approx([4 / 11, 8 / 11, 1.0])
    assert hot_fraction(np.ones(10)) == pytest.approx(0.8)
    assert hot_fraction(np.zeros(5)) is None
    assert list(tokens_before_in_prompt(np.array([3, 3, 3, 1, 1, 3]))) == [0, 1, 2, 0, 1, 0]


def test_mass_statistics(tmp_path):
    # one layer, 5 neurons; neuron 0 carries most |a|, all stored (K = N)
    mags = np.array([[[9, 1, 0, 0, 0], [9, 0, 1, 0, 0], [9, 0, 0, 1, 0]]], np.float32)
    t = open_trace(write_trace(tmp_path / "m", mags > 0, mags=mags, top_k=5))
    s = trace_stats(t).to_json()
    assert s["hot80_mass_fraction"] == pytest.approx(1 / 5)      # 27 of 30 from neuron 0
    assert s["hot80_fraction"] == pytest.approx(3 / 5)           # events 3, 1, 1, 1: 3+1+1 >= 4.8
    assert s["magnitude_coverage"] == pytest.approx(1.0)
    t2 = open_trace(write_trace(tmp_path / "m2", mags > 0, mags=mags, top_k=1))
    assert trace_stats(t2).to_json()["magnitude_coverage"] == pytest.approx(27 / 30)


def test_no_tokens_of_that_phase(tmp_path):
    t = open_trace(write_trace(tmp_path / "d", _masks([{0}, {1}]), phase=np.array([1, 1], np.uint8)))
    with pytest.raises(FlashsimError, match="no prefill tokens"):
        trace_stats(t, phase="prefill")


def _reference(sets, prompt, measured, n, max_k):
    """Plain Python: the definitions of the module docstring, token by token."""
    hits, events = [0] * max_k, [0] * max_k
    for t, a in enumerate(sets):
        if not measured[t]:
            continue
        before = 0
        while t - before - 1 >= 0 and prompt[t - before - 1] == prompt[t]:
            before += 1
        for k in range(1, max_k + 1):
            if before >= k:
                window = set().union(*sets[t - k:t])
                hits[k - 1] += len(a & window)
                events[k - 1] += len(a)
    active = sum(len(a) for t, a in enumerate(sets) if measured[t])
    return active / (sum(measured) * n), [h / e if e else None for h, e in zip(hits, events)]


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_bit_operations_match_a_set_reference(tmp_path_factory, data):
    n = data.draw(st.integers(1, 70))
    n_tok = data.draw(st.integers(2, 30))
    sets = [set(data.draw(st.lists(st.integers(0, n - 1), max_size=n))) for _ in range(n_tok)]
    prompt = sorted(data.draw(st.lists(st.integers(0, 3), min_size=n_tok, max_size=n_tok)))
    prompt = np.unique(prompt, return_inverse=True)[1].astype(np.int32)
    phase = np.array(data.draw(st.lists(st.integers(0, 1), min_size=n_tok, max_size=n_tok)), np.uint8)
    phase = phase[np.lexsort((phase, prompt))]          # within a prompt, prefill before decode
    if not phase.any():
        phase[-1] = 1
    path = write_trace(tmp_path_factory.mktemp("h") / "t", _masks(sets, n), prompt, phase,
                       [f"task{i}" for i in range(prompt.max() + 1)])
    got = trace_stats(open_trace(path), phase="decode", max_window=6).to_json()
    active, cov = _reference(sets, list(prompt), list(phase == 1), n, 6)
    assert got["active_fraction"] == pytest.approx(active, abs=1e-6)
    for k in range(6):
        if cov[k] is None:
            assert got["window_coverage"][str(k + 1)] is None
        else:
            assert got["window_coverage"][str(k + 1)] == pytest.approx(cov[k], abs=1e-6)
