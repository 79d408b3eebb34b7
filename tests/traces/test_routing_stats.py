"""Routing statistics against hand-computed values, and the split-half comparison's verdicts."""

from __future__ import annotations

import numpy as np
import pytest

from traces.routing_stats import (
    RoutingView,
    compare,
    cross_layer,
    popularity,
    reuse_prev,
    routing_stats,
    srp_sch,
)


def view(rows, n_experts=4, sequence=None) -> RoutingView:
    e = np.asarray(rows, np.int64)
    if e.ndim == 2:
        e = e[:, None, :]
    w = np.full(e.shape, 1.0 / e.shape[2], np.float32)
    seq = np.zeros(len(e), np.int32) if sequence is None else np.asarray(sequence, np.int32)
    return RoutingView(e, w, seq, n_experts)


def test_hand_computed_segment_metrics():
    v = view([[0, 1], [0, 1], [0, 2], [3, 2]])
    # counts over the one 4-token segment: e0 3, e1 2, e2 2, e3 1 -> top-j matches 3, 5, 7, 8;
    # F1 = 2 * matches / (4j + 8) = .5, .625, .7, .667 -> SRP .7; a 2-expert cache serves 5 of 8
    srp, sch = srp_sch(v, 4, cache=2)
    assert srp[0] == pytest.approx(0.7) and sch[0] == pytest.approx(5 / 8)
    assert reuse_prev(v)[0] == pytest.approx((1 + 0.5 + 0.5) / 3)
    assert popularity(v)[0] == pytest.approx([3 / 8, 2 / 8, 2 / 8, 1 / 8])


def test_segments_never_span_two_sequences():
    v = view([[0, 1], [0, 1], [2, 3], [2, 3]], sequence=[0, 0, 1, 1])
    srp, sch = srp_sch(v, 2, cache=2)
    assert srp[0] == pytest.approx(1.0) and sch[0] == pytest.approx(1.0)     # each 2-token window is one sequence
    assert reuse_prev(v)[0] == pytest.approx(1.0)                            # the 0/1 -> 2/3 switch is not counted
    assert np.isnan(srp_sch(v, 4)[0][0])                                     # no sequence has 4 tokens


def test_cross_layer_nmi_bounds():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 8, 2000)
    same = np.stack([np.stack([a, (a + 1) % 8], 1), np.stack([(a + 3) % 8, (a + 4) % 8], 1)], 1)
    nmi, acc = cross_layer(RoutingView(same, np.ones(same.shape, np.float32), np.zeros(2000, np.int32), 8))
    assert nmi[0] == pytest.approx(1.0) and acc[0] == pytest.approx(1.0)     # a fixed map between layers
    b = rng.integers(0, 8, 2000)
    ind = np.stack([np.stack([a, (a + 1) % 8], 1), np.stack([b, (b + 1) % 8], 1)], 1)
    nmi, _ = cross_layer(RoutingView(ind, np.ones(ind.shape, np.float32), np.zeros(2000, np.int32), 8))
    assert nmi[0] < 0.02


def _sticky(T, M, E, K, stay, seed):
    """A reference with locality: each token keeps each of the previous token's experts w.p. `stay`."""
    rng = np.random.default_rng(seed)
    e = np.zeros((T, M, K), np.int64)
    for m in range(M):
        cur = rng.permutation(E)[:K]
        for t in range(T):
            keep = rng.random(K) < stay
            fresh = [x for x in rng.permutation(E) if x not in cur[keep]]
            cur = np.where(keep, cur, fresh[:K])
            cur = np.array(list(dict.fromkeys(cur)) + [x for x in fresh if x not in cur])[:K]
            e[t, m] = cur
    return RoutingView(e, np.full(e.shape, 1 / K, np.float32), np.zeros(T, np.int32), E)


def test_compare_tells_a_copy_from_iid_routing():
    ref = _sticky(400, 2, 8, 2, 0.8, 0)
    assert compare(ref, ref)["passes"]
    rng = np.random.default_rng(1)
    iid = np.argsort(rng.random((400, 2, 8)), axis=2)[:, :, :2]
    res = compare(ref, RoutingView(iid, ref.weights, ref.sequence, 8))
    assert not res["rows"]["reuse_prev"]["passes"] and not res["rows"]["sch.16"]["passes"]
    assert routing_stats(ref)["reuse_prev"] > 0.7
