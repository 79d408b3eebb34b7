"""Engine: budgets that do not fit, budget timelines, caching across runs, results and exports."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from devices.errors import FlashsimError
from sim.components.memory import BudgetTimeline
from sim.engine import SetAlgebraCache, build, simulate
from sim.policies.presets import preset_config
from sim.results import SUMMARY_KEYS


def test_budget_too_small_names_the_shortfall(small_trace, host) -> None:
    sim = build(small_trace, None, host, preset_config("dense"), cache=SetAlgebraCache())
    need = sim.memory.fixed_bytes + int(sim.memory.kv_bytes.max())
    with pytest.raises(FlashsimError, match=r"needs .*, 1 B \(1 bytes\) more"):
        build(small_trace, None, host, preset_config("dense").with_overrides([f"memory.dram_budget_bytes={need - 1}"]),
              cache=SetAlgebraCache())
    build(small_trace, None, host, preset_config("dense").with_overrides([f"memory.dram_budget_bytes={need}"]),
          cache=SetAlgebraCache()).run()


def test_window_cache_too_small_for_one_step(small_trace, host) -> None:
    sim = build(small_trace, None, host, preset_config("llm-in-a-flash"), cache=SetAlgebraCache())
    tight = sim.memory.fixed_bytes + int(sim.memory.kv_bytes.max()) + 2 * small_trace.n_layers * sim.spec.ffn_neuron_bytes
    cfg = preset_config("llm-in-a-flash").with_overrides([f"memory.dram_budget_bytes={tight}"])
    with pytest.raises(FlashsimError, match="DRAM budget too small at step 0: layer 0 computes"):
        simulate(small_trace, None, host, cfg, cache=SetAlgebraCache())


def test_capped_window_stays_within_budget_and_reads_more(small_trace, host) -> None:
    oracle = preset_config("llm-in-a-flash").with_overrides(["predictor=oracle", "oracle.rank=128"])
    base = simulate(small_trace, None, host, oracle.with_overrides(["window.k=inf"]), cache=SetAlgebraCache())
    sim = build(small_trace, None, host, oracle, cache=SetAlgebraCache())
    budget = sim.memory.fixed_bytes + int(sim.memory.kv_bytes.max()) + 60 * 2 * sim.spec.ffn_neuron_bytes
    capped = simulate(small_trace, None, host, oracle.with_overrides(
        ["window.k=inf", f"memory.dram_budget_bytes={budget}"]), cache=SetAlgebraCache())
    assert all(t.resident_bytes <= budget for t in capped.tokens)
    assert sum(t.bytes_read for t in capped.tokens) > sum(t.bytes_read for t in base.tokens)


def test_other_refusals(small_trace, host) -> None:
    with pytest.raises(FlashsimError, match="exceeds the DRAM of this-host"):
        build(small_trace, None, host, preset_config("naive").with_overrides(["memory.dram_budget_bytes=1TiB"]))
    with pytest.raises(FlashsimError, match="cannot use predictor 'oracle'"):
        build(small_trace, None, host, preset_config("mmap").with_overrides(["predictor=oracle"]))


def _timeline_run(trace, host, preset, points, *sets):  # type: ignore[no-untyped-def]
    cfg = replace(preset_config(preset).with_overrides(list(sets)), budget_timeline=BudgetTimeline(*zip(*points)))
    return build(trace, None, host, cfg, cache=SetAlgebraCache()).run(timeline=True)


@pytest.mark.parametrize("preset, sets", [("llm-in-a-flash", ("window.k=inf", "predictor=oracle", "oracle.rank=128")), ("mmap", ()),
                                          ("neuroprefetcher", ("predictor=oracle", "oracle.rank=128", "delta.recall=1.0",
                                                               "delta.precision=1.0"))])
def test_budget_timeline_shrinks_caches_when_memory_is_taken(small_trace, host, preset, sets) -> None:
    free = simulate(small_trace, None, host, preset_config(preset).with_overrides(list(sets)), cache=SetAlgebraCache())
    sim = build(small_trace, None, host, preset_config(preset).with_overrides(list(sets)), cache=SetAlgebraCache())
    floor = sim.memory.fixed_bytes + int(sim.memory.kv_bytes.max())
    t_mid = free.tokens[len(free.tokens) // 3].t_start_s
    room = 40 * 2 * sim.spec.ffn_neuron_bytes if preset != "mmap" else small_trace.spec.total_weight_bytes // 3
    r = _timeline_run(small_trace, host, preset, [(0.0, host.available_bytes), (t_mid, floor + room)], *sets)
    assert r.engine == "des"
    after = [t for t in r.tokens if t.t_start_s >= t_mid]
    assert after and all(t.resident_bytes <= t.budget_bytes == floor + room for t in after)
    assert sum(t.bytes_read for t in after) > sum(t.bytes_read for t in free.tokens if t.t_start_s >= t_mid)
    changes = [m for m in r.memory if m.t_s in (0.0, t_mid) and m.budget_bytes in (host.available_bytes, floor + room)]
    assert {m.budget_bytes for m in changes} == {host.available_bytes, floor + room}
    assert all(m.resident_bytes <= m.budget_bytes for m in r.memory)


def test_budget_timeline_below_the_resident_weights_fails_clearly(small_trace, host) -> None:
    with pytest.raises(FlashsimError, match=r"budget timeline: at t=0\.000100 s \(step \d+\) only"):
        _timeline_run(small_trace, host, "dense", [(0.0, host.available_bytes), (1e-4, 1000)])


def test_summary_records_and_exports(small_trace, host, tmp_path) -> None:
    r = build(small_trace, None, host, preset_config("llm-in-a-flash").with_overrides(["prefetch=delta",
                                                                                      "predictor=oracle", "oracle.rank=128"]),
              cache=SetAlgebraCache()).run(timeline=True)
    s = r.summary()
    assert set(SUMMARY_KEYS) <= set(s) and s["prefill"]["tokens"] == 4 and s["engine"] == "des"
    assert s["config"]["policies"]["prefetch"]["name"] == "delta" and s["config"]["preset"] == "llm-in-a-flash"
    dec = [t for t in r.tokens if t.phase == "decode"]
    assert s["ms_per_token"] == pytest.approx(1e3 * np.mean([t.latency_s for t in dec]))
    assert s["tokens_per_s"] == pytest.approx(len(dec) / sum(t.latency_s for t in dec))
    assert s["flash_bytes_per_token"] == pytest.approx(np.mean([t.bytes_read for t in dec]))
    assert s["dram_peak_bytes"] == max(t.resident_bytes for t in r.tokens)
    assert 0.99 < s["activation_mass_kept"] <= 1.0 and s["recall"] == 1.0
    path = r.write_records(tmp_path / "out" / "r.parquet")
    df = pd.read_parquet(path)
    pd.testing.assert_frame_equal(df, r.records(), check_dtype=False)
    assert list(tmp_path.joinpath("out").iterdir()) == [path]          # no temporary left behind
    tl = json.loads(r.write_timeline(tmp_path / "t.json").read_text())
    names = {e["args"]["name"] for e in tl["traceEvents"] if e.get("name") == "thread_name"}
    assert names == {"step", "compute", "memory", "stall", "flash"}
    lanes = {e["tid"] for e in tl["traceEvents"] if e["ph"] == "X"}
    assert lanes >= {1, 2, 5}
    assert any(e["ph"] == "C" for e in tl["traceEvents"])
    assert json.loads(r.write_json(tmp_path / "s.json").read_text())["ms_per_token"] == pytest.approx(s["ms_per_token"])


def test_cache_reuses_needed_sets_across_devices(small_trace, host, m1) -> None:
    cache = SetAlgebraCache()
    a = build(small_trace, None, host, preset_config("llm-in-a-flash"), cache=cache)
    a.run()
    b = build(small_trace, None, m1, preset_config("llm-in-a-flash").with_overrides(["memory.dram_budget_bytes=8GiB"]),
              cache=cache)
    assert b.view is a.view and b.view._needed            # computed once
    r1, r2 = a.run(), b.run()
    assert [t.bytes_read for t in r1.tokens] == [t.bytes_read for t in r2.tokens]


def test_naive_streams_one_layer_at_a_time_within_the_total_budget(small_trace, host) -> None:
    """Regression: streaming (window 0) is bounded by fixed + KV + ONE layer being streamed, not by a
    per-layer share of the cache (which refused budgets a real streamer runs in)."""
    sim = build(small_trace, None, host, preset_config("naive"), cache=SetAlgebraCache())
    layer_bytes = small_trace.spec.ffn_bytes_per_layer
    floor = sim.memory.fixed_bytes + int(sim.memory.kv_bytes.max())
    ok = simulate(small_trace, None, host, preset_config("naive").with_overrides(
        [f"memory.dram_budget_bytes={floor + layer_bytes}"]), cache=SetAlgebraCache())
    assert max(t.resident_bytes for t in ok.tokens) <= floor + layer_bytes
    with pytest.raises(FlashsimError, match="the layer being streamed need"):
        simulate(small_trace, None, host, preset_config("naive").with_overrides(
            [f"memory.dram_budget_bytes={floor + layer_bytes - 1}"]), cache=SetAlgebraCache())
