"""A run's decisions are memoised (sim.step_plans.DecisionMemo, keyed by sim.engine.SetAlgebraCache):
a second run with the same decisions (the same configuration at the datasheet peak, as `plan` and
`replay` do for their peak bound) prices the first run's outcomes instead of asking the policies
again. The answers must equal those of a run that asked the policies itself (a fresh cache)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from devices import load_profile
from devices.achievable import at_bound
from devices.errors import BudgetError
from sim.components.memory import BudgetTimeline
from sim.engine import SetAlgebraCache, build, simulate
from sim.policies.presets import preset_config

CASES = [
    ("llm-in-a-flash", []),                                  # noisy predictor, window cache
    ("neuroprefetcher", []),                                 # noisy prefetch: timing feedback (DES)
    ("selectinfer", []),                                     # notes written while binding and planning
    ("mmap", []),                                            # the page path
    ("hybrid", ["prune.blocks=ffn:1"]),                      # a dropped FFN layer
]


def _records(result) -> list:  # type: ignore[no-untyped-def]
    return [(r.token, r.latency_s, r.bytes_read) for r in result.tokens]


@pytest.mark.parametrize("preset,sets", CASES)
def test_peak_run_from_the_memo_equals_a_fresh_peak_run(small_trace, host, preset, sets) -> None:
    cfg = preset_config(preset).with_overrides([*sets, "memory.dram_budget_bytes=64000000"])
    achievable, peak = at_bound(host, "achievable"), at_bound(host, "peak")
    cache = SetAlgebraCache()
    simulate(small_trace, None, achievable, cfg, cache=cache)
    sim = build(small_trace, None, peak, cfg, cache=cache)
    assert sim.planner.memo is not None and sim.planner.memo.complete     # the achievable run's decisions
    from_memo = sim.run()
    fresh = simulate(small_trace, None, peak, cfg, cache=SetAlgebraCache())
    assert from_memo.summary() == fresh.summary()
    assert _records(from_memo) == _records(fresh)
    assert from_memo.notes == fresh.notes
    np.testing.assert_array_equal(from_memo.mass[0], fresh.mass[0])


def test_memo_prices_on_the_run_s_own_device(small_trace) -> None:
    """The memo holds decisions, not times: the peak run from the memo is faster than the achievable run
    (a datasheet profile, whose peak numbers are above its achievable ones)."""
    orin = load_profile("jetson-orin-nano-8gb")
    cfg = preset_config("llm-in-a-flash").with_overrides(["memory.dram_budget_bytes=64000000"])
    cache = SetAlgebraCache()
    slow = simulate(small_trace, None, at_bound(orin, "achievable"), cfg, cache=cache).summary()["tokens_per_s"]
    fast = simulate(small_trace, None, at_bound(orin, "peak"), cfg, cache=cache).summary()["tokens_per_s"]
    assert fast > slow


def test_a_failed_run_leaves_no_memo(small_trace, host) -> None:
    """A budget that holds the weights and KV cache but not one layer's computed neurons fails while
    planning (after its memo was made): the memo is dropped, and a second run fails the same way."""
    big = build(small_trace, None, host, preset_config("llm-in-a-flash"), cache=SetAlgebraCache())
    mem = big.memory
    budget = mem.fixed_bytes + int(mem.kv_bytes.max()) + 2 * mem.neuron_bytes
    cfg = preset_config("llm-in-a-flash").with_overrides([f"memory.dram_budget_bytes={budget}"])
    cache = SetAlgebraCache()
    for _ in range(2):
        sim = build(small_trace, None, host, cfg, cache=cache)
        assert sim.planner.memo is not None and not sim.planner.memo.complete
        with pytest.raises(BudgetError, match="DRAM budget too small"):
            sim.run()
        assert sim.planner.memo.failed and not sim.planner.memo.outcomes
    cache.trim_decisions()
    assert not cache._decisions


def test_different_budgets_or_seeds_do_not_share_decisions(small_trace, host) -> None:
    cache = SetAlgebraCache()
    runs = {}
    for budget, seed in ((64_000_000, 0), (64_000_000, 1), (2_000_000, 0)):
        cfg = preset_config("llm-in-a-flash").with_overrides([f"memory.dram_budget_bytes={budget}", f"sim.seed={seed}"])
        runs[(budget, seed)] = simulate(small_trace, None, host, cfg, cache=cache).summary()
        fresh = simulate(small_trace, None, host, cfg, cache=SetAlgebraCache()).summary()
        assert runs[(budget, seed)] == fresh


def test_budget_timeline_runs_get_no_memo(small_trace, host) -> None:
    cfg = preset_config("llm-in-a-flash").with_overrides(["memory.dram_budget_bytes=64000000"])
    cfg = replace(cfg, budget_timeline=BudgetTimeline((0.0,), (64_000_000,)))
    assert build(small_trace, None, host, cfg, cache=SetAlgebraCache()).planner.memo is None


def test_memo_is_bounded_by_bytes(small_trace, host) -> None:
    cache = SetAlgebraCache(max_decision_bytes=1)
    for k in (1, 2, 3):
        cfg = preset_config("llm-in-a-flash").with_overrides([f"window.k={k}", "memory.dram_budget_bytes=64000000"])
        simulate(small_trace, None, host, cfg, cache=cache)
    cache.trim_decisions()
    assert len(cache._decisions) == 0
