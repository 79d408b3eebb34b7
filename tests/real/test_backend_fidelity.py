"""RealExecutor's fidelity rules: the store's padding is what the simulator counts (bytes read agree
exactly with units that are not 4 KiB multiples), the layout's coalescing limit is the reader's,
block pruning is refused and a cache share too small for a step is one line (exit 2)."""

from __future__ import annotations

import sys

import pytest

from devices import load_profile
from devices.errors import FlashsimError
from flashsim.main import main
from real.runtime.executor_plan import store_alignment_bytes, store_config
from real.runtime.run_outputs import write_executed_trace
from real.weights.convert import write_shape_store
from real.weights.store import open_store
from sim.config import RunConfig
from tests.real.conftest import tiny_spec
from traces.format import open_trace

pytest.importorskip("torch")

# d_model 128 fp32: a row is 512 B and a bundle (gate | up | down) 1536 B; a padded store puts each in a
# 4096 B stride, so the real reads move 8x (unbundled) and 2.67x (bundled) the useful bytes
SPEC = dict(d_model=128, d_ff=256, n_layers=2)
ROW, BUNDLE = 128 * 4, 3 * 128 * 4


@pytest.fixture(scope="module")
def padded_setup(tmp_path_factory):
    from real.runtime.shape_mode import shape_trace_like

    root = tmp_path_factory.mktemp("padded")
    store = open_store(write_shape_store(tiny_spec(**SPEC), root / "store", seed=3, dtype="fp32", layout="both"))
    trace = open_trace(shape_trace_like(store.spec, root / "trace", 8, seed=5, active_fraction=0.2, hot_skew=0.3))
    return root, store, trace


def _cfg(*sets: str, budget: str = "64MiB") -> RunConfig:
    return RunConfig().with_overrides(["residency=window", "predictor=oracle", "workload.prompt_tokens=0",
                                       f"memory.dram_budget_bytes={budget}", *sets])


@pytest.mark.parametrize("sets", [
    ("window.k=0", "bundling.bundled=true", "prefetch=none"),
    ("window.k=2", "bundling.bundled=false", "prefetch=delta"),
    ("window.k=1", "bundling.bundled=true", "prefetch=delta", "bundling.max_chunk_bytes=8KiB"),
    ("window.k=0", "bundling.bundled=false", "prefetch=none", "bundling.coalesce=false"),
])
def test_padded_store_replays_with_exactly_the_bytes_read(padded_setup, sets):
    from real.runtime.shape_mode import run_shape
    from sim.engine import simulate

    root, store, trace = padded_setup
    profile = load_profile("this-host")
    cfg = _cfg(*sets)
    run = run_shape(store, trace, profile, cfg, seed=1, threads=1)
    assert run.config["layout"]["align_bytes"] == 4096          # set from the manifest
    ex = open_trace(write_executed_trace(root / ("exec-" + "-".join(sets)), run, run.view, store.spec))
    aligned, _ = store_config(cfg, store)
    sim = simulate(ex, store.spec, profile, aligned, fast=False)
    real_b = [t.bytes_read for t in run.tokens]
    assert sum(real_b) > 0
    assert [t.bytes_read for t in sim.tokens] == real_b
    assert [t.demand_bytes for t in sim.tokens] == [t.demand_bytes for t in run.tokens]
    assert [t.prefetch_bytes for t in sim.tokens] == [t.prefetch_bytes for t in run.tokens]
    assert [t.reads_issued for t in sim.tokens] == [t.reads_issued for t in run.tokens]
    # the packed layout (the simulator before) counts the useful bytes only
    if "bundling.coalesce=false" in sets:
        packed = simulate(ex, store.spec, profile, cfg, fast=False)
        assert [t.bytes_read * 4096 for t in packed.tokens] == [b * ROW for b in real_b]


def test_store_config_follows_the_manifest(padded_setup, tmp_path):
    _, store, _ = padded_setup
    assert store_alignment_bytes(store) == 4096
    cfg, note = store_config(_cfg(), store)
    assert cfg.layout.params.align_bytes == 4096 and note is None
    cfg, note = store_config(_cfg("bundling.align_bytes=512", "bundling.bundled=false"), store)
    assert cfg.layout.params.align_bytes == 4096 and not cfg.layout.params.bundled and "replaced" in note
    packed = open_store(write_shape_store(tiny_spec(**SPEC), tmp_path / "packed", seed=1, dtype="fp32",
                                          alignment="packed"))
    assert store_alignment_bytes(packed) == 0
    assert store_config(_cfg(), packed)[0].layout.params.align_bytes == 0


def test_block_pruning_is_refused(padded_setup, capsys):
    from real.runtime.backend import RealExecutor

    _, store, trace = padded_setup
    with pytest.raises(FlashsimError, match="prune.blocks='ffn:1'.*real/studies/pruning.py"):
        RealExecutor(store, trace, load_profile("this-host"), _cfg("prune.blocks=ffn:1"))
    assert main(["real", "run", "--store", str(store.path), "--trace", str(trace.path),
                 "--set", "prune.blocks=mha:0", "--dram-budget", "64MiB"]) == 2
    err = capsys.readouterr().err
    assert "prune.blocks" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_shape_mode_cache_too_small_is_one_line(padded_setup, capsys):
    """The budget holds the fixed weights and KV cache but a share of only a few neurons per layer,
    while the trace computes ~20% (51) of them: a one-line error, exit 2."""
    from real.runtime.shape_mode import run_shape

    _, store, trace = padded_setup
    spec = store.spec
    budget = spec.non_ffn_bytes + (trace.n_tokens + 1) * spec.kv_bytes_per_token + 8 * spec.n_layers * spec.ffn_neuron_bytes
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(FlashsimError, match="DRAM budget too small at step 0: layer 0 computes"):
            run_shape(store, trace, load_profile("this-host"), _cfg("window.k=2", budget=str(budget)), threads=1)
        assert torch.get_num_threads() == 2      # refused before it set the compute threads
    finally:
        torch.set_num_threads(before)
    assert main(["real", "run", "--store", str(store.path), "--trace", str(trace.path), "--set", "window.k=2",
                 "--set", "predictor.rank=0", "--dram-budget", f"{budget}B"]) == 2
    err = capsys.readouterr().err
    assert "DRAM budget too small" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1



def test_every_plan_is_made_before_the_first_token(padded_setup, monkeypatch):
    """The policy bookkeeping is not part of the run, and a prefetch in flight must not run on
    through it: the executor plans every step when it is built, so the layer loop never plans (the
    run below fails if it does), and the sets it carries out are the plans' own."""
    from real.runtime.backend import RealExecutor
    from sim.policies.stack import PolicyStack

    root, store, trace = padded_setup
    cfg = _cfg("window.k=2", "bundling.bundled=false", "prefetch=delta")
    planned: list[tuple[int, int]] = []
    orig = PolicyStack.plan

    def plan(self, layer, s0, s1, cap):
        planned.append((layer, s0))
        return orig(self, layer, s0, s1, cap)

    monkeypatch.setattr(PolicyStack, "plan", plan)
    ex = RealExecutor(store, trace, load_profile("this-host"), store_config(cfg, store)[0], threads=1)
    S, L = ex.n_steps, store.spec.n_layers
    assert planned == [(layer, s) for s in range(S) for layer in range(L)]     # the run's order, once each
    assert ex.plan_total_s > 0
    try:
        import torch

        def no_plan(*a, **k):
            raise AssertionError("planned inside the timed loop")

        monkeypatch.setattr(PolicyStack, "plan", no_plan)
        monkeypatch.setattr(sys.modules["sim.quality_proxy"], "layer_quality", no_plan)
        x = torch.ones(1, store.spec.d_model)
        for s in range(S):
            ex.begin_step(s)
            for layer in range(L):
                ex.ffn(layer, x)
            ex.end_step()
        run = ex.finish()
    except BaseException:
        ex.close()
        raise
    assert len(run.tokens) == S
    assert sum(t.computed for t in run.tokens) == int(sum(bin(int(w)).count("1") for w in run.executed.ravel()))
    assert any("planned before the run" in n for n in run.notes)


@pytest.mark.parametrize("bundled", ["true", "false"])
def test_cache_at_its_share_replays_exactly(padded_setup, bundled):
    """A window larger than the cache share with delta prefetch: the plan evicts before its demand reads
    land and prefetches some evicted neurons back; the real run carries that out, so the prefetch bytes
    agree with the replay step by step (before: the real cache kept those rows and read less)."""
    from real.runtime.shape_mode import run_shape
    from sim.engine import simulate

    root, store, trace = padded_setup
    spec, profile = store.spec, load_profile("this-host")
    share = 70     # neurons per layer; the trace computes ~51 per step with 60% overlap, so k=8 overflows it
    row = 4096     # DRAM per cached neuron: the 1536 B bundle in the real cache's 4 KiB row (the memory model's too)
    budget = spec.non_ffn_bytes + (trace.n_tokens + 1) * spec.kv_bytes_per_token + share * spec.n_layers * row
    cfg = _cfg("window.k=8", f"bundling.bundled={bundled}", "prefetch=delta", budget=str(budget))
    run = run_shape(store, trace, profile, cfg, seed=1, threads=1)
    ex = open_trace(write_executed_trace(root / f"exec-share-{bundled}", run, run.view, spec))
    sim = simulate(ex, spec, profile, store_config(cfg, store)[0], fast=False)
    assert max(t.cache_bytes for t in sim.tokens) >= 0.9 * share * spec.n_layers * row  # at the share
    for f in ("bytes_read", "demand_bytes", "prefetch_bytes", "hits", "computed"):
        assert [getattr(t, f) for t in sim.tokens] == [getattr(t, f) for t in run.tokens], f



def test_static_neurons_are_counted_once_in_the_records(padded_setup, tmp_path):
    """Hybrid keeps its static neurons in the cache rows, and the simulator counts them in its fixed
    term; the real records must count them once too, so their resident bytes equal the replay's."""
    from real.runtime.shape_mode import run_shape
    from sim.engine import simulate

    _, store, trace = padded_setup
    profile = load_profile("this-host")
    cfg = RunConfig().with_overrides(["residency=hybrid", "hybrid.fraction=0.95", "predictor=oracle",
                                      "workload.prompt_tokens=0", "memory.dram_budget_bytes=64MiB"])
    run = run_shape(store, trace, profile, cfg, seed=1, threads=1)
    assert int(run.view.trace.n_layers) == 2 and run.tokens[0].cache_bytes < 235 * 4096   # 235 static per layer
    ex = open_trace(write_executed_trace(tmp_path / "exec", run, run.view, store.spec))
    sim = simulate(ex, store.spec, profile, store_config(cfg, store)[0], fast=False)
    assert [t.cache_bytes for t in run.tokens] == [t.cache_bytes for t in sim.tokens]
    assert [t.resident_bytes for t in run.tokens] == [t.resident_bytes for t in sim.tokens]
