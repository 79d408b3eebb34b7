"""Weight store: layout arithmetic, shape-mode writing, determinism, atomicity, validation."""

from __future__ import annotations

import json
import shutil
from collections import namedtuple

import numpy as np
import pytest

from devices.errors import FlashsimError
from devices.model_spec import load_model
from real.weights import store_writer
from real.weights.convert import write_shape_store
from real.weights.dtypes import decode
from real.weights.store import open_store, plan_layout
from tests.real.conftest import tiny_spec
from traces.profiler import NeuronProfile, save_profile


def test_layout_sizes_hand_computed():
    spec = load_model("smollm2-135m")  # d_model 576, d_ff 1536, 30 layers, SwiGLU
    infos, entries, sizes = plan_layout(spec, "fp16", ["bundled", "unbundled"], "padded", "per-layer")
    b, u = infos["bundled"], infos["unbundled"]
    assert (b.unit_bytes, b.stride_bytes, b.region_bytes) == (3 * 576 * 2, 4096, 1536 * 4096)
    assert (u.unit_bytes, u.stride_bytes, u.regions_per_layer) == (1152, 4096, 3)
    assert entries[3]["unbundled"].region_offsets_bytes == [0, 1536 * 4096, 2 * 1536 * 4096]
    assert sizes["ffn/layer_029.bundled.bin"] == 1536 * 4096
    infos, entries, sizes = plan_layout(spec, "fp16", ["bundled"], "packed", "single")
    assert infos["bundled"].stride_bytes == 3456
    region = -(-1536 * 3456 // 4096) * 4096  # the region is padded to 4 KiB
    assert entries[2]["bundled"].offset_bytes == 2 * region
    assert sizes == {"ffn/bundled.bin": 30 * region}


def test_llama_7b_fp16_bundles_are_already_aligned():
    infos, _, _ = plan_layout(load_model("llama-2-7b"), "fp16", ["bundled"], "padded", "per-layer")
    assert infos["bundled"].unit_bytes == infos["bundled"].stride_bytes == 24576


@pytest.mark.parametrize("alignment", ["padded", "packed"])
@pytest.mark.parametrize("file_mode", ["per-layer", "single"])
def test_shape_store_layouts_agree(make_store, alignment, file_mode):
    st = make_store(layout="both", alignment=alignment, file_mode=file_mode)
    ids = np.array([0, 5, 6, 255, 100])
    for layer in range(st.n_layers):
        a = st.read_bundles(layer, ids, "bundled")
        b = st.read_bundles(layer, ids, "unbundled")
        np.testing.assert_array_equal(a, b)
    vals = decode(st.read_bundles(1, np.arange(st.n_neurons)), "fp32")
    assert np.all(np.isfinite(vals)) and 0.015 < vals.std() < 0.025  # U(-a, a) with std 0.02


def test_shape_store_is_deterministic_and_seeded(tmp_path):
    spec = tiny_spec()
    a = open_store(write_shape_store(spec, tmp_path / "a", seed=3, dtype="fp16"))
    b = open_store(write_shape_store(spec, tmp_path / "b", seed=3, dtype="fp16"))
    c = open_store(write_shape_store(spec, tmp_path / "c", seed=4, dtype="fp16"))
    sha = {k: v.sha256 for k, v in a.manifest.files.items()}
    assert sha == {k: v.sha256 for k, v in b.manifest.files.items()}
    assert sha["ffn/layer_000.bundled.bin"] != c.manifest.files["ffn/layer_000.bundled.bin"].sha256


def test_shape_store_bf16_and_biases(make_store):
    st = make_store(spec=tiny_spec(ffn_kind="relu", ffn_bias=True), dtype="bf16")
    assert st.segments == ["up", "down"] and st.bundle_bytes == 2 * 128 * 2
    from real.weights.safetensors_io import read_safetensors

    tensors, _ = read_safetensors(st.resident_path())
    assert tensors["model.layers.1.mlp.up_proj.bias"][1].shape == (256,)
    assert "model.layers.0.mlp.gate_proj.bias" not in tensors


def test_hot_first_order_from_profile(tmp_path):
    spec = tiny_spec()
    rng = np.random.default_rng(0)
    scores = rng.random((2, 256)).astype(np.float32)
    prof = save_profile(NeuronProfile(scores, {"qa": scores[::-1].copy()}, {"schema_version": 1, "tasks": ["qa"]}),
                        tmp_path / "p.npz")
    st = open_store(write_shape_store(spec, tmp_path / "s", seed=1, order="hot-first", profile=prof))
    hottest = np.argsort(-scores, axis=1, kind="stable")
    np.testing.assert_array_equal(st.neuron_at, hottest)          # slot 0 holds the hottest neuron
    np.testing.assert_array_equal(st.position[0][hottest[0][:3]], [0, 1, 2])
    assert st.manifest.order.kind == "hot-first" and st.manifest.order.ranking == "secondary"
    st2 = open_store(write_shape_store(spec, tmp_path / "t", seed=1, order="hot-first", profile=prof, task="qa"))
    np.testing.assert_array_equal(st2.neuron_at, np.argsort(-scores[::-1], axis=1, kind="stable"))
    with pytest.raises(FlashsimError, match="needs --profile"):
        write_shape_store(spec, tmp_path / "u", seed=1, order="hot-first")
    bad = save_profile(NeuronProfile(scores[:, :100].copy(), {}, {"schema_version": 1, "tasks": []}), tmp_path / "q.npz")
    with pytest.raises(FlashsimError, match="profile a trace of this model"):
        write_shape_store(spec, tmp_path / "v", seed=1, order="hot-first", profile=bad)


def test_refuses_when_disk_lacks_room(tmp_path, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(store_writer.shutil, "disk_usage", lambda p: usage(10**9, 10**9, 10 * 2**20))
    with pytest.raises(FlashsimError, match="not enough disk space"):
        write_shape_store(load_model("llama-2-7b"), tmp_path / "big", seed=0)
    assert list(tmp_path.iterdir()) == []


def test_interrupted_write_leaves_nothing(tmp_path, monkeypatch):
    calls = []

    def boom(*a, **k):
        calls.append(1)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return real(*a, **k)

    real = store_writer._pwrite_all
    monkeypatch.setattr(store_writer, "_pwrite_all", boom)
    with pytest.raises(KeyboardInterrupt):
        write_shape_store(tiny_spec(), tmp_path / "s", seed=0)
    assert list(tmp_path.iterdir()) == []


def test_existing_store_needs_overwrite(make_store, tmp_path):
    st = make_store("s")
    with pytest.raises(FlashsimError, match="already exists"):
        write_shape_store(tiny_spec(), st.path, seed=0)
    write_shape_store(tiny_spec(), st.path, seed=9, overwrite=True)
    assert open_store(st.path).manifest.source["seed"] == 9
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]


# ---- validation on open ------------------------------------------------------------------------------
@pytest.fixture
def store_path(make_store):
    return make_store(layout="both").path


def _edit_manifest(path, fn):
    m = json.loads((path / "manifest.json").read_text())
    fn(m)
    (path / "manifest.json").write_text(json.dumps(m))


def test_open_rejects_checksum_mismatch(store_path):
    f = store_path / "ffn/layer_001.bundled.bin"
    data = bytearray(f.read_bytes())
    data[5000] ^= 0xFF
    f.write_bytes(bytes(data))
    open_store(store_path, verify="sizes")  # sizes still fine
    with pytest.raises(FlashsimError, match=r"layer_001\.bundled\.bin: checksum mismatch"):
        open_store(store_path, verify="full")


def test_open_rejects_truncated_missing_unaligned(store_path):
    f = store_path / "ffn/layer_000.unbundled.bin"
    data = f.read_bytes()
    f.write_bytes(data[:-4096])
    with pytest.raises(FlashsimError, match=r"layer_000\.unbundled\.bin: truncated"):
        open_store(store_path)
    f.write_bytes(data + b"\0" * 100)
    with pytest.raises(FlashsimError, match=r"layer_000\.unbundled\.bin: .* not a multiple of 4096 \(unaligned\)"):
        open_store(store_path)
    f.write_bytes(data + b"\0" * 4096)
    with pytest.raises(FlashsimError, match="the file was changed"):
        open_store(store_path)
    f.write_bytes(data)
    (store_path / "ffn/layer_001.bundled.bin").unlink()
    with pytest.raises(FlashsimError, match=r"layer_001\.bundled\.bin: missing"):
        open_store(store_path)


def test_open_rejects_unaligned_offset_and_version(store_path):
    shutil.copytree(store_path, store_path.with_name("copy"))
    _edit_manifest(store_path, lambda m: m["layers"][1]["bundled"].update(offset_bytes=100))
    with pytest.raises(FlashsimError, match="not aligned"):
        open_store(store_path)
    other = store_path.with_name("copy")
    _edit_manifest(other, lambda m: m.update(schema_version=2))
    with pytest.raises(FlashsimError, match=r"manifest\.json: field 'schema_version': 2 is not supported"):
        open_store(other)
    (other / "manifest.json").unlink()
    with pytest.raises(FlashsimError, match="not a flashsim weight store"):
        open_store(other)


def test_open_rejects_bad_order(store_path):
    order = np.load(store_path / "order.npy")
    order[0, 0] = order[0, 1]
    np.save(store_path / "order.npy", order)
    with pytest.raises(FlashsimError, match="not a permutation"):
        open_store(store_path)
