"""Episodes (adapt/episode.py): hand-computed footprints, decision points, violations, time;
the heuristic never exceeds a feasible budget (hypothesis); determinism; the simulator's timer."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapt.controllers.heuristic import Heuristic
from adapt.drop_quality import GsiPerplexity, MeasuredPerplexity
from adapt.episode import EpisodeSetup, Workload, requality, run_episode
from adapt.importance import importance_vector
from adapt.timelines import parse_timeline
from sim.blocks import BlockMemory, block_names
from sim.components.memory import BudgetTimeline
from tests.adapt.conftest import FakeTimer, tiny_blocks, tiny_doc

NAMES = block_names(2)


class Fixed:
    """Returns the same mask at every decision; records the steps it was asked at."""

    def __init__(self, dropped=()):
        self.name = "fixed"
        self.mask = np.array([n in dropped for n in NAMES])
        self.asked: list[int] = []

    def reset(self) -> None:
        self.asked = []

    def decide(self, state):
        self.asked.append(state.step)
        return self.mask.copy()


def setup_for(wl: Workload, blocks: BlockMemory | None = None, decide_every: int = 3) -> EpisodeSetup:
    blocks = blocks or tiny_blocks()
    doc = tiny_doc()
    return EpisodeSetup(blocks, importance_vector(doc, blocks.names), GsiPerplexity(doc, blocks.names),
                        FakeTimer(wl.decode_tokens), wl, decide_every)  # type: ignore[arg-type]


def test_footprint_violations_and_time_hand_computed():
    wl = Workload(batch=2, prompt_tokens=3, decode_tokens=6)
    s = setup_for(wl)
    assert s.kv_tokens.tolist() == [8, 10, 12, 14, 16, 18]            # 2 x (3 + j + 1)
    assert s.full_need_bytes() == 50 + 800 + 20 * 18
    res = run_episode(s, Fixed(), BudgetTimeline((0.0,), (1100,)), "1100B")
    f = res.records
    assert f["footprint_bytes"].tolist() == [850 + 20 * k for k in (8, 10, 12, 14, 16, 18)]
    assert f["violation"].tolist() == [False, False, False, True, True, True]
    assert res.summary["violations"] == 3 and res.summary["max_over_bytes"] == 1210 - 1100
    # FakeTimer: 1 ms + 0.25 ms x 4 kept blocks = 2 ms per step
    assert f["t_s"].tolist() == pytest.approx([0.002 * j for j in range(6)])
    assert res.summary["tokens_per_s"] == pytest.approx(2 * 6 / 0.012)
    assert res.summary["ppl"] == pytest.approx(10.0) and res.summary["changes"] == 0


def test_decision_points_budget_changes_period_and_overflow():
    wl = Workload(batch=1, prompt_tokens=0, decode_tokens=10)
    s = setup_for(wl, decide_every=4)
    c = Fixed(["ffn:0", "ffn:1"])          # footprint 50 + 200 + 20 x kv, kv = j + 1
    # FakeTimer: 1 ms + 0.25 ms x 2 kept = 1.5 ms per step; the budget drops at 4.6 ms (seen at step 4,
    # t = 6 ms) from 10 kB to 335 B: footprint 250 + 20 x (j + 1) > 335 from j = 4 on (350)
    res = run_episode(s, c, BudgetTimeline((0.0, 0.0046), (10_000, 335)))
    f = res.records
    assert f["available_bytes"].tolist() == [10_000] * 4 + [335] * 6
    # j = 0, 4, 8 (every 4); j = 4 also a budget change; j = 4..9 overflow -> asked at every step from 4
    assert c.asked == [0, 4, 5, 6, 7, 8, 9]
    assert f["decision"].sum() == 7 and f["action"].tolist()[0] == "drop ffn:0,ffn:1"
    assert res.summary["violations"] == 6


def test_heuristic_fits_and_acts_with_hand_computed_footprints():
    wl = Workload(batch=2, prompt_tokens=3, decode_tokens=6)
    s = setup_for(wl)
    res = run_episode(s, Heuristic(), BudgetTimeline((0.0,), (1100,)))
    f = res.records
    assert res.summary["violations"] == 0
    # kv 14 at j = 3: 1130 > 1100 -> drop mha:1 (frees 100 + 140): 890
    assert f["action"].tolist()[3] == "drop mha:1" and f["footprint_bytes"].tolist()[3] == 890
    assert f["dropped"].tolist()[3:] == ["mha:1"] * 3
    # quality: mha:1 is GSI step 1 (ppl 11) for 3 of 6 steps: exp(mean log) = sqrt(10 x 11)
    assert res.summary["ppl"] == pytest.approx(math.sqrt(110.0))


def test_deterministic_under_a_seed():
    wl = Workload(batch=3, prompt_tokens=5, decode_tokens=40)
    s = setup_for(wl, decide_every=2)
    ctx = s.context()
    a = run_episode(s, Heuristic(), parse_timeline("bursts:seed=7,rate=8,depth=0.3").build(ctx))
    b = run_episode(s, Heuristic(), parse_timeline("bursts:seed=7,rate=8,depth=0.3").build(ctx))
    pd.testing.assert_frame_equal(a.records, b.records)
    c = run_episode(s, Heuristic(), parse_timeline("bursts:seed=8,rate=8,depth=0.3").build(ctx))
    assert not a.records["available_bytes"].equals(c.records["available_bytes"])


@st.composite
def episodes(draw):
    L = draw(st.integers(1, 4))
    w = np.array(draw(st.lists(st.integers(1, 500), min_size=2 * L, max_size=2 * L)), np.int64)
    kv = np.zeros(2 * L, np.int64)
    kv[0::2] = draw(st.lists(st.integers(0, 20), min_size=L, max_size=L))
    always = draw(st.integers(0, 300))
    blocks = BlockMemory(block_names(L), w, kv, always)
    wl = Workload(draw(st.integers(1, 4)), draw(st.integers(0, 6)), draw(st.integers(1, 30)))
    full = blocks.full_need_bytes(int(wl.kv_tokens()[-1]))
    n_points = draw(st.integers(1, 8))
    ts = sorted(draw(st.lists(st.floats(0, 0.05), min_size=n_points, max_size=n_points)))
    ts[0] = 0.0
    avail = draw(st.lists(st.integers(always, max(always, full + 50)), min_size=n_points, max_size=n_points))
    importance = np.array(draw(st.permutations(range(1, 2 * L + 1))), float) / (2 * L)
    return blocks, wl, BudgetTimeline(tuple(ts), tuple(avail)), importance, draw(st.integers(1, 5))


@settings(max_examples=150, deadline=None)
@given(episodes(), st.sampled_from(["importance", "per-byte"]), st.sampled_from([0.0, 0.05, 0.3]))
def test_heuristic_never_exceeds_a_feasible_budget(ep, rule, headroom):
    """Whenever the never-dropped part fits (always_bytes <= available), the heuristic's footprint
    stays within the budget at every step of any timeline."""
    blocks, wl, tl, importance, every = ep
    quality = MeasuredPerplexity(lambda sets: [10.0] * len(sets), blocks.names)
    s = EpisodeSetup(blocks, importance, quality, FakeTimer(wl.decode_tokens), wl, every)  # type: ignore[arg-type]
    res = run_episode(s, Heuristic(rule, headroom), tl)
    f = res.records
    assert (f["footprint_bytes"] <= f["available_bytes"]).all()
    assert res.summary["violations"] == 0


@settings(max_examples=60, deadline=None)
@given(episodes(), st.integers(1, 400))
def test_heuristic_violates_only_where_nothing_fits(ep, short):
    """Budgets that dip below the never-dropped part: violations exactly at those steps, with
    everything dropped; elsewhere the budget holds."""
    blocks, wl, tl, importance, every = ep
    tl = BudgetTimeline(tl.t_s, tuple(max(0, a - short) if i % 2 else a for i, a in enumerate(tl.available_bytes)))
    quality = MeasuredPerplexity(lambda sets: [10.0] * len(sets), blocks.names)
    s = EpisodeSetup(blocks, importance, quality, FakeTimer(wl.decode_tokens), wl, every)  # type: ignore[arg-type]
    f = run_episode(s, Heuristic(), tl).records
    impossible = f["available_bytes"] < blocks.always_bytes
    assert (f["violation"] == impossible).all()
    assert (f.loc[impossible, "n_dropped"] == 2 * blocks.n_layers).all()


def test_requality_keeps_the_trajectory():
    wl = Workload(batch=2, prompt_tokens=3, decode_tokens=6)
    s = setup_for(wl)
    res = run_episode(s, Heuristic(), BudgetTimeline((0.0,), (1100,)))
    calls = []

    def measure(sets):
        calls.append(sets)
        return [20.0 + 5 * len(x) for x in sets]

    (again,) = requality([res], MeasuredPerplexity(measure, NAMES), 2)
    assert calls == [[[], ["mha:1"]]]                              # each distinct set once, one call
    assert again.records["dropped"].equals(res.records["dropped"])
    assert again.summary["ppl"] == pytest.approx(math.sqrt(20.0 * 25.0))
    assert again.summary["violations"] == res.summary["violations"]


def test_step_timer_matches_block_memory_and_pruning_is_faster():
    """The simulator's DRAM of the dense preset equals BlockMemory's footprint, with and without
    dropped blocks, and dropping blocks shortens the simulated step."""
    from adapt.episode import StepTimer
    from devices import load_profile
    from sim.policies.presets import preset_config
    from traces.data import shipped_trace_path
    from traces.format import open_trace

    trace = open_trace(shipped_trace_path())
    blocks = BlockMemory.from_spec(trace.spec)
    wl = Workload(batch=2, prompt_tokens=8, decode_tokens=4)
    timer = StepTimer(trace, None, load_profile("jetson-orin-nano-8gb"), preset_config("dense"), wl)
    none = np.zeros(60, bool)
    some = none.copy()
    some[[5, 10, 11, 58]] = True
    lat0, res0 = timer.steps(none)
    lat1, res1 = timer.steps(some)
    assert res0.tolist() == [blocks.footprint_bytes(none, int(k)) for k in wl.kv_tokens()]
    assert res1.tolist() == [blocks.footprint_bytes(some, int(k)) for k in wl.kv_tokens()]
    assert (lat1 < lat0).all()
    timer.steps(some)
    assert timer.runs == 2                                           # cached per dropped set
