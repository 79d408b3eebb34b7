"""Packed neuron sets: conversions, windows and run-length counting against plain-NumPy references."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import bitsets
from traces.format import pack_mask


def _runs_reference(mask: np.ndarray, max_len: int) -> np.ndarray:
    out = np.zeros(max_len, np.int64)
    d = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    lengths = np.flatnonzero(d == -1) - np.flatnonzero(d == 1)
    out[max_len - 1] += int((lengths // max_len).sum())
    for r in lengths % max_len:
        if r:
            out[r - 1] += 1
    return out


def test_pack_matches_trace_layout_and_roundtrips() -> None:
    rng = np.random.default_rng(0)
    m = rng.random((5, 131)) < 0.3
    w = bitsets.pack(m)
    assert w.shape == (5, 3) and w.dtype == bitsets.WORD
    assert np.array_equal(bitsets.from_packed_bytes(pack_mask(m), 131), w)
    assert np.array_equal(bitsets.unpack(w, 131), m)
    assert np.array_equal(bitsets.count(w), m.sum(axis=1))
    full = bitsets.full(131)
    assert bitsets.count(full) == 131 and bitsets.count(bitsets.andnot(full, w)).sum() == (~m).sum()


def test_window_union_reaches_into_history() -> None:
    rows = bitsets.pack(np.eye(6, dtype=bool))          # step s activates neuron s
    hist = bitsets.pack(np.array([[0, 0, 0, 0, 0, 1]], bool))
    out = bitsets.unpack(bitsets.window_union(rows, hist, 3), 6)
    expect = np.array([[1, 0, 0, 0, 0, 1], [1, 1, 0, 0, 0, 1], [1, 1, 1, 0, 0, 0],
                       [0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1]], bool)
    assert np.array_equal(out, expect)
    assert not bitsets.window_union(rows, hist, 0).any()
    assert np.array_equal(bitsets.window_union(rows, hist, 1), rows)


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 300), s=st.integers(1, 5), max_len=st.integers(1, 70),
       density=st.floats(0, 1), dense_prefix=st.booleans(), probe=st.integers(1, 10), seed=st.integers(0, 2**16))
def test_run_length_counts_match_reference(n, s, max_len, density, dense_prefix, probe, seed) -> None:
    rng = np.random.default_rng(seed)
    m = rng.random((s, n)) < density
    if dense_prefix:
        m[:, : n // 2] = True
    counts, _ = bitsets.run_length_counts(bitsets.pack(m), max_len, probe=probe)
    for i in range(s):
        assert np.array_equal(counts[i], _runs_reference(m[i], max_len))
    # every set bit is read exactly once
    sizes = np.arange(1, max_len + 1)
    assert np.array_equal((counts * sizes).sum(axis=1), m.sum(axis=1))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 200), k=st.integers(1, 140), seed=st.integers(0, 2**16))
def test_all_set_from_and_shifts(n, k, seed) -> None:
    rng = np.random.default_rng(seed)
    m = rng.random((2, n)) < 0.8
    got = bitsets.unpack(bitsets.all_set_from(bitsets.pack(m), k), n)
    expect = np.array([[i + k <= n and m[r, i:i + k].all() for i in range(n)] for r in range(2)])
    assert np.array_equal(got, expect)
    sh = bitsets.unpack(bitsets.shift_down_by(bitsets.pack(m), k), n)
    assert np.array_equal(sh[:, : max(0, n - k)], m[:, k:])


def test_permute() -> None:
    m = np.array([[1, 0, 0, 1, 1]], bool)
    perm = np.array([4, 3, 2, 1, 0])
    assert np.array_equal(bitsets.unpack(bitsets.permute(bitsets.pack(m), perm, 5), 5), m[:, perm])
