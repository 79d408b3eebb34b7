"""Shape mode: real reads and sparse compute driven by a trace; records in the simulator's schema;
the executed trace replays in the simulator with exactly the same reads."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from devices import load_profile
from flashsim.main import main
from real.runtime.run_outputs import write_executed_trace, write_records
from real.weights.convert import write_shape_store
from real.weights.store import open_store
from sim.config import RunConfig
from sim.records import TOKEN_COLUMNS, TokenRecord
from tests.real.conftest import tiny_spec
from traces.format import open_trace

pytest.importorskip("torch")

# d_model 1024 in fp32: every row is exactly 4 KiB, so the store has no padding and the bytes the
# reader moves equal the simulator's whatever its padding model
ALIGNED = dict(d_model=1024, d_ff=256, n_layers=2)


@pytest.fixture(scope="module")
def shape_setup(tmp_path_factory):
    from real.runtime.shape_mode import shape_trace_like

    root = tmp_path_factory.mktemp("shape")
    spec = tiny_spec(**ALIGNED)
    store = open_store(write_shape_store(spec, root / "store", seed=3, dtype="fp32", layout="both"))
    spec = store.spec   # fp32, as stored
    trace = open_trace(shape_trace_like(spec, root / "trace", 10, seed=5, active_fraction=0.2, hot_skew=0.3))
    return root, spec, store, trace


def _cfg(k: int, bundled: bool, prefetch: str, budget: str = "64MiB") -> RunConfig:
    return RunConfig().with_overrides([
        "residency=window", f"window.k={k}", "predictor=oracle", f"bundling.bundled={str(bundled).lower()}",
        f"prefetch={prefetch}", "workload.prompt_tokens=0", f"memory.dram_budget_bytes={budget}"])


@pytest.mark.parametrize("k,bundled,prefetch", [(0, True, "none"), (2, False, "delta"), (8, True, "delta")])
def test_real_run_replays_exactly_in_the_simulator(shape_setup, k, bundled, prefetch):
    from real.runtime.shape_mode import run_shape
    from sim.engine import simulate

    root, spec, store, trace = shape_setup
    profile = load_profile("this-host")
    cfg = _cfg(k, bundled, prefetch)
    run = run_shape(store, trace, profile, cfg, seed=1)
    assert len(run.tokens) == trace.n_tokens
    assert all(isinstance(t, TokenRecord) for t in run.tokens)
    t = run.tokens[-1]
    assert t.latency_s == pytest.approx(t.compute_s + t.stall_s + t.mem_mgmt_s)
    assert t.recall == 1.0
    out = write_executed_trace(root / f"exec-{k}-{bundled}-{prefetch}", run, run.view, spec)
    ex = open_trace(out)
    for layer in range(spec.n_layers):   # the oracle computed exactly the trace's active sets
        assert np.array_equal(np.asarray(ex.packed_masks(layer)), np.asarray(trace.packed_masks(layer)))
    sim = simulate(ex, spec, profile, cfg, fast=False)
    assert [r.bytes_read for r in sim.tokens] == [r.bytes_read for r in run.tokens]
    assert [r.computed for r in sim.tokens] == [r.computed for r in run.tokens]
    assert [r.hits for r in sim.tokens] == [r.hits for r in run.tokens]
    assert [r.demand_bytes for r in sim.tokens] == [r.demand_bytes for r in run.tokens]


def test_records_schema_and_parquet(shape_setup, tmp_path):
    import pandas as pd

    from real.runtime.shape_mode import run_shape

    _, _, store, trace = shape_setup
    run = run_shape(store, trace, load_profile("this-host"), _cfg(1, True, "none"))
    assert [f.name for f in dataclasses.fields(run.tokens[0])] == list(TOKEN_COLUMNS)
    df = pd.read_parquet(write_records(tmp_path / "r.parquet", run))
    assert list(df.columns) == list(TOKEN_COLUMNS)
    assert len(df) == trace.n_tokens and (df["bytes_read"] >= 0).all()


def test_cli_real_run_shape_mode(shape_setup, tmp_path, capsys):
    root, _, store, trace = shape_setup
    rc = main(["real", "run", "--store", str(store.path), "--trace", str(trace.path), "--set", "window.k=2",
               "--set", "predictor.rank=0", "--dram-budget", "64MiB", "--records", str(tmp_path / "r.parquet"),
               "--trace-out", str(tmp_path / "exec"), "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["summary"]["steps"] == trace.n_tokens
    assert (tmp_path / "r.parquet").exists() and open_trace(tmp_path / "exec").n_tokens == trace.n_tokens
    assert main(["replay", "--trace", str(tmp_path / "exec"), "--device", "this-host", "--preset", "neuroprefetcher",
                 "--set", "window.k=2", "--set", "predictor.rank=0", "--dram-budget", "64MiB", "--json"]) == 0


def test_cli_bad_inputs_exit_2(shape_setup, tmp_path, capsys):
    root, _, store, trace = shape_setup
    assert main(["real", "run", "--store", str(tmp_path / "nope"), "--trace", str(trace.path)]) == 2
    other = write_shape_store(tiny_spec(d_model=128, d_ff=512, n_layers=2), tmp_path / "other", seed=1, dtype="fp32")
    assert main(["real", "run", "--store", str(other), "--trace", str(trace.path)]) == 2
    err = capsys.readouterr().err
    assert "trace" in err and "Traceback" not in err
    assert main(["real", "run", "--store", str(store.path), "--trace", str(trace.path),
                 "--set", "bundling.bundled=false", "--preset", "mmap"]) == 2


def test_attention_sets_by_hand():
    """A distinct attention set per layer up to ATTN_DISTINCT_BYTES, then as many as fit (>= 2)."""
    from devices.model_spec import load_model
    from real.runtime.shape_mode import ATTN_DISTINCT_BYTES, attention_sets
    from real.validation import validate_grid as G

    assert ATTN_DISTINCT_BYTES == 512 << 20
    # validation shape: q 8 x 128, kv 4 x 128 over d_model 1024: (2 x 1024 x 1024 + 2 x 512 x 1024) x 4 B
    # = 12 MiB per set, 42 fit in 512 MiB: all 8 layers get their own
    assert attention_sets(G.validation_spec(False), 4) == 8
    # Llama-2-7B: 4 x 4096 x 4096 per set, 128 MiB in fp16 (4 fit), 256 MiB in fp32 (2 fit)
    seven = load_model("llama-2-7b")
    assert attention_sets(seven, 2) == 4 and attention_sets(seven, 4) == 2
    # never more sets than layers, and at least 2 when there are 2 layers or more
    assert attention_sets(tiny_spec(n_layers=1), 4) == 1
    # one set larger than the whole allowance: still 2, so no layer reads the set the previous one did
    huge = seven.model_copy(update={"n_layers": 2, "d_model": 65536, "head_dim": 8192})
    assert attention_sets(huge, 4) == 2


def test_cuda_code_path_on_a_stand_in_device_matches_the_cpu(shape_setup, monkeypatch):
    """The backend's CUDA branch (pinned arena and scratch, one block copy per FFN, a stream sync)
    run on a stand-in device whose tensors live on the CPU: same outputs and bytes as the CPU path,
    and every page-locked buffer is unlocked at close. The GPU itself: scripts/device_cuda_check.sh."""
    import torch

    import real.runtime.device as D
    from real.runtime.shape_mode import run_shape

    class StandIn(D.ComputeDevice):
        def torch_device(self):
            return torch.device("cpu")

    pinned, unpinned = [], []
    monkeypatch.setattr(D, "choose_device", lambda pref="auto": StandIn("cuda", "stand-in", False))
    monkeypatch.setattr(D, "pin_host_buffer", lambda a, d: pinned.append(a.ctypes.data) or a.ctypes.data)
    monkeypatch.setattr(D, "unpin_host_buffer", lambda h: h is not None and unpinned.append(h))
    syncs = []
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: type("S", (), {"synchronize": lambda s: syncs.append(1)})())
    _, spec, store, trace = shape_setup
    cfg = _cfg(2, True, "delta")
    cuda = run_shape(store, trace, load_profile("this-host"), cfg, seed=1, device="cuda")
    monkeypatch.undo()
    cpu = run_shape(store, trace, load_profile("this-host"), cfg, seed=1, device="cpu")
    assert cuda.outputs == pytest.approx(cpu.outputs, rel=1e-6)
    assert [r.bytes_read for r in cuda.tokens] == [r.bytes_read for r in cpu.tokens]
    assert len(pinned) >= 2 and sorted(pinned) == sorted(unpinned)   # the arena and the gather scratch
    assert len(syncs) == trace.n_tokens * spec.n_layers
