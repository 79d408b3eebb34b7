"""MoE timing: the DES and the analytic fast path agree; closed forms; bounds ordering; energy has a
flash term; capacity from a DRAM budget."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from devices.achievable import at_bound
from devices.curves import read_time_s
from devices.moe_spec import load_moe_model, moe_spec_from_hf_config
from devices.schema import load_profile
from sim.moe.run import MoERunConfig, capacity_for_budget, dram_bytes, simulate, three_numbers
from sim.moe.timing import SPLIT_BYTES, layer_costs
from tests.sim.moe.routing_fixture import zipf_routing

TINY = {"model_type": "qwen3_moe", "hidden_size": 256, "moe_intermediate_size": 512, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 1000,
        "num_experts": 16, "num_experts_per_tok": 2}


@pytest.fixture(scope="module")
def setup():
    spec = moe_spec_from_hf_config(TINY, "tiny-moe")
    prof = at_bound(load_profile("rtx4090-nvme"), "achievable")
    e, w = zipf_routing(16, 4, 16, 2, seed=2)
    return spec, prof, e, w


@pytest.mark.parametrize("policy,prefetch", [("lru", None), ("belady", 1.0), ("pinned", None),
                                             ("page-cache", None), ("lfu", 0.6), ("cache-aware", None)])
def test_des_and_fast_path_agree(setup, policy, prefetch) -> None:
    spec, prof, e, w = setup
    cfg = MoERunConfig(policy=policy, capacity=4, prefetch_accuracy=prefetch, prefetch_memory=0.5)
    fast = simulate(spec, prof, e, cfg, weights=w)
    des = simulate(spec, prof, e, replace(cfg, engine="des"), weights=w)
    np.testing.assert_allclose(des.timeline.end_s, fast.timeline.end_s, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(des.timeline.io_s, fast.timeline.io_s, rtol=1e-9, atol=1e-12)
    assert des.summary["tokens_per_s"] == pytest.approx(fast.summary["tokens_per_s"], rel=1e-9)


def test_no_cache_closed_form(setup) -> None:
    """Capacity 0, no prefetch: every token reads K experts per MoE layer in one batch after the
    router, then copies them over the host link (the profile's second hop); token time = sum of compute
    + M x (read-back + batch read + K x expert bytes / copy rate) exactly."""
    spec, prof, e, w = setup
    run = simulate(spec, prof, e, MoERunConfig(policy="lru", capacity=0), weights=w)
    c = run.costs
    per = -(-c.expert_bytes // SPLIT_BYTES)
    batch = read_time_s(prof.flash.curve, c.expert_bytes / per, spec.top_k * per, prof.moe.expert_reads_in_flight)
    batch += spec.top_k * c.expert_bytes / (prof.moe.host_copy_bytes_per_s or float("inf"))
    expect = (c.pre_s.sum() + c.router_s.sum() + c.shared_s.sum() + c.head_s
              + spec.n_moe_layers * (batch + spec.top_k * c.expert_s))
    np.testing.assert_allclose(run.timeline.latency_s, expect, rtol=1e-12)
    assert run.summary["flash_bytes_per_token"] == spec.n_moe_layers * spec.top_k * spec.expert_bytes("int4")
    assert run.summary["energy_j_per_token"]["flash"] > 0


def test_everything_cached_has_no_reads_and_no_readback(setup) -> None:
    spec, prof, e, w = setup
    run = simulate(spec, prof, e, MoERunConfig(policy="lru", capacity=16), weights=w)
    assert run.residency.miss[-1].sum() == 0                 # warm: the last token finds every expert
    c = run.costs
    assert run.timeline.latency_s[-1] == pytest.approx(c.pre_s.sum() + c.router_s.sum() + c.shared_s.sum()
                                                       + c.head_s + spec.n_moe_layers * spec.top_k * c.expert_s)
    assert run.timeline.io_s[-1] == 0
    assert run.summary["router_sync_ms_per_token"] == pytest.approx(0.0, abs=1e-12)


def test_three_numbers_are_ordered(setup) -> None:
    spec, prof, e, w = setup
    out = three_numbers(spec, load_profile("rtx4090-nvme"), e, MoERunConfig(policy="lru", capacity=4), weights=w)
    exp, peak, ideal = (out[k]["tokens_per_s"] for k in ("expected", "peak_bound", "ideal_policy_bound"))
    assert peak >= exp and ideal >= exp
    assert out["ideal_policy_bound"]["hit_rate"] >= out["expected"]["hit_rate"]


def test_capacity_for_budget_fits(setup) -> None:
    spec, prof, e, w = setup
    cfg = MoERunConfig(dtype="int4")
    need0 = dram_bytes(spec, cfg, 0)
    assert capacity_for_budget(spec, cfg, need0 - 1) == -1
    budget = need0 + 10 * spec.expert_bytes("int4") * spec.n_moe_layers
    cap = capacity_for_budget(spec, cfg, budget)
    assert cap == 10 and dram_bytes(spec, cfg, cap * spec.n_moe_layers) <= budget


def test_warm_pass_times_the_steady_state(setup) -> None:
    """A cache that holds every expert: cold, the first reads of each expert are timed; after one
    untimed pass over the trace no token reads anything."""
    spec, prof, e, w = setup
    cold = simulate(spec, prof, e, MoERunConfig(policy="lru", capacity=16), weights=w).summary
    warm = simulate(spec, prof, e, MoERunConfig(policy="lru", capacity=16, warm_passes=1), weights=w).summary
    assert cold["flash_bytes_per_token"] > 0 and warm["flash_bytes_per_token"] == 0
    assert warm["hit_rate"] == 1.0 and warm["tokens"] == len(e)
    part = simulate(spec, prof, e, MoERunConfig(policy="lru", capacity=16, warmup_tokens=4), weights=w).summary
    assert part["tokens"] == len(e) - 4


def test_second_hop_is_the_copy_over_the_host_link() -> None:
    """Hand-computed on rtx4090-nvme: a batch of n experts of b bytes takes n x b / 25 GB/s more than its SSD
    reads (achievable), n x b / 31.5 GB/s at the peak bound (PCIe 4.0 x16's datasheet rate); a profile
    without the field has no second hop."""
    spec = load_moe_model("qwen3-30b-a3b")
    raw = load_profile("rtx4090-nvme")
    b = spec.expert_bytes("int4")
    costs = {k: layer_costs(spec, at_bound(raw, k), "int4", 0, max_batch=8) for k in ("achievable", "peak")}
    no_hop = raw.model_copy(update={"moe": raw.moe.model_copy(update={"host_copy_bytes_per_s": None})})
    plain = {k: layer_costs(spec, at_bound(no_hop, k), "int4", 0, max_batch=8) for k in ("achievable", "peak")}
    for k, rate in (("achievable", 25e9), ("peak", 31.5e9)):
        extra = costs[k].read_batch_s - plain[k].read_batch_s
        np.testing.assert_allclose(extra, np.arange(9) * b / rate, rtol=1e-12)
