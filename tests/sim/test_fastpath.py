"""The analytic fast path agrees with the discrete-event run within 1% on per-token latency for
every registered policy without timing feedback, and declines, naming the reason, for the others."""

from __future__ import annotations

import numpy as np
import pytest

from devices.errors import FlashsimError
from sim.engine import SetAlgebraCache, build
from sim.policies.presets import preset_config
from sim.policies.registry import REGISTRIES, all_policies
from tests.sim.test_policies import config_for


@pytest.mark.parametrize("slot, name", all_policies())
@pytest.mark.parametrize("device", ["this-host", "apple-m1-max"])
def test_fast_path_agrees_or_declines(slot, name, device, small_trace, recorded_path) -> None:  # type: ignore[no-untyped-def]
    from devices import load_profile

    prof = load_profile(device)
    cfg = config_for(slot, name, recorded_path).with_overrides(["workload.batch=2"])
    if REGISTRIES[slot].get(name).timing_feedback:
        sim = build(small_trace, None, prof, cfg, cache=SetAlgebraCache())
        assert sim.fast_path_reason() and name in sim.fast_path_reason()
        with pytest.raises(FlashsimError, match=f"fast path does not apply: .*{name}"):
            sim.run(fast=True)
        assert sim.run().engine == "des"                       # auto falls back
        return
    des = build(small_trace, None, prof, cfg, cache=SetAlgebraCache()).run(fast=False)
    fast = build(small_trace, None, prof, cfg, cache=SetAlgebraCache()).run(fast=True)
    assert (des.engine, fast.engine) == ("des", "fast")
    a = np.array([t.latency_s for t in des.tokens])
    b = np.array([t.latency_s for t in fast.tokens])
    assert np.all(np.abs(a - b) <= 0.01 * a)
    assert [t.bytes_read for t in des.tokens] == [t.bytes_read for t in fast.tokens]
    assert des.summary()["ms_per_token"] == pytest.approx(fast.summary()["ms_per_token"], rel=0.01)


def test_timeline_declines_fast_path(small_trace, host, tmp_path) -> None:
    from dataclasses import replace

    from sim.components.memory import BudgetTimeline

    cfg = replace(preset_config("llm-in-a-flash"), budget_timeline=BudgetTimeline((0.0,), (host.available_bytes,)))
    sim = build(small_trace, None, host, cfg, cache=SetAlgebraCache())
    assert "budget timeline" in sim.fast_path_reason()
