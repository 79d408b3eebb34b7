"""Properties that must hold for any configuration (hypothesis): memory within the budget at every
event, bytes read = sum of read sizes, time never runs backwards, every computed neuron resident
before its FFN starts, simulated time never beats the roofline bound."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devices.errors import FlashsimError
from sim.engine import SetAlgebraCache, build
from sim.policies.presets import preset_config

CASES = st.fixed_dictionaries({
    "preset": st.sampled_from(["naive", "hybrid", "llm-in-a-flash", "neuroprefetcher", "selectinfer", "dense", "mmap"]),
    "k": st.one_of(st.integers(0, 6), st.just("inf")),
    "prefetch": st.sampled_from(["none", "delta", "lookahead"]),
    "recall": st.sampled_from([1.0, 0.7]),
    "bundled": st.booleans(),
    "coalesce": st.booleans(),
    "batch": st.integers(1, 3),
    "budget_frac": st.sampled_from([None, 0.5, 0.8, 1.0]),
    "stream": st.booleans(),
    "device": st.sampled_from(["this-host", "apple-m1-max", "rtx4090-nvme"]),
})


def _config(case):  # type: ignore[no-untyped-def]
    cfg = preset_config(case["preset"])
    sets = [f"bundling.bundled={case['bundled']}", f"bundling.coalesce={case['coalesce']}",
            f"workload.batch={case['batch']}"]
    if case["stream"] and case["preset"] != "mmap":
        sets.append("memory.stream_non_ffn=true")
    if cfg.residency.name == "window":
        sets.append(f"window.k={case['k']}")
    if case["preset"] not in ("mmap",):
        sets.append(f"prefetch={case['prefetch']}")
        if case["prefetch"] != "none":
            sets.append(f"{case['prefetch']}.recall={case['recall']}")
    return cfg.with_overrides(sets)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=CASES)
def test_run_invariants(case, small_trace) -> None:  # type: ignore[no-untyped-def]
    from devices import load_profile

    prof = load_profile(case["device"])
    cfg = _config(case)
    sim = build(small_trace, None, prof, cfg, cache=SetAlgebraCache())
    if case["budget_frac"] is not None:
        # a budget between what must stay resident and the full need: policies must fit or refuse
        need = sim.memory.fixed_bytes + int(sim.memory.kv_bytes.max()) + small_trace.spec.ffn_bytes_total
        budget = int(sim.memory.fixed_bytes + int(sim.memory.kv_bytes.max())
                     + case["budget_frac"] * (need - sim.memory.fixed_bytes))
        cfg = cfg.with_overrides([f"memory.dram_budget_bytes={budget}"])
        try:
            sim = build(small_trace, None, prof, cfg, cache=SetAlgebraCache())
            r = sim.run(fast=False, timeline=True)
        except FlashsimError as e:          # refusing is allowed, silently exceeding is not
            assert "budget" in str(e).lower() or "DRAM" in str(e)
            return
    else:
        r = sim.run(fast=False, timeline=True)
    recs = r.tokens
    # memory: within the budget at every step and every sample
    assert all(t.resident_bytes <= t.budget_bytes for t in recs)
    assert all(m.resident_bytes <= m.budget_bytes for m in r.memory if m.resident_bytes >= 0)
    # bytes read = sum of the sizes of the reads the device served
    assert sum(b.nbytes for b in r.flash_log) == sum(t.bytes_read for t in recs)
    assert sum(b.nreads for b in r.flash_log) == sum(t.reads_issued for t in recs)
    # time never runs backwards
    starts = [b.t_start_s for b in r.flash_log]
    assert starts == sorted(starts)
    assert all(b.t_issue_s <= b.t_start_s <= b.t_end_s for b in r.flash_log)
    assert recs[0].t_start_s == 0.0
    assert all(a.t_end_s == pytest.approx(b.t_start_s, abs=1e-15) for a, b in zip(recs, recs[1:]))
    assert all(iv.t_start_s <= iv.t_end_s for iv in r.intervals)
    # every computed neuron is resident when its FFN starts: the FFN begins after the demand and
    # prefetch batches of that (step, layer) have landed
    landed: dict[tuple[int, int], float] = defaultdict(float)
    for b in r.flash_log:
        if b.tag in ("demand", "prefetch"):
            landed[(b.step, b.layer)] = max(landed[(b.step, b.layer)], b.t_end_s)
    for iv in r.intervals:
        if iv.name.startswith("FFN"):
            assert iv.t_start_s >= landed.get((iv.step, iv.layer), 0.0) - 1e-15
    # roofline: no step is faster than its compute at full DRAM bandwidth; the run is no faster
    # than the flash's busy time
    p = sim.planner.arr
    compute_floor = (p.attn.total_s() * p.L + p.ffn_phase().total_s().sum(axis=1) + p.head.total_s())
    lat = np.array([t.latency_s for t in recs])
    assert np.all(lat >= compute_floor * (1 - 1e-9))
    assert recs[-1].t_end_s >= sum(b.t_end_s - b.t_start_s for b in r.flash_log) * (1 - 1e-9)


def test_records_are_deterministic(small_trace, host) -> None:
    cfg = preset_config("neuroprefetcher").with_overrides(
        ["predictor=noisy", "delta.recall=0.8", "delta.precision=0.7", "workload.batch=2", "seed=3"])

    def frame(c):  # type: ignore[no-untyped-def]
        return build(small_trace, None, host, c, cache=SetAlgebraCache()).run().records()

    a, b = frame(cfg), frame(cfg)
    pd.testing.assert_frame_equal(a, b)
    c = frame(cfg.with_overrides(["seed=4"]))
    assert not a["bytes_read"].equals(c["bytes_read"])
