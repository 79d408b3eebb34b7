"""Block pruning in the simulator (`prune.blocks`): hand-computed savings, properties, engines agree.

The tiny spec (tests/sim/helpers.tiny_spec): 2 layers, d_model 64, d_ff 256 ReLU (2 matrices), 4 heads
of 16 (MHA: 4 KV heads), vocab 1000 untied, fp16. Per layer: attention 4 x 64 x 64 x 2 B = 32,768 B,
two RMSNorms of 128 B, FFN 256 neurons x 256 B = 65,536 B, KV 2 x 64 x 2 B = 256 B per token.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devices import load_profile
from devices.errors import FlashsimError
from flashsim.main import main
from sim.blocks import format_blocks
from sim.components.memory import load_budget_timeline
from sim.config import PruneParams
from sim.engine import SetAlgebraCache, build, simulate
from sim.policies.presets import preset_config
from tests.sim.helpers import dense_trace, tiny_spec
from traces.format import open_trace

ATTN_B, NORM_B, FFN_LAYER_B, KV_LAYER_TOKEN_B = 32_768, 128, 65_536, 256


@pytest.fixture(scope="module")
def trace4(traces_dir):  # type: ignore[no-untyped-def]
    """4 layers of the tiny shape, 4 prompt + 12 generated tokens."""
    p = traces_dir / "prune4"
    if not p.exists():
        dense_trace(p, tiny_spec(n_layers=4, name="tiny4"), n_prompt=4, n_gen=12, seed=5)
    return open_trace(p)


# the budgets here are sized for a perfect predictor and prefetch (the presets' realistic ones compute more)
PERFECT = ("predictor=oracle", "oracle.rank=128", "delta.recall=1.0", "delta.precision=1.0")


def _sim(trace, device, preset, blocks="", *extra):  # type: ignore[no-untyped-def]
    cfg = preset_config(preset).with_overrides([f"prune.blocks={blocks}", *extra])
    return build(trace, None, device, cfg, cache=SetAlgebraCache())


def test_tiny_spec_numbers():
    s = tiny_spec()
    assert (s.attn_bytes_per_layer, s.ffn_bytes_per_layer, s.kv_bytes_per_token) == (ATTN_B, FFN_LAYER_B, 2 * 256)
    assert s.norm_bytes_per_layer == 2 * NORM_B and s.non_ffn_bytes == 322_176


def test_memory_terms_hand_computed(small_trace, host):
    full = _sim(small_trace, host, "naive")
    pr = _sim(small_trace, host, "naive", "mha:1,ffn:0")
    # attention weights + input norm of layer 1, the FFN norm of layer 0
    assert full.memory.parts["non_ffn_weights"] == 322_176
    assert pr.memory.parts["non_ffn_weights"] == 322_176 - ATTN_B - NORM_B - NORM_B == 289_152
    kv_tokens = full.steps.kv_tokens
    assert np.array_equal(full.memory.kv_bytes, kv_tokens * 512)
    assert np.array_equal(pr.memory.kv_bytes, kv_tokens * KV_LAYER_TOKEN_B)   # one kept MHA layer
    assert (full.memory.n_layers, pr.memory.n_layers) == (2, 1)
    # the dropped FFN layer's cache share goes to the kept one
    budget = 10**6
    free = budget - pr.memory.fixed_bytes - pr.memory.kv_bytes
    assert np.array_equal(pr.memory.cap_neurons(budget, 0, 2), free[:3] // 256)
    r = pr.run()
    assert [t.kv_bytes for t in r.tokens] == pr.memory.kv_bytes.tolist()
    assert r.summary()["prune"]["weight_bytes_saved"] == (ATTN_B + NORM_B) + (FFN_LAYER_B + NORM_B)
    assert r.summary()["prune"]["kv_bytes_per_token_saved"] == KV_LAYER_TOKEN_B


def test_stream_non_ffn_terms(small_trace, host):
    full = _sim(small_trace, host, "naive", "", "memory.stream_non_ffn=true")
    pr = _sim(small_trace, host, "naive", "mha:1,ffn:0", "memory.stream_non_ffn=true")
    assert full.memory.parts["norm_weights"] - pr.memory.parts["norm_weights"] == 2 * NORM_B
    a, b = full.run(), pr.run()
    for x, y in zip(a.tokens, b.tokens):
        assert x.stream_bytes - y.stream_bytes == ATTN_B                  # layer 1's attention is not read
        assert x.demand_bytes - y.demand_bytes == FFN_LAYER_B             # nor layer 0's FFN


def test_dropped_ffn_reads_and_computes_nothing(small_trace, host):
    full = _sim(small_trace, host, "naive")
    pr = _sim(small_trace, host, "naive", "ffn:0")
    a, b = full.run(), pr.run()
    pa, pb = full.planner.arr, pr.planner.arr
    for f in ("dem_bytes", "dem_s", "ffn_flop_s", "ffn_mem_s", "ffn_gather_s", "ffn_ovh_s", "computed"):
        assert not pb.sl[f][:, 0].any(), f
    for f in ("dem_bytes", "dem_s", "ffn_flop_s", "ffn_mem_s", "ffn_gather_s", "ffn_ovh_s", "computed"):
        assert np.array_equal(pb.sl[f][:, 1], pa.sl[f][:, 1]), f     # the kept layer is untouched
    assert np.array_equal(pb.needed, pa.needed)                      # the trace still counts as needed
    for x, y in zip(a.tokens, b.tokens):
        assert x.bytes_read == 2 * FFN_LAYER_B and y.bytes_read == FFN_LAYER_B   # naive reads whole FFNs
        assert x.computed == 2 * 256 and y.computed == 256
    # and the dropped FFN's compute is what the step saves
    ffn0_s = pa.ffn_phase().total_s()[:, 0]
    assert np.allclose([x.compute_s - y.compute_s for x, y in zip(a.tokens, b.tokens)], ffn0_s, rtol=1e-12)


def test_dropped_mha_saves_its_attention_time(small_trace, host):
    full = _sim(small_trace, host, "naive")
    pr = _sim(small_trace, host, "naive", "mha:1")
    attn_full = full.planner.arr.attn.total_s()
    assert np.allclose(2 * pr.planner.arr.attn.total_s(), attn_full, rtol=1e-12)   # one of two layers left
    a, b = full.run(), pr.run()
    assert np.allclose([x.compute_s - y.compute_s for x, y in zip(a.tokens, b.tokens)], attn_full, rtol=1e-9)
    assert [t.bytes_read for t in a.tokens] == [t.bytes_read for t in b.tokens]


def test_no_predictor_for_a_dropped_ffn(small_trace, host):
    sim = _sim(small_trace, host, "llm-in-a-flash", "ffn:0")
    pred = sim.stack.predictor
    assert pred.flops_per_token_per_layer() > 0 and pred.weight_bytes_per_layer() > 0
    st_ = sim.steps
    args = (st_.n_tokens, st_.attn_ctx_sum, st_.kv_tokens, st_.phase == 1)
    bare = sim.planner.compute.attention(*args)
    with_pred = sim.planner.compute.attention(*args, pred.flops_per_token_per_layer(), pred.weight_bytes_per_layer())
    # layer 0: attention alone; layer 1: attention + predictor
    assert np.allclose(2 * sim.planner.arr.attn.total_s(), bare.total_s() + with_pred.total_s(), rtol=1e-12)
    full = _sim(small_trace, host, "llm-in-a-flash")
    assert full.memory.parts["predictor_weights"] == 2 * sim.memory.parts["predictor_weights"]


def test_every_ffn_dropped_reads_nothing(trace4, host):
    r = _sim(trace4, host, "llm-in-a-flash", "ffn:0,ffn:1,ffn:2,ffn:3").run()
    assert all(t.bytes_read == 0 and t.computed == 0 and t.cache_bytes == 0 for t in r.tokens)
    s = r.summary()
    assert s["activation_mass_kept"] == 0.0 and s["recall"] == 0.0 and s["flash_bytes_per_token"] == 0.0
    assert s["prune"]["dropped_ffn"] == 4 and s["prune"]["dropped_mha"] == 0


def test_empty_prune_is_the_default(small_trace, host):
    a = simulate(small_trace, None, host, preset_config("llm-in-a-flash"), cache=SetAlgebraCache())
    b = _sim(small_trace, host, "llm-in-a-flash", "").run()
    assert a.tokens == b.tokens and a.summary()["prune"]["blocks"] == "" and a.tokens[0].dropped_blocks == ""


@pytest.mark.parametrize("preset", ["naive", "llm-in-a-flash", "selectinfer", "dense"])
@pytest.mark.parametrize("device", ["this-host", "apple-m1-max"])
def test_fast_path_and_des_agree(trace4, preset, device):
    prof = load_profile(device)
    des = _sim(trace4, prof, preset, "mha:0,ffn:1,mha:2,ffn:3").run(fast=False)
    fast = _sim(trace4, prof, preset, "mha:0,ffn:1,mha:2,ffn:3").run(fast=True)
    a = np.array([t.latency_s for t in des.tokens])
    b = np.array([t.latency_s for t in fast.tokens])
    assert np.all(np.abs(a - b) <= 1e-9 * a)
    assert [t.bytes_read for t in des.tokens] == [t.bytes_read for t in fast.tokens]
    assert [t.resident_bytes for t in des.tokens] == [t.resident_bytes for t in fast.tokens]


def test_budget_timeline_with_pruning(trace4, host, tmp_path):
    p = tmp_path / "tl.csv"
    p.write_text("t_s,available_bytes\n0,900KiB\n0.003,680KiB\n")
    cfg = preset_config("neuroprefetcher").with_overrides(["prune.blocks=ffn:1,mha:2", *PERFECT])
    cfg = replace(cfg, budget_timeline=load_budget_timeline(p))
    sim = build(trace4, None, host, cfg, cache=SetAlgebraCache())
    r = sim.run()
    assert r.engine == "des" and not sim.planner.arr.dem_bytes[:, 1].any() and not sim.planner.arr.computed[:, 1].any()
    assert {t.budget_bytes for t in r.tokens} == {900 << 10, 680 << 10}     # the drop happens mid-run
    assert all(t.resident_bytes <= t.budget_bytes for t in r.tokens)
    # without pruning the same timeline does not fit: the weights + KV exceed 680 KiB
    with pytest.raises(FlashsimError, match="budget timeline"):
        build(trace4, None, host, replace(cfg, prune=PruneParams()), cache=SetAlgebraCache()).run()


# ---- properties ------------------------------------------------------------------------------------
def _masks(L: int):  # type: ignore[no-untyped-def]
    bits = st.lists(st.booleans(), min_size=2 * L, max_size=2 * L)
    return st.tuples(bits, bits).map(lambda ab: (np.array(ab[0]), np.array(ab[0]) | np.array(ab[1])))


def _run(trace, prof, preset, mask, fast):  # type: ignore[no-untyped-def]
    sim = _sim(trace, prof, preset, format_blocks(mask))
    return sim, sim.run(fast=fast)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_masks(4), st.sampled_from(["naive", "llm-in-a-flash", "selectinfer"]), st.sampled_from(["this-host", "apple-m1-max"]))
def test_more_dropped_never_costs_more_fast_path(trace4, masks, preset, device):
    """Caches below their budget (the default budget is the device's DRAM): bytes read, DRAM in use at
    every step and latency never grow when more blocks are dropped."""
    small, big = masks
    prof = load_profile(device)
    sa, a = _run(trace4, prof, preset, small, True)
    sb, b = _run(trace4, prof, preset, big, True)
    assert a.engine == b.engine == "fast"
    for x, y in zip(a.tokens, b.tokens):
        assert y.bytes_read <= x.bytes_read and y.resident_bytes <= x.resident_bytes
        assert y.latency_s <= x.latency_s * (1 + 1e-12)
    assert sb.memory.fixed_bytes <= sa.memory.fixed_bytes


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_masks(4), st.sampled_from(["this-host", "apple-m1-max"]))
def test_more_dropped_never_costs_more_des(trace4, masks, device):
    """The DES with delta prefetch into a cache that fills free DRAM (neuroprefetcher), under a tight
    budget: total bytes read and total time never grow; what must stay resident (weights + KV) never
    grows; the caches may use the memory the dropped blocks free (dram_bytes stays within the budget)."""
    small, big = masks
    prof = load_profile(device)
    extra = ["memory.dram_budget_bytes=800KiB", *PERFECT]
    sa = _sim(trace4, prof, "neuroprefetcher", format_blocks(small), *extra)
    sb = _sim(trace4, prof, "neuroprefetcher", format_blocks(big), *extra)
    a, b = sa.run(), sb.run()
    assert a.engine == b.engine == "des"
    assert sum(t.bytes_read for t in b.tokens) <= sum(t.bytes_read for t in a.tokens)
    assert b.tokens[-1].t_end_s <= a.tokens[-1].t_end_s * (1 + 1e-12)
    assert np.all(sb.memory.fixed_bytes + sb.memory.kv_bytes <= sa.memory.fixed_bytes + sa.memory.kv_bytes)
    assert all(t.resident_bytes <= t.budget_bytes for t in b.tokens)


# ---- CLI ---------------------------------------------------------------------------------------------
def test_cli_replay_with_pruning(capsys, small_trace, tmp_path):
    rec = tmp_path / "r.parquet"
    rc = main(["replay", "--trace", str(small_trace.path), "--device", "this-host", "--preset", "naive",
               "--set", "prune.blocks=ffn:1, mha:0", "--json", "--records", str(rec)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    s = json.loads(out)
    assert s["prune"]["blocks"] == "mha:0,ffn:1" and s["config"]["prune"]["blocks"] == "ffn:1, mha:0"
    assert s["config"]["prune"]["blocks_resolved"] == "mha:0,ffn:1" and any("pruned" in n for n in s["notes"])
    df = pd.read_parquet(rec)
    assert set(df["dropped_blocks"]) == {"mha:0,ffn:1"}


@pytest.mark.parametrize("value, message", [
    ("ffn:2", "prune.blocks: bad block 'ffn:2': layer 2 is out of range; the model has 2 layers (0..1)"),
    ("attn:0", "prune.blocks: bad block 'attn:0'"),
    ("mha:0,mha:0", "prune.blocks: block 'mha:0' is listed twice"),
])
def test_cli_rejects_bad_blocks_in_one_line(capsys, small_trace, value, message):
    rc = main(["replay", "--trace", str(small_trace.path), "--device", "this-host", "--preset", "naive",
               "--set", f"prune.blocks={value}"])
    _out, err = capsys.readouterr()
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1


def test_mmap_residency_rejects_pruning(small_trace, host):
    with pytest.raises(FlashsimError, match="prune.blocks: residency 'mmap'"):
        _sim(small_trace, host, "mmap", "ffn:0")


def test_config_file_section(tmp_path, small_trace, host):
    from sim.config import load_config
    p = tmp_path / "c.yaml"
    p.write_text("residency: naive\nprune:\n  blocks: mha:1,ffn:0\n")
    cfg = load_config(p)
    assert cfg.prune.blocks == "mha:1,ffn:0" and cfg.to_dict()["prune"] == {"blocks": "mha:1,ffn:0"}
    r = simulate(small_trace, None, host, cfg, cache=SetAlgebraCache())
    assert r.summary()["prune"]["blocks"] == "ffn:0,mha:1"          # canonical: block-index order
    p.write_text("prune:\n  block: mha:1\n")
    with pytest.raises(FlashsimError, match="prune: unknown parameter 'block'; did you mean 'blocks'\\? valid parameters: blocks"):
        load_config(p)
