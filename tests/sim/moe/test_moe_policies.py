"""Expert-cache policies: the registry, each policy's behaviour on a hand-made trace, the Belady bound
(hypothesis), and the walk's invariants."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devices.errors import FlashsimError
from sim.moe.base import build_cache, cache_names, parse_cache_arg
from sim.moe.residency import walk
from tests.sim.moe.routing_fixture import zipf_routing

ALL = ["belady", "cache-aware", "least-stale", "lfu", "lru", "page-cache", "pinned"]


def test_registry_lists_every_policy_and_rejects_unknown() -> None:
    assert cache_names() == ALL
    with pytest.raises(FlashsimError, match="did you mean 'lru'"):
        build_cache("lru2")
    with pytest.raises(FlashsimError, match="unknown parameter"):
        build_cache("pinned", {"bogus": 1})
    assert parse_cache_arg("pinned:profile_tokens=8") == ("pinned", {"profile_tokens": 8})


@pytest.mark.parametrize("name", ALL)
def test_every_policy_walks_within_capacity(name: str) -> None:
    e, w = zipf_routing(24, 3, 16, 2, seed=1)
    for scope in ("layer", "global"):
        cap = 4 if scope == "layer" else 10
        r = walk(e, 16, build_cache(name), cap, scope, weights=w)
        assert r.resident_peak <= (r.capacity * 3 if r.scope == "layer" else r.capacity)
        assert r.hit.shape == e.shape and 0 <= r.hit_rate <= 1
        if name != "cache-aware":
            assert (r.routed == e).all() and r.replaced_mass.sum() == 0


def test_lru_hand_trace() -> None:
    """One layer, capacity 2, top-1: A B A C B -> LRU hits only the second A (C evicts B)."""
    e = np.array([0, 1, 0, 2, 1]).reshape(5, 1, 1)
    r = walk(e, 4, build_cache("lru"), 2)
    assert r.hit[:, 0, 0].tolist() == [False, False, True, False, False]
    b = walk(e, 4, build_cache("belady"), 2)
    assert b.hit[:, 0, 0].tolist() == [True, True, True, False, True]     # warm {A, B}; MIN keeps B at C


def test_lfu_keeps_the_frequent_expert() -> None:
    e = np.array([0, 0, 0, 1, 2, 0]).reshape(6, 1, 1)
    r = walk(e, 4, build_cache("lfu"), 1)
    assert r.hit[:, 0, 0].tolist() == [False, True, True, False, False, False]
    r2 = walk(e, 4, build_cache("lfu"), 2)
    assert r2.hit[-1, 0, 0]          # 0 (used 3 times) outlives 1 and 2


def test_least_stale_beats_lru_on_a_cyclic_pass_in_a_shared_cache() -> None:
    """Each token uses the same expert in every one of 4 layers; a shared cache of 3 slots: LRU
    evicts the layer about to come (0 hits), Least-Stale keeps 2 of 4 layers' experts resident."""
    e = np.zeros((10, 4, 1), np.int64)
    lru = walk(e, 2, build_cache("lru"), 3, "global")
    ls = walk(e, 2, build_cache("least-stale"), 3, "global")
    assert lru.hit.sum() == 0
    assert ls.hit.sum() >= 2 * 9
    assert ls.hit.sum() <= walk(e, 2, build_cache("belady"), 3, "global").hit.sum()


def test_pinned_holds_the_most_used_and_never_changes() -> None:
    e = np.array([0, 1, 0, 2, 0, 3]).reshape(6, 1, 1)
    r = walk(e, 4, build_cache("pinned"), 1)
    assert r.hit[:, 0, 0].tolist() == [True, False, True, False, True, False]
    assert r.evictions.sum() == 0
    prof = walk(e, 4, build_cache("pinned", {"profile_tokens": 2}), 1)   # 0 and 1 tie; lowest id wins
    assert prof.hit[:, 0, 0].sum() == 3


def test_page_cache_is_global_lru() -> None:
    e, _ = zipf_routing(16, 2, 8, 2, seed=3)
    pc = walk(e, 8, build_cache("page-cache"), 6, "layer")      # 6 per layer = one pool of 12
    lru = walk(e, 8, build_cache("lru"), 12, "global")
    assert pc.scope == "global" and pc.capacity == 12 and (pc.hit == lru.hit).all()


def test_cache_aware_routing_trades_weight_mass_for_hits() -> None:
    e, w = zipf_routing(64, 2, 32, 4, alpha=0.6, reuse=0.2, seed=5)
    lru = walk(e, 32, build_cache("lru"), 8, weights=w)
    ca = walk(e, 32, build_cache("cache-aware", {"max_swaps": 2, "max_weight": 0.5}), 8, weights=w)
    assert ca.hit_rate > lru.hit_rate
    assert 0 < ca.replaced_mass.mean() < 0.5
    assert (ca.routed[..., 0] == e[..., 0]).all()          # the top-1 is protected
    srt = np.sort(ca.routed, axis=2)
    assert not (srt[..., 1:] == srt[..., :-1]).any()        # still distinct experts per row


def test_prefetch_staging_hits_only_non_resident_predicted() -> None:
    e = np.array([[[0], [1]], [[2], [3]]])                   # 2 tokens, 2 layers, top-1
    pred = np.full((2, 2, 1), -1)
    pred[0, 1, 0] = 1                                        # right for (t0, layer 1)
    pred[1, 1, 0] = 0                                        # wrong for (t1, layer 1)
    r = walk(e, 4, build_cache("lru"), 1, prefetch=pred)
    assert r.prefetch_hit[:, :, 0].tolist() == [[False, True], [False, False]]
    assert r.prefetch_reads.tolist() == [[0, 1], [0, 1]]


def test_bad_routing_is_one_line_error() -> None:
    with pytest.raises(FlashsimError, match="appears twice"):
        walk(np.zeros((2, 1, 2), np.int64), 4, build_cache("lru"), 1)
    with pytest.raises(FlashsimError, match=r"\[0, 4\)"):
        walk(np.full((2, 1, 1), 7), 4, build_cache("lru"), 1)


@settings(max_examples=25, deadline=None)
@given(T=st.integers(2, 20), M=st.integers(1, 3), E=st.integers(2, 10), K=st.integers(1, 3),
       cap=st.integers(0, 12), scope=st.sampled_from(["layer", "global"]), seed=st.integers(0, 10_000))
def test_belady_bounds_every_policy(T, M, E, K, cap, scope, seed) -> None:
    K = min(K, E)
    rng = np.random.default_rng(seed)
    e = np.stack([[rng.choice(E, K, replace=False) for _ in range(M)] for _ in range(T)])
    best = walk(e, E, build_cache("belady"), cap, scope).hit.sum()
    for name in ALL:
        if name in ("belady", "cache-aware"):
            continue
        pol = build_cache(name)
        if pol.forced_scope and pol.forced_scope != scope:
            bound = walk(e, E, build_cache("belady"), cap * M, pol.forced_scope).hit.sum()
        else:
            bound = best
        assert walk(e, E, pol, cap, scope).hit.sum() <= bound, name


@settings(max_examples=30, deadline=None)
@given(T=st.integers(1, 16), M=st.integers(1, 4), E=st.integers(2, 9), K=st.integers(1, 3),
       cap=st.integers(0, 10), seed=st.integers(0, 10_000), pf=st.booleans(),
       name=st.sampled_from(["lru", "lfu", "least-stale", "pinned"]))
def test_batched_layer_walk_equals_step_by_step(T, M, E, K, cap, seed, pf, name) -> None:
    K = min(K, E)
    rng = np.random.default_rng(seed)
    e = np.stack([[rng.choice(E, K, replace=False) for _ in range(M)] for _ in range(T)])
    pred = np.where(rng.random(e.shape) < 0.3, -1, rng.integers(0, E, e.shape)) if pf else None
    a = walk(e, E, build_cache(name), cap, "layer", prefetch=pred)
    b = walk(e, E, build_cache(name), cap, "layer", prefetch=pred, batched=False)
    for f in ("hit", "prefetch_hit", "prefetch_reads", "evictions", "routed"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)
    assert a.resident_peak == b.resident_peak


def test_every_module_in_the_policies_package_is_a_discovered_policy() -> None:
    """A new expert-cache policy is one module in sim/moe/policies/: nothing lists them."""
    import pkgutil

    import sim.moe.policies as pkg
    from sim.moe.base import _CLASSES, cache_names

    names = cache_names()
    modules = {m.name for m in pkgutil.iter_modules(pkg.__path__)}
    assert {cls.__module__.rsplit(".", 1)[1] for cls in _CLASSES.values()} == modules
    assert len(names) == len(modules)
