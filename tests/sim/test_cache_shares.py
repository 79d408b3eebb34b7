"""Per-layer cache shares (sim/policies/cache_shares.py): hit curves and splits by hand, invariants by
hypothesis, and the wiring through the memory model, the planner and `--set memory.cache_split`."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devices.errors import FlashsimError
from sim import bitsets
from sim.components.memory import MemoryModel
from sim.config import RunConfig
from sim.engine import build
from sim.policies.cache_shares import (
    CacheShares,
    cache_hits,
    compute_shares,
    equal_rows,
    greedy_rows,
    hit_curve,
    proportional_rows,
    saved,
)


def _packed(sets: list[set[int]], n: int) -> np.ndarray:
    m = np.zeros((len(sets), n), bool)
    for i, s in enumerate(sets):
        m[i, sorted(s)] = True
    return bitsets.pack(m)


def test_hit_curve_by_hand() -> None:
    # C0={0,1}, C1={0}, C2={1}, C3={0,1}. Reuses: (s1,n0) after p0: d=|C0|=2; (s2,n1) after p0:
    # d=|C0|C1|=2; (s3,n0) after p1: d=|C1|C2|=2; (s3,n1) after p2: d=|C2|=1.
    C = _packed([{0, 1}, {0}, {1}, {0, 1}], 4)
    assert hit_curve(C, 4, None).tolist() == [0, 1, 4, 4, 4]
    # a window of 1 step forgets a neuron unused in the last step: only the gap-1 reuses count
    assert hit_curve(C, 4, 1).tolist() == [0, 1, 2, 2, 2]
    assert hit_curve(C, 4, 0).tolist() == [0, 0, 0, 0, 0]


# Layer 0 computes {0,1,2} every step: mean 3, floor 3, every reuse at distance 3 (9 hits from 3 rows).
# Layer 1 alternates A={0..3} and B={4..7}: mean 4, floor 4, reuses at distance |A|B| = 8 (8 hits from 8 rows).
TOY = [_packed([{0, 1, 2}] * 4, 8), _packed([set(range(4)), set(range(4, 8))] * 2, 8)]


def _toy(mode: str, total: int = 12) -> CacheShares | None:
    return compute_shares(mode, lambda layer: TOY[layer], np.array([True, True]), 8, None, total)


def test_toy_shares_by_hand() -> None:
    assert _toy("equal") is None                                  # the memory model's own split
    assert equal_rows(12, np.array([True, True])).tolist() == [6, 6]
    # 12 x 3/7 = 5.14, 12 x 4/7 = 6.86 -> 5 + 6, the last row to the larger remainder (layer 1)
    assert _toy("by_bytes_needed").rows_at_ref.tolist() == [5, 7]
    # floors 3 + 4; layer 1 gains 8 hits over 4 more rows (2 per row), layer 0 nothing: [3, 8]; the
    # last row gains nothing anywhere and goes to the only layer with room
    g = _toy("greedy_marginal")
    assert g.rows_at_ref.tolist() == [4, 8]
    curves = np.stack([hit_curve(c, 8, None) for c in TOY])
    assert saved(curves, [4, 8]) == 9 + 8 and saved(curves, [6, 6]) == 9 + 0
    # on the cache itself: LRU with 6 rows keeps 2 of A while B is read, and 2 of B while A is (4 hits)
    assert [cache_hits(TOY[1], 8, None, r) for r in (8, 6, 3)] == [8, 4, -1]
    # the split follows the free rows of each step: fewer shrink every layer in proportion; more go
    # to the layers with room below their 8 neurons (layer 0), and past that in proportion
    assert g.split(np.array([12, 6, 14, 20])).tolist() == [[4, 8], [2, 4], [6, 8], [9, 10]]
    # a dropped FFN layer gets nothing
    one = compute_shares("greedy_marginal", lambda layer: TOY[layer], np.array([False, True]), 8, None, 12)
    assert one.rows_at_ref[0] == 0 and one.rows_at_ref[1] == 12


def test_greedy_keeps_equal_when_equal_models_better() -> None:
    # two concave-free step curves where only a whole working set pays: greedy from floors [1, 1] gives
    # the 6 rows... whichever, the result never models fewer hits than the equal split
    curves = np.array([[0, 0, 0, 0, 0, 10, 10, 10], [0, 0, 0, 0, 0, 10, 10, 10]])
    rows = greedy_rows(curves, np.array([1, 1]), 10)
    assert saved(curves, rows) >= saved(curves, [5, 5])


def test_unknown_split_is_refused() -> None:
    with pytest.raises(ValueError, match="cache_split must be one of"):
        compute_shares("biggest", lambda layer: TOY[layer], np.array([True, True]), 8, None, 12)


@st.composite
def _traces(draw):  # type: ignore[no-untyped-def]
    L = draw(st.integers(1, 3))
    N = draw(st.integers(4, 24))
    S = draw(st.integers(2, 10))
    seed = draw(st.integers(0, 10_000))
    rng = np.random.default_rng(seed)
    dens = rng.uniform(0.05, 0.6, L)
    sets = [bitsets.pack(rng.random((S, N)) < dens[layer]) for layer in range(L)]
    k = draw(st.one_of(st.none(), st.integers(1, 4)))
    extra = draw(st.integers(0, 3 * N))
    return sets, N, k, extra


@settings(max_examples=60, deadline=None)
@given(case=_traces(), mode=st.sampled_from(["by_bytes_needed", "greedy_marginal"]))
def test_shares_sum_to_the_budget_and_hold_each_step(case, mode) -> None:  # type: ignore[no-untyped-def]
    sets, N, k, extra = case
    L = len(sets)
    floors = np.array([int(bitsets.count(c).max()) for c in sets])
    total = int(floors.sum()) + extra
    sh = compute_shares(mode, lambda layer: sets[layer], np.ones(L, bool), N, k, total)
    rows = sh.rows_at_ref
    assert np.all(rows >= 0)
    assert int(rows.sum()) <= total
    if total <= L * N:   # nothing left over while a layer has room (the equal split, when greedy keeps it,
        assert int(rows.sum()) > total - L               # rounds each layer's share down: < L rows)
    assert np.all(rows >= np.minimum(floors, N))         # every step's computed set fits its layer
    for t in (0, total // 2, total, 3 * total + 7):      # any step's free rows: never over-committed
        assert int(sh.split(np.int64(t)).sum()) <= t
    if mode == "greedy_marginal":
        # on the policy's own cache (window / LRU eviction), greedy hits at least as often as equal
        eq = equal_rows(total, np.ones(L, bool))
        if np.all(eq >= floors):
            def hits(r):  # type: ignore[no-untyped-def]
                return sum(cache_hits(sets[layer], N, k, int(r[layer])) for layer in range(L))
            assert hits(rows) >= hits(eq)


@settings(max_examples=60, deadline=None)
@given(free=st.integers(0, 10**12), L=st.integers(1, 80), nb=st.integers(1, 50_000))
def test_equal_split_is_the_memory_models_formula(free, L, nb) -> None:  # type: ignore[no-untyped-def]
    # the old per-layer share floor(free / (L x nb)) equals the equal split of the free rows
    assert equal_rows(free // nb, np.ones(L, bool))[0] == free // (L * nb)
    mem = MemoryModel({"w": 0}, np.array([0, 5, 9]), L, nb)
    caps = mem.layer_caps(free, 0, 2, L)
    assert caps.shape == (3, L)
    assert np.array_equal(caps, np.repeat(mem.cap_neurons(free, 0, 2)[:, None], L, axis=1))


# ---- wiring: the engine, the planner and the command line --------------------------------------
def _cfg(split: str, budget: int | None = None) -> RunConfig:
    sets = ["residency=window", "window.k=inf", "predictor=oracle", f"memory.cache_split={split}",
            "workload.prompt_tokens=0"]
    if budget is not None:
        sets.append(f"memory.dram_budget_bytes={budget}")
    return RunConfig().with_overrides(sets)


def _tight_budget(trace, host, extra_rows: int) -> int:  # type: ignore[no-untyped-def]
    sim = build(trace, None, host, _cfg("equal"))
    m = sim.memory
    floors = sum(int(bitsets.count(sim.view.needed(layer, 0, sim.steps.n)).max()) for layer in range(sim.spec.n_layers))
    return m.fixed_bytes + int(m.kv_bytes.max()) + (floors + extra_rows) * m.neuron_bytes


def test_engine_uses_per_layer_caps(gated_trace, host) -> None:  # type: ignore[no-untyped-def]
    budget = _tight_budget(gated_trace, host, 40)
    eq = build(gated_trace, None, host, _cfg("equal", budget))
    assert eq.memory.shares is None and "cache_shares" not in eq.resolved_config()
    for mode in ("by_bytes_needed", "greedy_marginal"):
        sim = build(gated_trace, None, host, _cfg(mode, budget))
        sh = sim.memory.shares
        assert sh is not None and sh.mode == mode
        assert sim.resolved_config()["cache_shares"]["rows_per_layer"] == sh.rows_at_ref.tolist()
        caps = sim.memory.layer_caps(budget, 0, sim.steps.n, sim.spec.n_layers)
        assert np.array_equal(caps[-1], sh.rows_at_ref)                  # the last step has the largest KV
        res = sim.run(fast=True)
        arr = sim.planner.arr
        assert np.all(arr.after <= caps[1:]) and np.all(arr.peak <= caps[:-1])   # each layer within its own share
        assert res.summary()["flash_bytes_per_token"] > 0


def test_equal_default_is_unchanged(small_trace, host) -> None:  # type: ignore[no-untyped-def]
    base = RunConfig().with_overrides(["residency=window", "window.k=inf", "predictor=oracle"])
    a = build(small_trace, None, host, base).run(fast=True).records()
    b = build(small_trace, None, host, base.with_overrides(["memory.cache_split=equal"])).run(fast=True).records()
    assert a.equals(b)


@pytest.mark.parametrize("residency", [["residency=naive"], ["residency=window", "window.k=0"]])
def test_split_without_a_cache_is_noted(small_trace, host, residency) -> None:  # type: ignore[no-untyped-def]
    cfg = RunConfig().with_overrides([*residency, "memory.cache_split=greedy_marginal"])
    sim = build(small_trace, None, host, cfg)
    assert sim.memory.shares is None and any("memory.cache_split" in n for n in sim.notes)


def test_bad_split_value_is_one_line(small_trace, host) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(FlashsimError) as e:
        RunConfig().with_overrides(["residency=window", "memory.cache_split=biggest"])
    msg = str(e.value)
    assert "memory.cache_split" in msg and "greedy_marginal" in msg and "\n" not in msg


def test_cli_replay_bad_split_exit_2(small_trace, capsys) -> None:  # type: ignore[no-untyped-def]
    from flashsim.main import main

    rc = main(["replay", "--trace", str(small_trace.path), "--device", "this-host",
               "--set", "memory.cache_split=bogus"])
    err = capsys.readouterr().err
    assert rc == 2 and "memory.cache_split" in err and "Traceback" not in err


def test_cli_replay_prints_the_split(small_trace, capsys) -> None:  # type: ignore[no-untyped-def]
    from flashsim.main import main

    rc = main(["replay", "--trace", str(small_trace.path), "--device", "this-host", "--set", "residency=window",
               "--set", "window.k=inf", "--set", "memory.cache_split=by_bytes_needed", "--engine", "fast"])
    out = capsys.readouterr().out
    assert rc == 0 and "cache split: by_bytes_needed," in out


def test_proportional_rows_raise_floors_before_capping_at_the_ceiling() -> None:
    """Weights 1 : 0.6 : 2 over 8 rows, floors 2, 3, 3, at most 4 each: the third layer's first share
    (4.4) overshoots the ceiling only until the floors below it are met; by hand the split is 2, 3, 3
    (capping it at 4 first gave 2, 3, 4 = 9 rows, one more than there are)."""
    rows = proportional_rows(np.array([1.0, 0.6, 2.0]), np.array([2, 3, 3]), 4, 8)
    assert rows.tolist() == [2, 3, 3]


def test_proportional_rows_leave_nothing_while_a_layer_has_room() -> None:
    """Weights 3.5 : 0.25 over 10 rows, floors 4, 1, at most 5 each: the second layer is raised to its
    floor (1), the first capped at the ceiling (5), and the 4 rows left go to the second layer, which
    has room; by hand 5, 5 (before: each layer took one of them, the first 6 > the ceiling, 2 left)."""
    rows = proportional_rows(np.array([3.5, 0.25]), np.array([4, 1]), 5, 10)
    assert rows.tolist() == [5, 5]
