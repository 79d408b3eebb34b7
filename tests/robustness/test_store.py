"""Issue 47, weight stores: a changed byte anywhere (an FFN bundle, padding, the resident tensors'
data or header) is refused by `real read` and `real run` without a full verify on every run."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from devices.errors import FlashsimError
from devices.model_spec import ModelSpec
from real.weights.convert import write_shape_store
from real.weights.store import open_store
from real.weights.store_integrity import RECORD, record_matches
from tests.robustness.conftest import assert_refused, cli, tiny_spec


@pytest.fixture(scope="module")
def clean_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_shape_store(tiny_spec(), tmp_path_factory.mktemp("store") / "s", seed=3, dtype="fp32")


def _flip(path: Path, offset: int) -> None:
    b = bytearray(path.read_bytes())
    b[offset] ^= 0x01
    path.write_bytes(bytes(b))


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


WHERE = {
    "bundle": ("ffn/layer_000.bundled.bin", 100),
    "padding": ("ffn/layer_001.bundled.bin", 4096 - 10),     # a 384 B bundle on a 4 KiB stride
    "resident data": ("resident.safetensors", -5),
    "resident header": ("resident.safetensors", 20),
}


@pytest.mark.parametrize("where", sorted(WHERE))
def test_issue47_changed_byte_refused_by_read(tmp_path, capsys, clean_store, where):
    store = _copy(clean_store, tmp_path / "s")
    code, _, err = cli(capsys, "real", "read", store, "--fraction", "1.0", "--tokens", "1", "--buffered")
    assert code == 0, err                       # verified once: the record is written
    assert (store / RECORD).is_file()
    name, off = WHERE[where]
    f = store / name
    _flip(f, off % f.stat().st_size)
    code, _, err = cli(capsys, "real", "read", store, "--fraction", "1.0", "--tokens", "1", "--buffered")
    assert_refused(code, err, contains=f"{f}: checksum mismatch at offset ")
    extent = (off % f.stat().st_size) // (1 << 18) * (1 << 18)
    assert f"offset {extent} " in err


def test_issue47_changed_byte_refused_by_run(tmp_path, capsys, clean_store):
    store = _copy(clean_store, tmp_path / "s")
    _flip(store / "ffn/layer_000.bundled.bin", 7)
    code, _, err = cli(capsys, "real", "run", "--store", store, "--trace", tmp_path / "none", "--profile",
                       "jetson-orin-nano-8gb")
    assert_refused(code, err, contains="checksum mismatch")


def test_issue47_record_skips_the_full_check_until_a_change(tmp_path, clean_store, monkeypatch):
    store = _copy(clean_store, tmp_path / "s")
    open_store(store, verify="record")
    names = list(open_store(store).manifest.files)
    assert record_matches(store, names)
    import real.weights.store_integrity as si

    calls = []
    monkeypatch.setattr(si, "hash_file", lambda p: calls.append(p) or (_ for _ in ()).throw(AssertionError))
    open_store(store, verify="record")          # matching record: nothing hashed
    assert calls == []
    monkeypatch.undo()
    os.utime(store / "order.npy")               # same bytes, new identity: checked again, accepted
    assert not record_matches(store, names)
    open_store(store, verify="record")
    assert record_matches(store, names)


def test_issue47_read_only_store_records_in_the_cache(tmp_path, clean_store, monkeypatch):
    store = _copy(clean_store, tmp_path / "s")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    import real.weights.store_integrity as si

    monkeypatch.setattr(si, "_record_paths", lambda p: [tmp_path / "nope" / "x" / RECORD, si._cache_record(p)])
    (tmp_path / "nope").write_text("a file, so the folder cannot be made")
    open_store(store, verify="record")
    assert list((tmp_path / "cache" / "flashsim" / "verified").glob("*.json"))


def test_issue47_model_mode_runs_from_the_store_resident_tensors(tmp_path):
    """The HF model's own attention/embedding weights are replaced by the store's bytes."""
    torch = pytest.importorskip("torch")
    from real.runtime.model_mode import load_resident
    from real.weights.convert import convert_state_dict
    from tests.real.conftest import tiny_llama

    model = tiny_llama(2)
    spec = ModelSpec.from_hf_config(model.config.to_dict(), name="tiny")
    path = convert_state_dict(model.state_dict(), spec, tmp_path / "s", dtype="fp32")
    store = open_store(path, verify="record")
    want = model.model.layers[0].self_attn.q_proj.weight.detach().clone()
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.weight.zero_()
        model.model.embed_tokens.weight.zero_()
    n = load_resident(model, store)
    assert n > 5
    assert torch.equal(model.model.layers[0].self_attn.q_proj.weight, want)
    assert float(model.model.embed_tokens.weight.detach().abs().sum()) > 0
    with pytest.raises(FlashsimError, match="incomplete"):
        load_resident(model, open_store(write_shape_store(spec, tmp_path / "shape", seed=0, dtype="fp32")))


@pytest.mark.parametrize(("argv", "contains"), [(["--tokens", "1000000000000"], "above the limit"),
                                                (["--in-flight", "1000000"], "--in-flight"),
                                                (["--fraction", "nan"], "--fraction")])
def test_issue47_real_read_values_refused(capsys, clean_store, argv, contains):
    code, _, err = cli(capsys, "real", "read", clean_store, *argv)
    assert_refused(code, err, contains=contains)


def test_issue47_convert_cleans_an_interrupted_writer(tmp_path):
    stale = tmp_path / ".s.tmp-99999999-deadbeef"        # left by a `real convert` killed with -9
    (stale / "ffn").mkdir(parents=True)
    (stale / "ffn" / "layer_000.bundled.bin").write_bytes(b"\0" * 8192)
    write_shape_store(tiny_spec(), tmp_path / "s", seed=0, dtype="fp32")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]
