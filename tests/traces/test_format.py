"""Trace format v1: the writer round-trips, and the reader rejects every kind of damage with a
message naming the file and field. Also the small-trace builders the other trace tests use."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from devices.errors import FlashsimError
from devices.model_spec import ModelSpec
from traces.format import PromptInfo, SparsityRule, TraceWriter, open_trace, pack_mask, top_k_of


def tiny_spec(n_layers: int = 2, d_ff: int = 8, name: str = "tiny") -> ModelSpec:
    return ModelSpec(name=name, family="llama", n_layers=n_layers, d_model=16, d_ff=d_ff, n_heads=2,
                     n_kv_heads=2, head_dim=8, vocab_size=64, ffn_kind="swiglu")


def write_trace(path: Path, masks: np.ndarray, prompt_index: np.ndarray | None = None,
                phase: np.ndarray | None = None, tasks: list[str] | None = None,
                mags: np.ndarray | None = None, top_k: int = 0, spec: ModelSpec | None = None) -> Path:
    """A trace from hand-made bool masks [L, T, N] (and optionally |a| [L, T, N] with top_k > 0)."""
    masks = np.asarray(masks, bool)
    n_layers, n_tokens, n = masks.shape
    spec = spec or tiny_spec(n_layers, n)
    prompt_index = np.zeros(n_tokens, np.int32) if prompt_index is None else np.asarray(prompt_index)
    phase = np.ones(n_tokens, np.uint8) if phase is None else np.asarray(phase)
    n_prompts = int(prompt_index.max()) + 1
    tasks = tasks or ["qa"] * n_prompts
    prompts = [PromptInfo(id=f"p{i}", task=tasks[i], n_prompt_tokens=int(((prompt_index == i) & (phase == 0)).sum()),
                          n_generated_tokens=int(((prompt_index == i) & (phase == 1)).sum()))
               for i in range(n_prompts)]
    with TraceWriter(path, spec, n_tokens, top_k, SparsityRule(rule="topk", target_fraction=0.5), prompts) as w:
        w.token_ids[:] = np.arange(n_tokens) % spec.vocab_size
        w.phase[:] = phase
        w.prompt_index[:] = prompt_index
        for layer in range(n_layers):
            w.masks[layer] = pack_mask(masks[layer])
            if mags is not None:
                a = np.asarray(mags[layer], np.float32)
                if top_k:
                    w.top_idx[layer], w.top_mag[layer] = top_k_of(a, top_k, n)
                w.abs_sum[layer] = a.sum(axis=1)
            else:
                w.abs_sum[layer] = masks[layer].sum(axis=1)
    return Path(path)


def random_trace(path: Path, n_layers: int = 2, n_tokens: int = 24, n: int = 16, seed: int = 0,
                 top_k: int = 4) -> Path:
    rng = np.random.default_rng(seed)
    mags = rng.random((n_layers, n_tokens, n)).astype(np.float32)
    masks = mags > 0.6
    pi = np.repeat(np.arange(3), -(-n_tokens // 3))[:n_tokens].astype(np.int32)
    pos = np.arange(n_tokens) - np.searchsorted(pi, pi)         # position within its prompt
    phase = (pos >= 3).astype(np.uint8)                           # 3 prefill tokens, then decode
    return write_trace(path, masks, pi, phase, ["qa", "code", "story"], mags, top_k)


def test_round_trip(tmp_path):
    t = open_trace(random_trace(tmp_path / "t"))
    assert (t.n_layers, t.n_tokens, t.n_neurons, t.top_k) == (2, 24, 16, 4)
    rng = np.random.default_rng(0)
    mags = rng.random((2, 24, 16)).astype(np.float32)
    assert np.array_equal(t.mask(1), mags[1] > 0.6)
    idx, mag = t.top(0)
    assert np.allclose(np.asarray(mag, np.float32), np.sort(mags[0], axis=1)[:, ::-1][:, :4], atol=1e-3)
    assert list(t.task_of_token[:9]) == ["qa"] * 8 + ["code"]


def _corrupt_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _rewrite_manifest(path: Path, **changes) -> None:
    m = json.loads((path / "manifest.json").read_text())
    m.update(changes)
    (path / "manifest.json").write_text(json.dumps(m))


@pytest.fixture
def good(tmp_path) -> Path:
    return random_trace(tmp_path / "good")


@pytest.mark.parametrize("damage, message", [
    ("missing", "missing array file"),
    ("extra", "unexpected file"),
    ("truncated", "truncated"),
    ("checksum", "checksum mismatch"),
    ("schema", "schema_version"),
    ("nan", "NaN"),
    ("spec", "n_layers"),
    ("not_json", "invalid JSON"),
    ("no_manifest", "manifest.json is missing"),
])
def test_reader_rejects_damage(tmp_path, good, damage, message):
    t = _corrupt_copy(good, tmp_path / "bad")
    if damage == "missing":
        (t / "top_mag.npy").unlink()
    elif damage == "extra":
        np.save(t / "extra.npy", np.zeros(3))
    elif damage == "truncated":
        data = (t / "masks.npy").read_bytes()
        (t / "masks.npy").write_bytes(data[: len(data) // 2])
    elif damage == "checksum":
        arr = np.load(t / "phase.npy")
        arr[0] ^= 1
        np.save(t / "phase.npy", arr)
    elif damage == "schema":
        _rewrite_manifest(t, schema_version=99)
    elif damage == "nan":
        mag = np.load(t / "top_mag.npy")
        mag[1, 3, 0] = np.nan
        np.save(t / "top_mag.npy", mag)
        m = json.loads((t / "manifest.json").read_text())
        m["files"]["top_mag"]["sha256"] = hashlib.sha256((t / "top_mag.npy").read_bytes()).hexdigest()
        (t / "manifest.json").write_text(json.dumps(m))
    elif damage == "spec":
        m = json.loads((t / "manifest.json").read_text())
        m["model"]["d_ff"] = 32
        (t / "manifest.json").write_text(json.dumps(m))
    elif damage == "not_json":
        (t / "manifest.json").write_text("{not json")
    elif damage == "no_manifest":
        (t / "manifest.json").unlink()
    with pytest.raises(FlashsimError, match=message) as e:
        open_trace(t)
    assert "\n" not in str(e.value)


def test_writer_aborts_cleanly(tmp_path):
    spec = tiny_spec(1, 8)
    with pytest.raises(RuntimeError), TraceWriter(tmp_path / "x", spec, 4, 0, SparsityRule(rule="relu"),
                                                  [PromptInfo(id="a", task="t", n_prompt_tokens=0,
                                                              n_generated_tokens=4)]):
        raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []
