"""`flashsim validate`'s moe mode: expert-cache configurations on an expert store scored like the dense
modes (interleaved passes, the simulator's error per metric beside the repeat spread, the pass rule),
and the MoE simulator priced as the executor runs (the measured dense GEMV table for expert compute,
one read per expert on the executor's reader threads)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from devices.achievable import at_bound
from devices.curves import read_time_s
from devices.moe_spec import MoESpec
from devices.schema import load_profile
from real.validation.validate_moe import MoEPoint, MoEStoreShape, moe_rows
from real.validation.validate_score import FLOOR_METRICS, summarize
from sim.moe.timing import OPS_EXPERT_ELEMENTWISE, ReadEngine, expert_compute_s, layer_costs

TINY = MoEStoreShape("tiny", 2, 256, 128)      # 2 MoE layers x 8 experts of 384 KiB


def _spec(d: int, f: int, layers: int = 2) -> MoESpec:
    return MoESpec(name="t", family="mixtral", n_layers=layers, moe_layers=tuple(range(layers)), n_experts=8,
                   top_k=2, d_model=d, d_expert_ff=f, n_heads=1, n_kv_heads=1, head_dim=1,
                   layer_kinds=("full",) * layers, vocab_size=1, dtype="fp32", source="test")


def test_tiny_store_scored_like_dense_rows(tmp_path):
    """Two policies, two interleaved passes on a tiny store: every MoE row carries the dense rows'
    metrics (errors, spread, each pass alone), bytes and hit rates agree exactly with the simulator,
    and the summary has the floor and its pass rule over latency, I/O and compute."""
    rows: list = []
    seen: list = []
    info = moe_rows(load_profile("this-host"), [MoEPoint("lru", 2), MoEPoint("belady", 2)], TINY, 6, 0, tmp_path,
                    1, rows, lambda i, n, label, e: seen.append((i, n, label)), 2, repeats=2)
    assert info["store_bytes"] == 2 * 8 * 384 * 1024 and info["io_threads"] >= 1
    assert [r["config"] for r in rows] == ["moe: lru x2/layer (tiny store)", "moe: belady x2/layer (tiny store)"]
    assert [s[0] for s in seen] == [1, 2]
    for r in rows:
        m = r["metrics"]
        assert r["mode"] == "moe" and r["hit_rate_real"] == pytest.approx(r["hit_rate_sim"])
        assert m["bytes_read"]["error"] == 0.0 and m["bytes_read"]["real"] > 0
        for k in FLOOR_METRICS:
            assert np.isfinite(m[k]["error"]) and len(m[k]["pass_errors"]) == 2 and "spread" in m[k]
    s = summarize(rows)
    assert s["n_configs"] == 2 and set(s["floor"]["metrics"]) == set(FLOOR_METRICS)
    assert s["floor"]["metrics"]["latency_s"]["real_repeat_p50"] is not None
    assert isinstance(s["floor"]["pass"], bool)


def test_moe_store_option_is_checked():
    from devices.errors import FlashsimError
    from real.validation.validate_grid import parse_modes
    from real.validation.validate_moe import MOE_LARGE, store_shape

    assert parse_modes("moe") == ("moe",)
    assert store_shape(True, "large") is MOE_LARGE
    assert MOE_LARGE.n_layers * 8 * MOE_LARGE.expert_bytes() >= 3 * 10**9
    with pytest.raises(FlashsimError, match="--moe-store"):
        store_shape(True, "huge")


def test_expert_compute_priced_from_the_dense_gemv_table():
    """Gate and up are [F x d] GEMVs, down a [d x F] one, each from the profile's table; doubling the
    table doubles the GEMV part; a profile without a table falls back to the stream rate."""
    prof = at_bound(load_profile("this-host"), "achievable")
    spec = _spec(1024, 512)
    table = prof.compute.dense_gemv.tables["fp32"].table()

    def gemv(out_f: int, in_f: int) -> float:
        return float(table.seconds_at(in_f, np.array([out_f], float))[0])

    ovh = prof.compute.op_overhead_s * OPS_EXPERT_ELEMENTWISE
    want = 2 * gemv(512, 1024) + gemv(1024, 512) + ovh
    assert expert_compute_s(spec, prof, "fp32") == pytest.approx(want, rel=1e-12)
    dg = prof.compute.dense_gemv
    t32 = dg.tables["fp32"]
    doubled = t32.model_copy(update={"gemv_s": (np.asarray(t32.gemv_s) * 2).tolist()})
    prof2 = prof.model_copy(update={"compute": prof.compute.model_copy(
        update={"dense_gemv": dg.model_copy(update={"tables": {**dg.tables, "fp32": doubled}})})})
    assert expert_compute_s(spec, prof2, "fp32") - ovh == pytest.approx(2 * (want - ovh), rel=1e-9)
    bare = prof.model_copy(update={"compute": prof.compute.model_copy(update={"dense_gemv": None})})
    rate = bare.memory.bandwidth_bytes_per_s * bare.compute.gemv_efficiency_for("fp32")
    assert expert_compute_s(spec, bare, "fp32") == pytest.approx(spec.expert_bytes("fp32") / rate
                                                                 + 3 * bare.compute.op_overhead_s)
    assert layer_costs(spec, prof, "fp32", 0, 4).expert_s == pytest.approx(want)


def test_executor_reads_priced_as_issued():
    """ReadEngine(threads): a batch of n experts is n reads of the whole expert with at most `threads`
    outstanding, at the read curve for that size and depth (the executor's one preadv per expert)."""
    prof = at_bound(load_profile("this-host"), "achievable")
    spec = _spec(1024, 1024)
    eb = spec.expert_bytes("fp32")
    c = layer_costs(spec, prof, "fp32", 0, 6, engine=ReadEngine(4))
    for n in range(7):
        assert c.read_batch_s[n] == pytest.approx(read_time_s(prof.flash.curve, eb, n, 4))
    one = layer_costs(spec, prof, "fp32", 0, 6, engine=ReadEngine(1))
    assert one.read_batch_s[4] > c.read_batch_s[4]     # depth 1 is slower than 4 on this disk's table


@pytest.mark.slow
def test_validate_scores_a_3gb_moe_store(capsys):
    """`flashsim validate --modes moe --moe-store large`: a 3 GiB expert store (32 x 8 experts of
    12 MiB), direct I/O, the quick MoE grid in two passes, scored with the floor and the pass rule."""
    import json

    from flashsim.main import main

    tmp = Path(tempfile.mkdtemp(prefix="flashsim-validate-moe-"))
    try:
        assert main(["validate", "--quick", "--json", "--modes", "moe", "--moe-store", "large", "--repeats", "2",
                     "--workdir", str(tmp)]) == 0
        rep = json.loads(capsys.readouterr().out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    moe = rep["per_mode"]["moe"]
    assert moe["store_bytes"] >= 3 * 10**9 and moe["n_configs"] == 4
    if not rep["direct_io"]:
        pytest.skip("this filesystem refuses O_DIRECT: reads would hit the page cache")
    assert set(rep["floor"]["metrics"]) == {"latency_s", "io_s", "compute_s"}
    assert all(r["metrics"]["bytes_read"]["error"] == 0.0 for r in rep["configs"])
    print(json.dumps({k: rep["floor"]["metrics"][k] for k in rep["floor"]["metrics"]}))


def test_initial_set_is_read_before_the_first_step(tmp_path, monkeypatch):
    """An offline policy's initial set (Belady, pinned) is in its slots when the executor is built:
    the simulator starts with it resident, so no step may compute on a slot still being filled or
    queue its reads behind the preload (slow reads make the old executor return before they land)."""
    import time

    from real.runtime.moe_executor import ExpertExecutor
    from real.weights.expert_store import open_expert_store, random_experts, write_expert_store
    from sim.moe.base import build_cache

    store = open_expert_store(write_expert_store(
        tmp_path / "s", model="t", n_layers=2, moe_layers=[0, 1], n_experts=8, top_k=2, d_model=32, d_expert_ff=64,
        dtype="fp32", experts=random_experts(32, 64, 0, pool=5), source={"kind": "random"}))
    slow = ExpertExecutor._read_one

    def read_slowly(self, key, slot):
        time.sleep(0.05)
        return slow(self, key, slot)

    monkeypatch.setattr(ExpertExecutor, "_read_one", read_slowly)
    routing = np.random.default_rng(0).integers(0, 8, (6, 2, 2))
    routing[:, :, 1] = (routing[:, :, 0] + 1) % 8
    with ExpertExecutor(store, build_cache("belady"), 3, routing=routing, threads=2) as ex:
        keys = np.flatnonzero(ex.resident)
        assert len(keys) > 0
        for k in keys:
            m, e = divmod(int(k), 8)
            assert np.array_equal(store.split(ex.rows[ex.slot_of[k]])[2], store.read_expert(m, e)[2])
