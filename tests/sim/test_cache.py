"""The neuron cache behind window/LRU/streaming: closed-form and step-by-step algorithms agree, and
capacity is respected with least-recently-used eviction."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import bitsets
from sim.policies.base import CapacityError
from sim.policies.cache import NeuronCache

N = 70


def _sets(seed: int, S: int, density: float) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    C = rng.random((S, N)) < density
    H = rng.random((S, N)) < density / 2
    return bitsets.pack(C), bitsets.pack(H)


def _fields(cs) -> dict:  # type: ignore[no-untyped-def]
    return {f: getattr(cs, f) for f in ("demand", "prefetch", "hits", "before", "after", "peak", "inserted", "evicted")}


def _assert_same(a, b) -> None:  # type: ignore[no-untyped-def]
    for f, v in _fields(a).items():
        assert np.array_equal(v, getattr(b, f)), f


@settings(max_examples=80, deadline=None)
@given(k=st.one_of(st.none(), st.integers(0, 6)), S=st.integers(1, 12), seed=st.integers(0, 10_000),
       hints=st.booleans(), density=st.floats(0.02, 0.5))
def test_vectorised_equals_sequential_when_uncapped(k, S, seed, hints, density) -> None:
    C, H = _sets(seed, S, density)
    H = H if hints else None
    cap = np.full(S, 10 * N)
    vec = NeuronCache(k, N).advance(0, 0, C, H, cap)
    seq_cache = NeuronCache(k, N)
    seq = seq_cache._sequential(0, seq_cache._state(0, 0), 0, C, H, cap)
    _assert_same(vec, seq)
    # every computed neuron is resident before the FFN: hit or read on demand
    assert np.array_equal(vec.hits + bitsets.count(vec.demand), bitsets.count(C))


@settings(max_examples=60, deadline=None)
@given(k=st.one_of(st.none(), st.integers(0, 5)), S=st.integers(2, 12), seed=st.integers(0, 10_000),
       cap=st.integers(8, 40), split=st.integers(1, 11))
def test_range_equals_step_by_step_under_a_cap(k, S, seed, cap, split) -> None:
    C, H = _sets(seed, S, 0.12)
    caps = np.full(S, cap)
    try:
        whole = NeuronCache(k, N).advance(0, 0, C, H, caps)
    except CapacityError:
        return
    one = NeuronCache(k, N)
    parts = [one.advance(0, s, C[s:s + 1], H[s:s + 1], caps[s:s + 1]) for s in range(S)]
    two = NeuronCache(k, N)
    cut = min(split, S - 1)
    halves = [two.advance(0, 0, C[:cut], H[:cut], caps[:cut]), two.advance(0, cut, C[cut:], H[cut:], caps[cut:])]
    from sim.policies.base import CacheSteps
    _assert_same(whole, CacheSteps.concat(parts))
    _assert_same(whole, CacheSteps.concat(halves))
    if k != 0:                      # streaming (k = 0) is bounded by the planner's DRAM check instead
        assert np.all(whole.peak <= cap) and np.all(whole.after <= cap)


def _lru_reference(sets: list[set[int]], cap: int) -> list[int]:
    """Misses per step of an LRU cache touched by one set per step: the step's set becomes the most
    recent (in index order), older entries are evicted oldest first to make room."""
    lru: OrderedDict[int, None] = OrderedDict()
    misses = []
    for s in sets:
        misses.append(len(s - set(lru)))
        while len(set(lru) | s) > cap:
            victim = next(v for v in lru if v not in s)
            del lru[victim]
        for n in sorted(s):
            lru.pop(n, None)
            lru[n] = None
    return misses


@settings(max_examples=60, deadline=None)
@given(S=st.integers(1, 15), seed=st.integers(0, 10_000), cap=st.integers(12, 40))
def test_unbounded_window_under_a_cap_is_an_lru(S, seed, cap) -> None:
    rng = np.random.default_rng(seed)
    C = rng.random((S, N)) < 0.15
    if (C.sum(axis=1) > cap).any():
        return
    out = NeuronCache(None, N).advance(0, 0, bitsets.pack(C), None, np.full(S, cap))
    ref = _lru_reference([set(np.flatnonzero(r).tolist()) for r in C], cap)
    assert bitsets.count(out.demand).tolist() == ref


def test_window_semantics_by_hand() -> None:
    # neuron sets per step: {0,1}, {1,2}, {3}, {0}; window k=2
    rows = np.zeros((4, N), bool)
    for s, ns in enumerate([(0, 1), (1, 2), (3,), (0,)]):
        rows[s, list(ns)] = True
    out = NeuronCache(2, N).advance(0, 0, bitsets.pack(rows), None, np.full(4, N))
    assert bitsets.count(out.demand).tolist() == [2, 1, 1, 1]   # 0 left the window after step 1
    assert out.after.tolist() == [2, 3, 3, 2]                   # {0,1}, {0,1,2}, {1,2,3}, {0,3}
    assert out.evicted.tolist() == [0, 0, 1, 2]


def test_too_small_a_cap_raises() -> None:
    C = bitsets.pack(np.ones((1, N), bool))
    with pytest.raises(CapacityError) as e:
        NeuronCache(3, N).advance(2, 0, C, None, np.array([10]))
    assert (e.value.layer, e.value.need, e.value.cap) == (2, N, 10)


def test_shrink_evicts_least_recent() -> None:
    rows = np.zeros((3, N), bool)
    rows[0, [0, 1]] = True
    rows[1, [2]] = True
    rows[2, [3]] = True
    cache = NeuronCache(None, N)
    cache.advance(0, 0, bitsets.pack(rows), None, np.full(3, N))
    ev = cache.shrink(2)
    assert ev.tolist() == [2]
    assert bitsets.unpack(cache.layers[0]["res"], N).nonzero()[0].tolist() == [2, 3]
