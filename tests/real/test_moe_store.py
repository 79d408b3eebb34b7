"""The expert store and the expert cache on it: layout and checks of the store, the direct-I/O reader
reading experts, and the executor making the simulator's cache decisions (no compute, no torch)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from devices.errors import FlashsimError
from real.io.buffers import AlignedBuffer
from real.io.reader import BundleReader
from real.runtime.moe_runs import run_shape
from real.weights.expert_store import (
    expert_bytes_of,
    open_expert_store,
    random_experts,
    write_expert_store,
)
from sim.moe.base import build_cache
from sim.moe.residency import walk


def small_store(path, n_layers=3, n_experts=8, top_k=2, d=32, f=64, dtype="fp32"):
    return write_expert_store(path, model="tiny", n_layers=n_layers, moe_layers=list(range(n_layers)),
                              n_experts=n_experts, top_k=top_k, d_model=d, d_expert_ff=f, dtype=dtype,
                              experts=random_experts(d, f, 0, pool=5), source={"kind": "random"})


def test_layout_alignment_and_checksums(tmp_path):
    s = open_expert_store(small_store(tmp_path / "s", d=48, f=40, dtype="fp16"), verify=True)
    m = s.manifest
    assert m.expert_bytes == expert_bytes_of(48, 40, "fp16") == 3 * 48 * 40 * 2
    assert m.stride_bytes % 4096 == 0 and m.stride_bytes >= m.expert_bytes
    assert (tmp_path / "s" / m.layer_files[1]).stat().st_size == 8 * m.stride_bytes
    g, u, d = s.read_expert(2, 5)
    want = random_experts(48, 40, 0, pool=5)(2, 5)
    for got, ref in zip((g, u, d), want):
        assert got.shape == ref.shape and np.allclose(got, ref.astype(np.float16), atol=0)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_damage_is_refused(tmp_path):
    p = small_store(tmp_path / "s")
    f = p / "experts" / "layer_001.bin"
    data = bytearray(f.read_bytes())
    data[100] ^= 1
    f.write_bytes(bytes(data))
    open_expert_store(p)                                      # sizes still right
    with pytest.raises(FlashsimError, match="layer_001.bin: checksum mismatch"):
        open_expert_store(p, verify=True)
    f.write_bytes(bytes(data[:-4096]))
    with pytest.raises(FlashsimError, match="layer_001.bin: missing or not"):
        open_expert_store(p)
    m = json.loads((p / "manifest.json").read_text())
    (p / "manifest.json").write_text(json.dumps({**m, "schema_version": 7}))
    with pytest.raises(FlashsimError, match="schema_version"):
        open_expert_store(p)
    with pytest.raises(FlashsimError, match="already exists"):
        small_store(p)


def test_the_reader_reads_whole_experts_in_place(tmp_path):
    s = open_expert_store(small_store(tmp_path / "s"))
    stride = s.manifest.stride_bytes
    buf = AlignedBuffer(3 * stride)
    dest = buf.view2d(3, stride)
    with BundleReader(s, in_flight=2) as r:
        st = r.read(1, np.array([6, 0, 7]), dest)
    assert st.bytes_read == 3 * stride and st.bytes_copied == (0 if st.direct_io else st.bytes_copied)
    assert st.reads_issued == 2                                # 6 and 7 adjacent: one read
    for row, e in enumerate((6, 0, 7)):
        assert np.array_equal(s.split(dest[row])[2], s.read_expert(1, e)[2])


@pytest.mark.parametrize("policy", ["lru", "lfu", "least-stale", "belady", "pinned", "cache-aware"])
def test_real_cache_decisions_equal_the_simulators(tmp_path, policy):
    s = open_expert_store(small_store(tmp_path / "s"))
    rng = np.random.default_rng(3)
    experts = np.argsort(rng.random((30, 3, 8)) + np.array([0.5, 0.3, 0.2, 0, 0, 0, 0, 0]), axis=2)[:, :, :2]
    weights = np.sort(rng.random((30, 3, 2)), axis=2)[:, :, ::-1].astype(np.float32)
    r = run_shape(s, experts, weights, policy=policy, params=None, capacity=3, compute=False, threads=2)
    res = walk(experts, 8, build_cache(policy), 3, "layer", weights=weights)
    assert r["hit_rate"] == pytest.approx(res.hit_rate)
    misses = (~res.hit).sum(axis=(1, 2))
    assert np.array_equal(r["bytes_read"], misses * s.manifest.stride_bytes)   # one whole expert per miss


def test_offline_policy_needs_the_routing(tmp_path):
    from real.runtime.moe_executor import ExpertExecutor

    s = open_expert_store(small_store(tmp_path / "s"))
    with pytest.raises(FlashsimError, match="needs the whole routing"):
        ExpertExecutor(s, build_cache("belady"), 2)
    with pytest.raises(FlashsimError, match="page-cache baseline"):
        ExpertExecutor(s, build_cache("page-cache"), 2, routing=np.zeros((1, 3, 2), np.int64))


def test_cli_bad_input_is_one_line(tmp_path, capsys):
    from flashsim.main import main
    from traces.routing_synth import SynthParams, synthesize

    store = small_store(tmp_path / "s")                        # 3 MoE layers x 8 experts, top-2
    trace, _ = synthesize(tmp_path / "r", model="m", n_layers=2, moe_layers=[0, 1], n_experts=8, top_k=2,
                          n_tokens=5, params=SynthParams())
    assert main(["real", "run", "--store", str(store), "--trace", str(trace)]) == 2
    err = capsys.readouterr().err
    assert "does not fit the expert store" in err and len(err.strip().splitlines()) == 1
    assert main(["real", "moe-store", "--out", str(tmp_path / "x"), "--like", str(trace)]) == 2
    assert "--d-model and --d-expert-ff" in capsys.readouterr().err
    assert main(["real", "run", "--store", str(store), "--trace", str(trace), "--expert-cache", "nope"]) == 2
    assert "unknown expert-cache policy 'nope'" in capsys.readouterr().err


def test_page_cache_baseline_faults_experts_in(tmp_path):
    """The page-cache policy runs on an mmap: same decisions as the simulator, misses read by page faults
    (measured in /proc/self/io: at least the missed experts' bytes; read-around may add more)."""
    s = open_expert_store(small_store(tmp_path / "s", d=256, f=512))
    rng = np.random.default_rng(4)
    experts = np.argsort(rng.random((12, 3, 8)), axis=2)[:, :, :2]
    weights = np.full(experts.shape, 0.5, np.float32)
    r = run_shape(s, experts, weights, policy="page-cache", params=None, capacity=4, compute=False)
    res = walk(experts, 8, build_cache("page-cache"), 4, "layer")
    assert r["hit_rate"] == pytest.approx(res.hit_rate) and not r["direct_io"]
    missed = int((~res.hit).sum()) * s.manifest.expert_bytes
    if r["bytes_read"].sum() == 0:
        pytest.skip("/proc/self/io does not count this filesystem's reads")
    assert r["bytes_read"].sum() >= 0.9 * missed
