"""Routing trace format v1: the writer round-trips, and the reader rejects damage with a message naming
the file and the field or rule. `make_routing` is the small-trace builder other routing tests use."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from devices.errors import FlashsimError
from traces.routing import (
    ROUTING_SCHEMA_VERSION,
    is_routing_trace,
    open_routing_trace,
    order_by_weight,
    write_routing_trace,
)


def random_routing(n_tokens: int = 12, n_moe: int = 3, n_experts: int = 8, top_k: int = 2, seed: int = 0):
    """Distinct expert ids per row and descending normalised weights [T, M, K]."""
    rng = np.random.default_rng(seed)
    keys = rng.random((n_tokens, n_moe, n_experts))
    experts = np.argsort(keys, axis=-1)[..., :top_k]
    w = rng.random((n_tokens, n_moe, top_k)).astype(np.float32)
    w /= w.sum(-1, keepdims=True)
    return order_by_weight(experts, w)


def make_routing(path: Path, n_tokens: int = 12, n_moe: int = 3, n_experts: int = 8, top_k: int = 2,
                 seed: int = 0, **kw) -> Path:
    e, w = random_routing(n_tokens, n_moe, n_experts, top_k, seed)
    phase = np.r_[np.zeros(n_tokens // 2), np.ones(n_tokens - n_tokens // 2)].astype(np.uint8)
    return write_routing_trace(path, model="tiny-moe", n_layers=n_moe + 1, moe_layers=list(range(1, n_moe + 1)),
                               n_experts=n_experts, top_k=top_k, experts=e, weights=w, phase=phase,
                               source={"kind": "synthetic", "seed": seed}, **kw)


def test_round_trip(tmp_path):
    p = make_routing(tmp_path / "r")
    t = open_routing_trace(p)
    e, w = random_routing()
    assert np.array_equal(t.experts, e) and t.experts.dtype == np.int16
    assert np.allclose(t.weights, w) and t.weights.dtype == np.float32
    assert t.manifest.schema_version == ROUTING_SCHEMA_VERSION and t.manifest.kind == "routing"
    assert t.manifest.moe_layers == [1, 2, 3] and t.n_moe_layers == 3 and t.top_k == 2
    assert is_routing_trace(p) and not is_routing_trace(tmp_path)
    assert not [x for x in tmp_path.iterdir() if x.name.startswith(".")]   # no temporaries left


def test_refuses_existing_output(tmp_path):
    p = make_routing(tmp_path / "r")
    with pytest.raises(FlashsimError, match="already exists"):
        make_routing(p)
    make_routing(p, seed=1, overwrite=True)
    assert open_routing_trace(p).manifest.source["seed"] == 1


@pytest.mark.parametrize("damage, match", [
    (lambda e, w: e.__setitem__((0, 0, 0), 8), "ids in range"),
    (lambda e, w: e.__setitem__((3, 1, 1), e[3, 1, 0]), "ids distinct"),
    (lambda e, w: w.__setitem__((2, 0, 0), np.nan), "weights finite"),
    (lambda e, w: w.__setitem__((2, 0, 1), -0.1), "weights >= 0"),
    (lambda e, w: w.__setitem__((2, 0, 1), 5.0), "weights descending"),
])
def test_writer_rejects_bad_rows(tmp_path, damage, match):
    e, w = random_routing()
    damage(e, w)
    with pytest.raises(FlashsimError, match=match):
        write_routing_trace(tmp_path / "r", model="m", n_layers=3, moe_layers=[0, 1, 2], n_experts=8, top_k=2,
                            experts=e, weights=w, phase=np.ones(12, np.uint8), source={"kind": "captured"})
    assert not (tmp_path / "r").exists()


def test_writer_rejects_bad_layout(tmp_path):
    e, w = random_routing()
    kw = dict(model="m", n_experts=8, top_k=2, experts=e, weights=w, phase=np.ones(12, np.uint8))
    with pytest.raises(FlashsimError, match="moe_layers must be strictly increasing"):
        write_routing_trace(tmp_path / "a", n_layers=3, moe_layers=[0, 2, 1], source={"kind": "captured"}, **kw)
    with pytest.raises(FlashsimError, match="source.kind"):
        write_routing_trace(tmp_path / "b", n_layers=3, moe_layers=[0, 1, 2], source={"kind": "made-up"}, **kw)
    with pytest.raises(FlashsimError, match="prefill after a decode"):
        write_routing_trace(tmp_path / "c", n_layers=3, moe_layers=[0, 1, 2], source={"kind": "captured"},
                            **{**kw, "phase": np.r_[np.ones(6), np.zeros(6)].astype(np.uint8)})


def _rewrite(path: Path, name: str, arr: np.ndarray) -> None:
    np.save(path / f"{name}.npy", arr, allow_pickle=False)


def test_reader_checks_checksums_and_values(tmp_path):
    p = make_routing(tmp_path / "r")
    e = np.load(p / "experts.npy")
    e[0, 0, 1] = e[0, 0, 0]
    _rewrite(p, "experts", e)
    with pytest.raises(FlashsimError, match=r"experts.npy: checksum mismatch"):
        open_routing_trace(p)
    with pytest.raises(FlashsimError, match=r"experts.npy: violates rule 'ids distinct': token 0"):
        # re-hash the damaged array: the value rule still catches it
        m = json.loads((p / "manifest.json").read_text())
        from traces.format import sha256_file
        m["files"]["experts"]["sha256"] = sha256_file(p / "experts.npy")
        (p / "manifest.json").write_text(json.dumps(m))
        open_routing_trace(p)


def test_reader_checks_manifest(tmp_path):
    p = make_routing(tmp_path / "r")
    m = json.loads((p / "manifest.json").read_text())
    (p / "manifest.json").write_text(json.dumps({**m, "schema_version": 99}))
    with pytest.raises(FlashsimError, match="schema_version"):
        open_routing_trace(p)
    (p / "manifest.json").write_text(json.dumps({**m, "colour": "red"}))
    with pytest.raises(FlashsimError, match="field 'colour': unknown key"):
        open_routing_trace(p)
    (p / "manifest.json").write_text(json.dumps({**m, "n_tokens": 13}))
    with pytest.raises(FlashsimError, match=r"experts.npy: shape \(12, 3, 2\)"):
        open_routing_trace(p)
    (p / "manifest.json").write_text(json.dumps(m))
    np.save(p / "extra.npy", np.zeros(1), allow_pickle=False)
    with pytest.raises(FlashsimError, match="unexpected file"):
        open_routing_trace(p)


def test_pickled_array_is_refused(tmp_path):
    p = make_routing(tmp_path / "r")
    np.save(p / "phase.npy", np.array([object()] * 12), allow_pickle=True)
    with pytest.raises(FlashsimError, match="phase.npy: unreadable"):
        open_routing_trace(p, verify=False)
