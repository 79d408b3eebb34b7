"""Controllers (adapt/controllers/): hand-computed decisions on the 2-layer block model."""

from __future__ import annotations

import numpy as np
import pytest

from adapt.controllers import make_controller
from adapt.controllers.base import AdaptState, Controller
from adapt.controllers.heuristic import Heuristic
from adapt.controllers.static_ratio import StaticRatio
from adapt.importance import importance_vector
from devices.errors import FlashsimError
from sim.blocks import block_names
from tests.adapt.conftest import tiny_blocks, tiny_doc

# mha:0 0.75, ffn:0 0.5, mha:1 0.25, ffn:1 1.0 (least important first: mha:1, ffn:0, mha:0, ffn:1)
IMP = importance_vector(tiny_doc(), block_names(2))


def state(available: int, dropped=(), kv_tokens: int = 10) -> AdaptState:
    d = np.array([n in dropped for n in block_names(2)])
    return AdaptState(step=0, batch=1, seq_len=kv_tokens, kv_tokens=kv_tokens, available_bytes=available,
                      importance=IMP, dropped=d, blocks=tiny_blocks())


def names(mask: np.ndarray) -> list[str]:
    return [block_names(2)[i] for i in np.flatnonzero(mask)]


def test_all_satisfy_the_protocol():
    for c in (StaticRatio(), Heuristic()):
        assert isinstance(c, Controller)


def test_static_ratio_drops_the_least_important_once():
    c = StaticRatio(0.5)
    c.reset()
    assert names(c.decide(state(10_000))) == ["ffn:0", "mha:1"]
    assert names(c.decide(state(1))) == ["ffn:0", "mha:1"]          # never adapts
    with pytest.raises(FlashsimError, match="--static-ratio 1.5"):
        StaticRatio(1.5)


def test_heuristic_hand_computed():
    # kv_tokens 10: footprint with nothing dropped 50 + 800 + 2 x 100 = 1050; an mha frees 100 + 100
    h = Heuristic()
    assert names(h.decide(state(2000))) == []
    assert names(h.decide(state(900))) == ["mha:1"]                  # 850 fits
    # 800: drop mha:1 (850), still over: drop ffn:0 (550); then mha:1 fits again under 0.95 x 800 = 760
    assert names(h.decide(state(800))) == ["ffn:0"]


def test_heuristic_hysteresis():
    h = Heuristic(headroom=0.05)
    assert names(h.decide(state(1000, ["ffn:0"]))) == ["ffn:0"]     # 1050 > 950: stays dropped
    assert names(h.decide(state(1100, ["ffn:0"]))) == ["ffn:0"]     # 1050 > 1045
    assert names(h.decide(state(1106, ["ffn:0"]))) == []            # 1050 <= 1050.7
    assert names(Heuristic(headroom=0.0).decide(state(1050, ["ffn:0"]))) == []


def test_heuristic_per_byte_rule():
    # importance per byte freed (kv 10): mha:0 .75/200, ffn:0 .5/300, mha:1 .25/200, ffn:1 1/300:
    # mha:1 first (850 > 800), then ffn:0 (550), then mha:1 is restored (750 <= 760)
    h = Heuristic("per-byte")
    assert names(h.decide(state(800))) == ["ffn:0"]
    # kv 100: full footprint 50 + 800 + 2000 = 2850; an mha frees 1100: mha:1 (.25/1100) first -> 1750
    assert names(h.decide(state(1800, kv_tokens=100))) == ["mha:1"]
    assert h.name == "heuristic-bytes"


def test_heuristic_infeasible_drops_everything():
    assert names(Heuristic().decide(state(10))) == list(block_names(2))
    assert names(Heuristic().decide(state(10, block_names(2)))) == list(block_names(2))


def test_make_controller_unknown_name():
    with pytest.raises(FlashsimError, match="unknown controller 'heuristc'; did you mean 'heuristic'"):
        make_controller("heuristc", spec=None, kv_tokens_max=0)
    with pytest.raises(FlashsimError, match="rule"):
        Heuristic("nope")  # type: ignore[arg-type]


def test_static_window_sizes_the_resident_set_to_the_start_budget():
    """The simulator's DRAM record of the hybrid residency chosen for a budget fits it, one more
    neuron per layer would not."""
    from adapt.controllers.static_window import StaticWindow
    from adapt.episode import StepTimer, Workload
    from devices import load_profile
    from sim.policies.presets import preset_config
    from traces.data import shipped_trace_path
    from traces.format import open_trace

    trace = open_trace(shipped_trace_path())
    spec = trace.spec
    wl = Workload(batch=2, prompt_tokens=8, decode_tokens=4)
    timer = StepTimer(trace, None, load_profile("jetson-orin-nano-8gb"), preset_config("dense"), wl)
    kv_max = int(wl.kv_tokens()[-1])
    c = StaticWindow(spec, kv_max)
    budget = 200 * 2**20
    st = AdaptState(step=0, batch=2, seq_len=9, kv_tokens=18, available_bytes=budget, importance=np.ones(60),
                    dropped=np.zeros(60, bool), blocks=None)  # type: ignore[arg-type]
    settings = c.sim_settings(st)
    n = c.resident_neurons
    assert 0 < n < spec.d_ff
    lat, resident = timer.steps(np.zeros(60, bool), settings)
    assert resident.max() <= budget
    nb = spec.ffn_neuron_bytes
    assert resident.max() + (spec.n_layers - 1) * nb > budget    # one more neuron per layer would not fit
    assert resident[-1] == spec.non_ffn_bytes + n * spec.n_layers * nb + (spec.d_ff - n) * nb + \
        kv_max * spec.kv_bytes_per_token
    assert not c.decide(st).any()
