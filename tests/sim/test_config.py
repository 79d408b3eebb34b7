"""Run configuration: strict building, --set overrides with types, presets, the registry."""

from __future__ import annotations

import re

import pytest

from devices.errors import FlashsimError
from sim.config import RunConfig, load_config
from sim.params import build_params
from sim.policies.base import Residency
from sim.policies.presets import PRESETS, preset_config, preset_names
from sim.policies.registry import (
    PREDICTORS,
    REGISTRIES,
    RESIDENCY,
    Registry,
    UnknownPolicyError,
    all_policies,
)
from sim.policies.window import WindowResidency


def test_presets_resolve_and_describe_every_slot() -> None:
    assert {"naive", "hybrid", "mmap", "dense", "llm-in-a-flash", "neuroprefetcher", "selectinfer"} <= set(PRESETS)
    for name in preset_names():
        d = preset_config(name).to_dict()
        assert d["preset"] == name and all(d[s]["name"] for s in REGISTRIES)
        assert RunConfig.from_dict(d).to_dict() == d            # round trip
    lif = preset_config("llm-in-a-flash")
    assert (lif.residency.name, lif.residency.params.k) == ("window", 5)
    assert lif.layout.params.bundled is True and lif.predictor.name == "noisy"   # the paper's, as it behaves
    si = preset_config("selectinfer").residency.params
    assert (si.load_ratio, si.compute_ratio) == (0.7, 0.4)
    assert preset_config("neuroprefetcher").prefetch.name == "delta"


def test_overrides_switch_slots_then_set_params_in_any_order() -> None:
    cfg = preset_config("naive").with_overrides(["window.k=3", "residency=window", "workload.batch=4",
                                                 "seed=9", "bundling.max_chunk_bytes=256KiB", "memory.dram_budget_bytes=4GiB"])
    assert cfg.residency.name == "window" and cfg.residency.params.k == 3
    assert cfg.workload.batch == 4 and cfg.sim.seed == 9
    assert cfg.layout.params.max_chunk_bytes == 256 * 1024
    assert cfg.memory.dram_budget_bytes == 4 * 2**30
    assert cfg.with_overrides(["residency.k=inf"]).residency.params.k == "inf"
    assert cfg.with_overrides(["bundling.bundled=false"]).layout.params.bundled is False


@pytest.mark.parametrize("setting, message", [
    ("window.k=-1", "window.k must be an integer >= 0 or 'inf'"),
    ("window.k=abc", "window.k"),
    ("window.kk=1", "unknown parameter 'kk'; did you mean 'k'? valid parameters: k, insert_copy"),
    ("hybrid.fraction=0.5", "policy 'hybrid' is not in use (slot residency holds 'window'); add --set residency=hybrid"),
    ("foo.bar=1", "'foo' is not a slot"),
    ("residency=nope", "unknown residency policy 'nope'; valid: dense, hybrid, mmap, naive, selective, window"),
    ("workload.batch=0", "workload.batch must be >= 1"),
    ("bundling.bundled=maybe", "expected true or false"),
    ("novalue", "expected key=value"),
    ("selectivity=3", "unknown setting 'selectivity'"),
])
def test_bad_overrides_name_the_parameter(setting: str, message: str) -> None:
    with pytest.raises(FlashsimError, match=re.escape(message)):
        preset_config("llm-in-a-flash").with_overrides([setting])


def test_selective_ratios_validated() -> None:
    with pytest.raises(FlashsimError, match=r"load_ratio must be in \[0, 1\], got 1.5"):
        preset_config("selectinfer").with_overrides(["selective.load_ratio=1.5"])
    with pytest.raises(FlashsimError, match="compute_ratio"):
        preset_config("selectinfer").with_overrides(["selective.compute_ratio=0.9"])


def test_from_dict_rejects_unknown_keys(tmp_path) -> None:
    with pytest.raises(FlashsimError, match="unknown key 'windw'"):
        RunConfig.from_dict({"windw": 3})
    with pytest.raises(FlashsimError, match="unknown parameter 'bach'"):
        RunConfig.from_dict({"workload": {"bach": 2}})
    f = tmp_path / "run.yaml"
    f.write_text("residency: {name: window, k: 2}\nprefetch: delta\nworkload: {batch: 2}\n")
    cfg = load_config(f)
    assert cfg.residency.params.k == 2 and cfg.prefetch.name == "delta" and cfg.workload.batch == 2


def test_build_params_coerces_strings() -> None:
    p = build_params(WindowResidency.Params, {"k": "7", "insert_copy": "no"}, "window")
    assert p.k == 7 and p.insert_copy is False


def test_registry_rejects_duplicates_and_lists_names() -> None:
    with pytest.raises(ValueError, match="already registered"):
        RESIDENCY.register("window")(WindowResidency)
    with pytest.raises(KeyError):
        RESIDENCY.build("windoww")
    with pytest.raises(UnknownPolicyError, match="valid: dense, hybrid, mmap, naive, selective, window"):
        RESIDENCY.build("windoww")
    reg: Registry[Residency] = Registry("residency", Residency)
    with pytest.raises(TypeError, match="must subclass Residency"):
        reg.register("x")(int)  # type: ignore[arg-type]


def test_out_of_tree_policy_by_import_path() -> None:
    p = PREDICTORS.build("tests.sim.plugin_policy:EveryOtherPredictor", {"offset": 1})
    assert p.params.offset == 1 and p.slot == "predictor"
    cfg = preset_config("llm-in-a-flash").with_overrides(["predictor=tests.sim.plugin_policy:EveryOtherPredictor"])
    assert cfg.predictor.name.endswith("EveryOtherPredictor")
    with pytest.raises(UnknownPolicyError, match="cannot load"):
        PREDICTORS.build("tests.sim.nope:X")


def test_every_slot_has_a_baseline_and_names_are_sorted() -> None:
    names = all_policies()
    assert ("prefetch", "none") in names and ("predictor", "none") in names
    assert ("precision", "native") in names and ("residency", "naive") in names
    for reg in REGISTRIES.values():
        assert reg.names() == sorted(reg.names())


def test_malformed_policy_output_is_caught_in_one_place(small_trace, host) -> None:
    from sim.engine import SetAlgebraCache, build
    from sim.policies.stack import PolicyOutputError

    cfg = preset_config("llm-in-a-flash").with_overrides(["predictor=tests.sim.plugin_policy:EveryOtherPredictor"])
    sim = build(small_trace, None, host, cfg, cache=SetAlgebraCache())
    sim.stack.predictor.predict = lambda layer, steps, needed: needed[:, :1]  # wrong shape
    with pytest.raises(PolicyOutputError, match="EveryOtherPredictor.predict must return uint64 words"):
        sim.run()


def test_switching_a_slot_to_the_policy_it_holds_keeps_its_parameters() -> None:
    from sim.policies.presets import preset_config

    cfg = preset_config("llm-in-a-flash").with_overrides(["predictor=oracle", "oracle.rank=64"])
    rank = cfg.predictor.params.rank
    assert rank == 64 and cfg.predictor.name == "oracle"
    assert cfg.with_overrides(["predictor=oracle"]).predictor.params.rank == rank
    assert cfg.with_overrides(["residency=window"]).residency.params == cfg.residency.params
    assert cfg.with_overrides(["predictor=noisy", "predictor=oracle"]).predictor.params.rank == rank
