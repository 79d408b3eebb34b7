"""The real backend's neuron cache takes the simulator's per-layer shares (`memory.cache_split`): the same
caps per layer, matrices sized from them, and a shape-mode run the simulator replays exactly."""

from __future__ import annotations

import numpy as np
import pytest

from devices import load_profile
from real.runtime.run_outputs import write_executed_trace
from real.weights.convert import write_shape_store
from real.weights.store import open_store
from sim import bitsets
from sim.config import RunConfig
from tests.real.conftest import tiny_spec
from traces.format import open_trace

pytest.importorskip("torch")

# fp32 rows of exactly 4 KiB (d_model 1024): no padding, so the bytes read equal the simulator's
SHAPE = dict(d_model=1024, d_ff=256, n_layers=3)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):  # type: ignore[no-untyped-def]
    from real.runtime.shape_mode import shape_trace_like

    root = tmp_path_factory.mktemp("shares")
    store = open_store(write_shape_store(tiny_spec(**SHAPE), root / "store", seed=3, dtype="fp32", layout="bundled"))
    trace = open_trace(shape_trace_like(store.spec, root / "trace", 12, seed=7, active_fraction=0.15, hot_skew=0.3))
    return root, store, trace


def _cfg(split: str, budget: int | None = None) -> RunConfig:
    sets = ["residency=window", "window.k=inf", "predictor=oracle", "prefetch=none", "workload.prompt_tokens=0",
            f"memory.cache_split={split}"]
    if budget is not None:
        sets.append(f"memory.dram_budget_bytes={budget}")
    return RunConfig().with_overrides(sets)


def _budget(store, trace, profile) -> int:  # type: ignore[no-untyped-def]
    """The budget whose caches hold every layer's largest step plus 30 rows over all layers."""
    from real.runtime.shape_mode import shape_config
    from sim.engine import build

    sim = build(trace, store.spec, profile, shape_config(_cfg("equal")))
    m, S = sim.memory, sim.steps.n
    floors = sum(int(bitsets.count(sim.view.needed(layer, 0, S)).max()) for layer in range(sim.spec.n_layers))
    return m.fixed_bytes + int(m.kv_bytes.max()) + (floors + 30) * m.neuron_bytes


@pytest.mark.parametrize("split", ["equal", "by_bytes_needed", "greedy_marginal"])
def test_real_cache_uses_the_simulators_shares(setup, split) -> None:  # type: ignore[no-untyped-def]
    from real.runtime.backend import RealExecutor
    from real.runtime.shape_mode import run_shape, shape_config
    from sim.engine import build, simulate

    root, store, trace = setup
    profile = load_profile("this-host")
    cfg = _cfg(split, _budget(store, trace, profile))
    ex = RealExecutor(store, trace, profile, shape_config(cfg))
    try:
        sim = build(trace, store.spec, profile, shape_config(cfg))
        L, S, N = sim.spec.n_layers, sim.steps.n, sim.spec.d_ff
        caps = sim.memory.layer_caps(sim.budget_bytes, 0, S, L)
        assert np.array_equal(ex.share_rows, caps.max(axis=0))          # one split, both backends
        if split != "equal":
            assert np.array_equal(caps[-1], sim.memory.shares.rows_at_ref)
        peak = max(int(bitsets.count(sim.view.needed(layer, 0, S)).max()) for layer in range(L))
        assert [c.capacity for c in ex.caches] == [min(N, int(r) + peak) for r in ex.share_rows]
    finally:
        ex.close()
    run = run_shape(store, trace, profile, cfg, seed=1)
    ex_trace = open_trace(write_executed_trace(root / f"exec-{split}", run, run.view, store.spec))
    rep = simulate(ex_trace, store.spec, profile, shape_config(cfg), fast=False)
    assert [r.bytes_read for r in rep.tokens] == [r.bytes_read for r in run.tokens]
    assert [r.hits for r in rep.tokens] == [r.hits for r in run.tokens]
