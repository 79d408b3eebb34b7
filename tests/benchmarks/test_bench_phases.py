"""Where a real token's time goes, phase by phase, next to the simulator's split of the same
token.

SmolLM2 in model mode (validate's store and text), bundled, window k = 2, 50% of the FFN, without
prefetch and with a delta prefetch, alternating. The real phases come from wrapping the executor's
FFN call (`RealExecutor.ffn`): its cache work (`mem_mgmt_s`), its waits (`stall_s`) and the rest
of the call (the FFN); the attention is the time between two layers' FFN calls; what is left of
the latency (layer 0's attention, the embedding, the lm_head) is "other". The simulator's phases
are its timeline's intervals for the run's executed trace. Printed, not asserted: the seventeenth
round found the simulator putting a delta prefetch's cost on the attention while the real cache
work and FFN slow too, and the real attention without prefetch at twice the simulated."""

from __future__ import annotations

import time
from collections import defaultdict

import numpy as np
import pytest

from devices import load_profile

pytest.importorskip("transformers")

PHASES = ("attention", "cache work", "waits", "FFN", "other")
RUNS = 2          # per prefetch, alternating
TOKENS = 24


def _real_phases(calls: list, tokens: list, warmup: int) -> dict[str, float]:
    """Mean ms per token after warm-up from the wrapped FFN calls (step, layer, (t, mgmt, stall) at
    entry, the same at exit) and the run's token records."""
    by_step: dict[int, list] = defaultdict(list)
    for step, layer, a, b in calls:
        by_step[step].append((layer, a, b))
    per_step = []
    for s, rows in sorted(by_step.items()):
        if s < warmup:
            continue
        rows.sort()
        ph = dict.fromkeys(PHASES, 0.0)
        for i, (_, a, b) in enumerate(rows):
            ph["cache work"] += b[1] - a[1]
            ph["waits"] += b[2] - a[2]
            ph["FFN"] += (b[0] - a[0]) - (b[1] - a[1]) - (b[2] - a[2])
            if i:
                ph["attention"] += a[0] - rows[i - 1][2][0]
        ph["other"] = tokens[s].latency_s - sum(ph.values())
        per_step.append(ph)
    return {k: 1e3 * float(np.mean([p[k] for p in per_step])) for k in PHASES}


def _sim_phases(intervals: list, n_steps: int, warmup: int) -> dict[str, float]:
    ph = dict.fromkeys(PHASES, 0.0)
    for iv in intervals:
        if iv.step < warmup or iv.lane == "flash":
            continue
        if iv.lane == "memory":
            k = "cache work"
        elif iv.lane == "stall":
            k = "waits"
        else:
            k = "attention" if iv.name.startswith("attention") else "FFN" if iv.name.startswith("FFN") else "other"
        ph[k] += iv.t_end_s - iv.t_start_s
    return {k: 1e3 * v / (n_steps - warmup) for k, v in ph.items()}


def test_bench_phases(tmp_path, monkeypatch):
    import real.runtime.backend as backend
    from real.runtime.model_mode import prepare, run_prepared
    from real.runtime.run_outputs import write_executed_trace
    from real.validation.validate_grid import MODEL_KEEP, GridPoint
    from real.validation.validate_runs import model_setup
    from real.validation.validate_score import WARMUP_STEPS
    from sim.engine import simulate
    from traces.format import open_trace

    profile = load_profile("this-host")
    model, spec, store, ids = model_setup(TOKENS, tmp_path)
    ref = prepare(model, spec, store, ids, keep_fraction=MODEL_KEEP, workdir=tmp_path)
    calls: list = []
    ffn = backend.RealExecutor.ffn

    def timed_ffn(self, layer, x):  # type: ignore[no-untyped-def]
        T = self.times
        a = (time.perf_counter(), T.mem_mgmt_s, T.stall_s)
        y = ffn(self, layer, x)
        calls.append((self.step, layer, a, (time.perf_counter(), T.mem_mgmt_s, T.stall_s)))
        return y

    monkeypatch.setattr(backend.RealExecutor, "ffn", timed_ffn)
    print(f"\nphases, ms per token (SmolLM2, bundled, k=2, 50% of the FFN, {TOKENS} tokens, "
          f"{WARMUP_STEPS} warm-up): " + ", ".join(PHASES) + ", latency")
    for i in range(2 * RUNS):
        prefetch = ("none", "delta")[i % 2]
        _, cfg = GridPoint(2, True, prefetch, 0.5).run_config(store, len(ids), 0)
        calls.clear()
        run, _ = run_prepared(ref, model, spec, store, profile, cfg, device="cpu", threads=1)
        real = _real_phases(calls, run.tokens, WARMUP_STEPS)
        res = simulate(open_trace(write_executed_trace(tmp_path / f"executed-{i}", run, run.view, store.spec)),
                       store.spec, profile, cfg, fast=False, timeline=True)
        sim = _sim_phases(res.intervals, len(res.tokens), WARMUP_STEPS)
        for side, ph, toks in (("real", real, run.tokens), ("simulated", sim, res.tokens)):
            lat = 1e3 * np.mean([t.latency_s for t in toks[WARMUP_STEPS:]])
            print(f"  {prefetch:5s} {side:9s} " + "  ".join(f"{ph[k]:7.1f}" for k in PHASES) + f"  {lat:7.1f}")
        assert all(np.isfinite(v) for v in real.values())
