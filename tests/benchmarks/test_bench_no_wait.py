"""The compute of real runs that never wait for a read, next to the simulator's for the same
executed trace.

Grid points without prefetch, in shape mode (validate's shape) and in model mode (SmolLM2, when
transformers is installed), each run RUNS times with the reads' I/O skipped (`BundleReader._run`
does nothing: the plan, the cache and the compute are the same, nothing waits). Printed per
point, in ms per token: the real compute, its FFN, its attention side (the rest) and the cache work;
then the simulator's on this-host. Printed, not asserted."""

from __future__ import annotations

import numpy as np
import pytest

from devices import load_profile

pytest.importorskip("torch")

RUNS = 3
TOKENS = 24

def _phases(tokens: list) -> np.ndarray:
    """ms per token after validate's warm-up: compute, FFN, attention side, cache work."""
    from real.validation.validate_score import WARMUP_STEPS

    t = tokens[WARMUP_STEPS:]
    return 1e3 * np.array([np.mean([r.compute_s for r in t]), np.mean([r.ffn_compute_s for r in t]),
                           np.mean([r.compute_s - r.ffn_compute_s for r in t]), np.mean([r.mem_mgmt_s for r in t])])


def _report(label: str, runs: list, spec, cfg, tmp_path) -> np.ndarray:  # type: ignore[no-untyped-def]
    from real.runtime.run_outputs import write_executed_trace
    from sim.engine import simulate
    from traces.format import open_trace

    profile = load_profile("this-host")
    trace = open_trace(write_executed_trace(tmp_path / f"executed-{len(list(tmp_path.iterdir()))}", runs[0],
                                            runs[0].view, spec))
    real = np.median([_phases(r.tokens) for r in runs], axis=0)
    print(f"  {label:42s} real          " + " ".join(f"{x:7.2f}" for x in real))
    s = _phases(simulate(trace, spec, profile, cfg, fast=False).tokens)
    print(f"  {'':42s} {'sim':13s} " + " ".join(f"{x:7.2f}" for x in s))
    return real


HEADER = "no read waits (I/O skipped), ms per token: compute, FFN, attention side, cache work"


def test_bench_no_wait_shape(tmp_path, monkeypatch):
    from real.io.reader import BundleReader
    from real.runtime.shape_mode import run_shape, shape_config, shape_trace_like
    from real.validation.validate_grid import GridPoint, validation_spec
    from real.weights.convert import write_shape_store
    from real.weights.store import open_store
    from traces.format import open_trace

    profile = load_profile("this-host")
    spec = validation_spec(quick=False)
    store = open_store(write_shape_store(spec, tmp_path / "store", seed=0, dtype="fp32", layout="both"))
    trace = open_trace(shape_trace_like(spec, tmp_path / "trace", TOKENS, 0))
    monkeypatch.setattr(BundleReader, "_run", lambda *a, **kw: 0)
    print(f"\nshape mode, {HEADER}")
    out = []
    for k, bundled in ((2, True), (8, False)):
        gp = GridPoint(k, bundled, "none", 0.25)
        _, cfg = gp.run_config(store, TOKENS, 0)
        cfg = shape_config(cfg)
        runs = [run_shape(store, trace, profile, cfg, seed=0, threads=1) for _ in range(RUNS)]
        out.append(_report(gp.label, runs, spec, cfg, tmp_path))
    assert all(np.all(np.isfinite(r)) for r in out)


def test_bench_no_wait_model(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from real.io.reader import BundleReader
    from real.runtime.model_mode import prepare, run_prepared
    from real.validation.validate_grid import MODEL_KEEP, GridPoint
    from real.validation.validate_runs import model_setup

    profile = load_profile("this-host")
    model, spec, store, ids = model_setup(TOKENS, tmp_path)
    ref = prepare(model, spec, store, ids, keep_fraction=MODEL_KEEP, workdir=tmp_path)
    monkeypatch.setattr(BundleReader, "_run", lambda *a, **kw: 0)
    print(f"\nmodel mode (SmolLM2), {HEADER}")
    out = []
    for k, bundled in ((2, True), (4, False)):
        gp = GridPoint(k, bundled, "none", 0.5)
        _, cfg = gp.run_config(store, len(ids), 0)
        runs = [run_prepared(ref, model, spec, store, profile, cfg, device="cpu", threads=1)[0] for _ in range(RUNS)]
        out.append(_report(gp.label, runs, store.spec, cfg, tmp_path))
    assert all(np.all(np.isfinite(r)) for r in out)
