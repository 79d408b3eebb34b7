"""MoE runs on the real backend (slow): model mode on a tiny MoE built locally (its logits equal the dense
HF forward), and shape mode on a >= 3 GB expert store read with direct I/O, scored against the simulator."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from sim.moe.base import build_cache
from sim.moe.residency import walk

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from real.runtime.moe_model import store_from_hf
    from traces.capture.routing import build_tiny_moe

    base = tmp_path_factory.mktemp("moe")
    folder = build_tiny_moe(base / "tiny-mixtral", "mixtral")
    return folder, store_from_hf(folder, base / "store")


def test_model_mode_matches_the_dense_forward(tiny):
    from real.runtime.moe_model import dense_logits, run_model
    from real.weights.expert_store import open_expert_store

    folder, store = tiny
    ids = [5, 17, 99, 3, 42, 8, 8, 120, 64, 1, 2, 77]
    ref = dense_logits(folder, ids)
    r = run_model(folder, open_expert_store(store), ids, policy="lru", params=None, capacity=3)
    assert np.abs(r["logits"] - ref).max() < 1e-5 * max(1.0, np.abs(ref).max())
    res = walk(r["experts"], 8, build_cache("lru"), 3)
    assert r["hit_rate"] == pytest.approx(res.hit_rate) and 0 < r["hit_rate"] < 1


def test_cli_model_and_shape_mode(tiny, tmp_path, capsys):
    from flashsim.main import main

    folder, store = tiny
    (tmp_path / "t.txt").write_text("experts from flash, one token at a time")
    assert main(["real", "run", "--store", str(store), "--model", str(folder), "--text", str(tmp_path / "t.txt"),
                 "--max-tokens", "10", "--expert-cache", "lfu", "--capacity", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mode"] == "model" and out["same_next_token"] and out["max_abs_logit_diff_vs_dense"] < 1e-4
    assert out["hit_rate_real"] == pytest.approx(out["hit_rate_sim"])
    assert main(["trace", "synth-routing", "--like", str(_routing(tmp_path)), "--out", str(tmp_path / "r2"),
                 "--json"]) == 0
    capsys.readouterr()
    assert main(["real", "run", "--store", str(store), "--trace", str(tmp_path / "r2"), "--expert-cache",
                 "belady", "--capacity", "2", "--repeats", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mode"] == "shape" and out["repeats"] == 2 and out["hit_rate_real"] == pytest.approx(out["hit_rate_sim"])


def _routing(tmp_path: Path) -> Path:
    from traces.routing_synth import SynthParams, synthesize

    p, _ = synthesize(tmp_path / "r", model="tiny", n_layers=2, moe_layers=[0, 1], n_experts=8, top_k=2,
                      n_tokens=16, params=SynthParams(1.0, 0.8, 0.3))
    return p


def test_shape_mode_past_the_page_cache_scored_against_the_simulator():
    """A 3.2 GB expert store (8 MoE layers x 8 experts x 50 MB, fp32) in a temporary folder, read with
    direct I/O (every miss reaches the disk), two repeats, scored against the simulator on this-host."""
    from devices import load_profile
    from real.runtime.moe_runs import run_shape, score, simulated_latency_s
    from real.weights.expert_store import open_expert_store, random_experts, write_expert_store
    from traces.routing_synth import SynthParams, generate

    tmp = Path(tempfile.mkdtemp(prefix="flashsim-moe-3gb-"))
    try:
        d, f, M, E, K = 2048, 2048, 8, 8, 2
        store = open_expert_store(write_expert_store(
            tmp / "store", model="shape-3gb", n_layers=M, moe_layers=list(range(M)), n_experts=E, top_k=K,
            d_model=d, d_expert_ff=f, dtype="fp32", experts=random_experts(d, f, 0), source={"kind": "random"}))
        assert store.total_bytes >= 3 * 10**9
        ex, w = generate(np.full((M, E), 1 / E), K, 10, SynthParams(1.0, 0.8, 0.3), seed=0)
        runs = [run_shape(store, ex, w, policy="lru", params=None, capacity=2) for _ in range(2)]
        if not runs[0]["direct_io"]:
            pytest.skip("this filesystem refuses O_DIRECT: reads would hit the page cache")
        sim_lat, sim_hit = simulated_latency_s(store, ex, load_profile("this-host"), policy="lru", params=None,
                                               capacity=2)
        res = walk(ex, E, build_cache("lru"), 2)
        assert runs[0]["hit_rate"] == pytest.approx(sim_hit) == pytest.approx(res.hit_rate)
        misses = (~res.hit).sum(axis=(1, 2))
        assert np.array_equal(runs[1]["bytes_read"], misses * store.manifest.stride_bytes)
        sc = score(runs, sim_lat)
        assert sc["repeats"] == 2 and np.isfinite(sc["error"]) and sc["repeat_spread"] is not None
        print(json.dumps(sc))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
