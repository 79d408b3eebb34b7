"""`flashsim real convert|info|verify|read|mmap` end to end, and bad input: one line, exit 2."""

from __future__ import annotations

import errno
import json
import os
from collections import namedtuple

import pytest

from flashsim.main import main
from real.weights import store_writer

TINY = """name: tiny
source: test shape
config: {model_type: llama, hidden_size: 128, intermediate_size: 256, num_hidden_layers: 2,
         num_attention_heads: 4, num_key_value_heads: 2, vocab_size: 100}
"""


@pytest.fixture
def shape_store(tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY)
    out = tmp_path / "s"
    assert main(["real", "convert", "--shape", str(tmp_path / "tiny.yaml"), "--random", "--seed", "1",
                 "--out", str(out), "--layout", "both", "--dtype", "fp32", "--json"]) == 0
    return out


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("flashsim: error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_convert_info_verify_read_mmap(shape_store, capsys):
    capsys.readouterr()
    assert main(["real", "info", str(shape_store), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["mode"], info["n_layers"], info["n_neurons"], info["bundle_bytes"]) == ("shape", 2, 256, 3 * 128 * 4)
    assert main(["real", "verify", str(shape_store)]) == 0
    assert "OK (" in capsys.readouterr().out
    assert main(["real", "read", str(shape_store), "--tokens", "2", "--fraction", "0.2", "--in-flight", "2",
                 "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["calls"] == 4 and r["direct_io"] and r["bytes_per_s"] > 0 and r["bytes_copied"] == 0
    assert r["bytes_useful"] == 4 * 51 * 3 * 128 * 4    # round(0.2 * 256) = 51 neurons per call
    assert main(["real", "read", str(shape_store), "--tokens", "1", "--run", "4", "--max-chunk", "16KiB",
                 "--layout", "unbundled", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["chunk_bytes_median"] == 4 * 4096           # runs of 4 padded rows, one read each
    assert main(["real", "mmap", str(shape_store), "--budget", "50%", "--tokens", "2", "--framework", "numpy",
                 "--json"]) == 0
    m = json.loads(capsys.readouterr().out)
    assert m["budget_bytes"] == m["ffn_bytes"] // 2 and len(m["tokens"]) == 2
    assert main(["real", "read", str(shape_store), "--tokens", "1"]) == 0
    assert "direct I/O" in capsys.readouterr().out


def test_shape_needs_random(tmp_path, capsys):
    assert main(["real", "convert", "--shape", "llama-2-7b", "--out", str(tmp_path / "s")]) == 2
    assert "add --random" in _error(capsys)


def test_disk_full_is_refused(tmp_path, capsys, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(store_writer.shutil, "disk_usage", lambda p: usage(10**12, 10**12, 2**30))
    assert main(["real", "convert", "--shape", "llama-2-7b", "--random", "--out", str(tmp_path / "s")]) == 2
    assert "not enough disk space: the store needs 8.06 GiB" in _error(capsys)


def test_checksum_mismatch(shape_store, capsys):
    f = shape_store / "ffn" / "layer_001.unbundled.bin"
    data = bytearray(f.read_bytes())
    data[123] ^= 1
    f.write_bytes(bytes(data))
    assert main(["real", "verify", str(shape_store)]) == 2
    assert f"{f}: checksum mismatch" in _error(capsys)


@pytest.mark.parametrize("damage, message", [
    ("truncate", "truncated"), ("unalign", "not a multiple of 4096 (unaligned)"), ("remove", "missing"),
])
def test_damaged_files(shape_store, capsys, damage, message):
    f = shape_store / "ffn" / "layer_000.bundled.bin"
    if damage == "truncate":
        f.write_bytes(f.read_bytes()[:4096])
    elif damage == "unalign":
        f.write_bytes(f.read_bytes() + b"x")
    else:
        f.unlink()
    assert main(["real", "info", str(shape_store)]) == 2
    err = _error(capsys)
    assert str(f) in err and message in err


def test_wrong_manifest_version(shape_store, capsys):
    p = shape_store / "manifest.json"
    m = json.loads(p.read_text())
    m["schema_version"] = 99
    p.write_text(json.dumps(m))
    assert main(["real", "read", str(shape_store)]) == 2
    assert f"{p}: field 'schema_version': 99 is not supported" in _error(capsys)


def test_not_a_store(tmp_path, capsys):
    assert main(["real", "info", str(tmp_path / "nope")]) == 2
    assert "no such weight store" in _error(capsys)


def test_eio_names_file_and_offset(shape_store, capsys, monkeypatch):
    def eio(fd, bufs, off):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "preadv", eio)
    assert main(["real", "read", str(shape_store), "--tokens", "1"]) == 2
    err = _error(capsys)
    assert "layer_000.bundled.bin: I/O error reading" in err and "at offset" in err


def test_eio_while_verifying(shape_store, capsys, monkeypatch):
    import builtins

    real_open = builtins.open

    class Broken:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.f.close()

        def read(self, n=-1):
            raise OSError(errno.EIO, "Input/output error")

    def fake_open(path, mode="r", *a, **k):
        f = real_open(path, mode, *a, **k)
        return Broken(f) if str(path).endswith("layer_001.bundled.bin") and "b" in mode else f

    monkeypatch.setattr(builtins, "open", fake_open)
    assert main(["real", "verify", str(shape_store)]) == 2
    assert "layer_001.bundled.bin: I/O error while reading (Input/output error)" in _error(capsys)
