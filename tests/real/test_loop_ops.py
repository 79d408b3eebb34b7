"""The simulator's torch calls per layer of the real backend's Python decoder loop
(sim/components/compute.py LOOP_FFN_OPS, LOOP_ATTENTION_OPS) are what the loop makes: counted here
with a TorchFunctionMode in shape mode and in model mode, per layer as the difference between a
4-layer and a 2-layer model (what runs once per token cancels)."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from devices import load_profile
from devices.model_spec import ModelSpec
from real.bench.bench_host_cpu import TorchCallCounter
from sim.components.compute import LOOP_ATTENTION_OPS, LOOP_FFN_OPS
from sim.config import RunConfig
from tests.real.conftest import tiny_spec

torch = pytest.importorskip("torch")

CFG = ["residency=window", "window.k=2", "predictor=oracle", "prefetch=delta", "workload.prompt_tokens=0",
       "memory.dram_budget_bytes=64MiB"]


def _count(fn, monkeypatch) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """(torch calls inside the steps, those inside RealExecutor.ffn) while fn() runs: counted from
    each step's begin_step to its end_step, so building the model and the run is not."""
    from real.runtime.backend import RealExecutor

    counter, seen = TorchCallCounter(torch), {"step": 0, "ffn": 0, "open": None}
    begin, end, ffn = RealExecutor.begin_step, RealExecutor.end_step, RealExecutor.ffn

    def begin_step(self, step):  # type: ignore[no-untyped-def]
        begin(self, step)
        seen["open"] = counter.calls

    def end_step(self, *a, **k):  # type: ignore[no-untyped-def]
        seen["step"] += counter.calls - seen["open"]
        return end(self, *a, **k)

    def counted(self, layer, x):  # type: ignore[no-untyped-def]
        before = counter.calls
        y = ffn(self, layer, x)
        seen["ffn"] += counter.calls - before
        return y

    monkeypatch.setattr(RealExecutor, "begin_step", begin_step)
    monkeypatch.setattr(RealExecutor, "end_step", end_step)
    monkeypatch.setattr(RealExecutor, "ffn", counted)
    with counter.mode:
        fn()
    return seen["step"], seen["ffn"]


def _per_layer(runs: dict[int, tuple[int, int]], steps: int) -> tuple[float, float]:
    (a2, f2), (a4, f4) = runs[2], runs[4]
    return (a4 - a2) / (2 * steps), (f4 - f2) / (2 * steps)


def test_shape_mode_loop(tmp_path, monkeypatch):
    from real.runtime.shape_mode import run_shape, shape_trace_like
    from real.weights.convert import write_shape_store
    from real.weights.store import open_store
    from traces.format import open_trace

    steps, runs = 6, {}
    for n_layers in (2, 4):
        store = open_store(write_shape_store(tiny_spec(n_layers=n_layers), tmp_path / f"s{n_layers}", seed=1,
                                             dtype="fp32"))
        trace = open_trace(shape_trace_like(store.spec, tmp_path / f"t{n_layers}", steps, seed=2))
        cfg = RunConfig().with_overrides(CFG)
        runs[n_layers] = _count(partial(run_shape, store, trace, load_profile("this-host"), cfg, seed=0), monkeypatch)
    total, ffn = _per_layer(runs, steps)
    assert ffn == LOOP_FFN_OPS
    assert total - ffn == LOOP_ATTENTION_OPS["kernels"]


def test_model_mode_loop(tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    from real.runtime.model_mode import prepare, run_prepared
    from real.weights.convert import convert_state_dict
    from real.weights.store import open_store

    steps, runs = 8, {}
    ids = np.random.default_rng(0).integers(0, 200, steps)
    for n_layers in (2, 4):
        torch.manual_seed(0)
        hf = transformers.LlamaConfig(vocab_size=200, hidden_size=64, intermediate_size=256, num_hidden_layers=n_layers,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
        model = transformers.LlamaForCausalLM(hf).eval()
        spec = ModelSpec.from_hf_config(hf.to_dict(), name="tiny-llama")
        store = open_store(convert_state_dict(model.state_dict(), spec, tmp_path / f"m{n_layers}", dtype="fp32"))
        ref = prepare(model, spec, store, ids, keep_fraction=0.5, workdir=tmp_path / f"w{n_layers}")
        cfg = RunConfig().with_overrides(CFG)
        runs[n_layers] = _count(partial(run_prepared, ref, model, spec, store, load_profile("this-host"), cfg),
                                monkeypatch)
    total, ffn = _per_layer(runs, steps)
    assert ffn == LOOP_FFN_OPS
    # transformers makes a few calls on some steps only (68.6 per layer on average when counted)
    assert total - ffn == pytest.approx(LOOP_ATTENTION_OPS["hf"], abs=1.0)
