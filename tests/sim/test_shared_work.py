"""Work that runs on one trace view share, and that must not change any run's answer:

* noisy predictors that differ only in recall and precision take the same latents from the same
  streams (sim/policies/error_memory.py `dense_noisy_sets`): one draw per layer serves every such
  predictor bound to a run on the view (sim/policies/predictor.py);
* quality sums are shared by computed-set content (sim/decisions.py `QualityMemo`): runs that compute
  the same sets under other parameters price their quality once.

Each shared result is compared with the same run on a fresh cache (nothing shared)."""

from __future__ import annotations

import numpy as np
import pytest

import sim.policies.predictor as predictor_mod
import sim.step_plans as step_plans
from sim import bitsets
from sim.engine import SetAlgebraCache, build, simulate
from sim.policies.error_memory import (
    ErrorMemory,
    Persistence,
    dense_noisy_sets,
    persistent_noisy_sets,
)
from sim.policies.presets import preset_config

RATES = [(0.99, 0.3), (0.843, 0.285), (0.7, 0.4)]   # wide error regions: the dense draws


@pytest.mark.parametrize("persistence", [Persistence(0.4, 0.36, 0.45, 0.41), Persistence()])
def test_dense_draws_for_several_rates_equal_one_call_each(persistence) -> None:
    truth = bitsets.pack(np.random.default_rng(7).random((40, 300)) < 0.3)
    many = dense_noisy_sets(np.random.default_rng(1), np.random.default_rng(2), truth, 300, RATES, persistence,
                            ErrorMemory())
    for (recall, precision), got in zip(RATES, many):
        alone = persistent_noisy_sets(np.random.default_rng(1), np.random.default_rng(2), truth, 300, recall,
                                      precision, persistence, ErrorMemory())
        np.testing.assert_array_equal(got, alone)
    assert not np.array_equal(many[0], many[1])      # the thresholds differ, so do the sets


def _noisy(recall: float, precision: float, k: int):  # type: ignore[no-untyped-def]
    return preset_config("llm-in-a-flash").with_overrides(
        [f"noisy.recall={recall}", f"noisy.precision={precision}", f"window.k={k}", "memory.dram_budget_bytes=64000000"])


def test_noisy_predictors_bound_on_one_view_draw_each_layer_once(small_trace, host, monkeypatch) -> None:
    calls = []
    real = predictor_mod.dense_noisy_sets
    monkeypatch.setattr(predictor_mod, "dense_noisy_sets", lambda *a, **k: calls.append(len(a[4])) or real(*a, **k))
    cache = SetAlgebraCache()
    sims = [build(small_trace, None, host, _noisy(r, p, k), cache=cache) for (r, p), k in zip(RATES, (1, 5, 20))]
    shared = [s.run() for s in sims]          # all three bound (announced) before the first draws
    assert calls == [3] * small_trace.n_layers
    for (r, p), k, got in zip(RATES, (1, 5, 20), shared):
        fresh = simulate(small_trace, None, host, _noisy(r, p, k), cache=SetAlgebraCache())
        assert got.summary() == fresh.summary()
        np.testing.assert_array_equal(got.mass[0], fresh.mass[0])


def test_runs_computing_the_same_sets_share_their_quality(small_trace, host, monkeypatch) -> None:
    """A predictor's rank costs time, not sets: the oracle at rank 128 computes the sets of the oracle
    at rank 0, prices no quality of its own, and answers as a fresh run; the noisy predictor's
    other sets are priced anew."""
    calls = []
    real = step_plans.layer_quality
    monkeypatch.setattr(step_plans, "layer_quality", lambda *a, **k: calls.append(a[1]) or real(*a, **k))

    def cfg(*sets: str):  # type: ignore[no-untyped-def]
        return preset_config("llm-in-a-flash").with_overrides([*sets, "memory.dram_budget_bytes=64000000"])
    cache = SetAlgebraCache()
    simulate(small_trace, None, host, cfg("predictor=oracle", "oracle.rank=0"), cache=cache)
    n_first = len(calls)
    assert n_first > 0
    second = simulate(small_trace, None, host, cfg("predictor=oracle", "oracle.rank=128"), cache=cache)
    assert len(calls) == n_first
    fresh = simulate(small_trace, None, host, cfg("predictor=oracle", "oracle.rank=128"), cache=SetAlgebraCache())
    assert second.summary() == fresh.summary()
    np.testing.assert_array_equal(second.mass[0], fresh.mass[0])
    noisy = simulate(small_trace, None, host, cfg(), cache=cache)
    assert len(calls) > n_first
    assert noisy.summary()["activation_mass_kept"] != second.summary()["activation_mass_kept"]
