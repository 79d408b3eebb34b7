"""Routing trace format v1: which routed experts each token used, per MoE layer, and their weights.

A routing trace is a directory (T tokens, M stored MoE layers, K experts per token and layer):

    manifest.json     format, schema version, kind "routing", model name, layer map, provenance, checksums
    experts.npy       int16   [T, M, K]  expert ids of the layer, distinct within a row, ordered by
                                         router weight descending (the order the model ranks them)
    weights.npy       float32 [T, M, K]  router weights as the model applies them to the expert outputs
                                         (after its own normalisation: Mixtral renormalises the top-k
                                         softmax, Qwen2-MoE does not); >= 0, finite, descending
    phase.npy         uint8   [T]        0 = prefill (prompt token), 1 = decode (generated token)
    sequence.npy      int32   [T]        index of the sequence (prompt) each token belongs to, non-
                                         decreasing; routing-locality metrics never span two sequences

`moe_layers[m]` is the model-layer index of stored layer m (dense layers of a hybrid model are not
stored). A trace whose source recorded no weights stores 1/K and says so in `source["weights"]`.

Arrays are loaded with `allow_pickle=False` and memory-mapped; the writer fills a hidden temporary
sibling and renames it into place (traces/outputs.py `publish_dir`), so an interrupted write never
leaves a valid-looking trace. `open_routing_trace` checks version, shapes, dtypes, id range,
distinctness, weight order, phase values and checksums, and raises FlashsimError naming the file and
the field or rule.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from devices.errors import FlashsimError
from devices.limits import MAX_ROUTING_CELLS, check_memory, check_size
from devices.loading import read_versioned_json, validation_message
from traces.format import FileEntry, load_listed_arrays, sha256_file
from traces.outputs import check_output_dir, publish_dir, remove_stale_temporaries, temp_name

ROUTING_SCHEMA_VERSION = 1
ROUTING_FORMAT = "flashsim-routing-trace"
PREFILL, DECODE = 0, 1
MAX_EXPERTS = int(np.iinfo(np.int16).max) + 1      # ids are int16
SOURCE_KINDS = ("captured", "imported", "synthetic")
WEIGHT_ORDER_TOL = 1e-6                            # float32 ties reordered by a stable sort


class RoutingManifest(BaseModel):
    """The validated contents of a routing trace's manifest.json."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["flashsim-routing-trace"] = ROUTING_FORMAT
    schema_version: int
    kind: Literal["routing"] = "routing"
    model: str = Field(min_length=1)
    n_layers: int = Field(ge=1, le=10_000)
    moe_layers: list[int] = Field(min_length=1)
    n_experts: int = Field(ge=1, le=MAX_EXPERTS)
    top_k: int = Field(ge=1)
    n_tokens: int = Field(ge=1)
    source: dict[str, Any]
    files: dict[str, FileEntry]

    @model_validator(mode="after")
    def _layout(self) -> RoutingManifest:
        ml = self.moe_layers
        if any(b <= a for a, b in zip(ml, ml[1:])) or ml[0] < 0 or ml[-1] >= self.n_layers:
            raise ValueError(f"moe_layers must be strictly increasing model-layer indices in "
                             f"[0, {self.n_layers}), got {ml[:8]}{'...' if len(ml) > 8 else ''}")
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k ({self.top_k}) must be <= n_experts ({self.n_experts})")
        kind = self.source.get("kind")
        if kind not in SOURCE_KINDS:
            raise ValueError(f"source.kind must be one of {SOURCE_KINDS}, got {kind!r}")
        return self


@dataclass(frozen=True)
class RoutingTrace:
    """An opened routing trace: arrays are read-only (memory-mapped when opened from disk)."""

    path: Path | None
    manifest: RoutingManifest
    experts: np.ndarray     # int16 [T, M, K]
    weights: np.ndarray     # float32 [T, M, K]
    phase: np.ndarray       # uint8 [T]
    sequence: np.ndarray | None = None    # int32 [T]; None = one sequence

    @property
    def n_tokens(self) -> int:
        return self.manifest.n_tokens

    @property
    def n_moe_layers(self) -> int:
        return len(self.manifest.moe_layers)

    @property
    def n_experts(self) -> int:
        return self.manifest.n_experts

    @property
    def top_k(self) -> int:
        return self.manifest.top_k

    def sequence_ids(self) -> np.ndarray:
        """int32 [T]: the sequence of every token (zeros when the trace has one sequence)."""
        return np.zeros(self.n_tokens, np.int32) if self.sequence is None else np.asarray(self.sequence)

    def __repr__(self) -> str:
        return (f"RoutingTrace({str(self.path)!r}, {self.manifest.source.get('kind')}, model={self.manifest.model}, "
                f"tokens={self.n_tokens}, moe_layers={self.n_moe_layers}, experts={self.n_experts}, "
                f"top_k={self.top_k})")


def expected_routing_arrays(n_tokens: int, n_moe: int, top_k: int) -> dict[str, tuple[tuple, np.dtype]]:
    """Shape and dtype of every array of a routing trace of these dimensions."""
    return {
        "experts": ((n_tokens, n_moe, top_k), np.dtype(np.int16)),
        "weights": ((n_tokens, n_moe, top_k), np.dtype(np.float32)),
        "phase": ((n_tokens,), np.dtype(np.uint8)),
        "sequence": ((n_tokens,), np.dtype(np.int32)),
    }


def check_routing_size(n_tokens: int, n_moe: int, top_k: int) -> None:
    """Refuse a routing trace too large to write or replay before anything is allocated."""
    cells = int(n_tokens) * int(n_moe) * int(top_k)
    check_size(f"the routing trace's size (tokens x MoE layers x top-k = {n_tokens:,} x {n_moe:,} x {top_k:,})",
               cells, MAX_ROUTING_CELLS, "use fewer tokens")
    check_memory(f"a routing trace of {n_tokens:,} tokens", cells * 6, "use fewer tokens")


def _fail(path: Path | None, array: str, rule: str, detail: str) -> None:
    where = f"{path / (array + '.npy')}" if path is not None else f"{array}"
    raise FlashsimError(f"{where}: violates rule '{rule}': {detail}; the routing trace is inconsistent")


def _at(bad: np.ndarray) -> str:
    t, *rest = np.unravel_index(int(np.flatnonzero(bad.reshape(-1))[0]), bad.shape)
    return f"token {t}" + (f", stored MoE layer {rest[0]}" if rest else "")


def check_routing_arrays(path: Path | None, n_experts: int, experts: np.ndarray, weights: np.ndarray,
                         phase: np.ndarray, sequence: np.ndarray) -> None:
    """The semantic rules every routing trace obeys (vectorised; names used in messages):
    `ids in range`, `ids distinct`, `weights finite`, `weights >= 0`, `weights descending`,
    `phase values`, `sequence non-decreasing`, `prefill before decode` (within a sequence)."""
    e = np.asarray(experts)
    if np.any((e < 0) | (e >= n_experts)):
        _fail(path, "experts", "ids in range", f"{_at((e < 0) | (e >= n_experts))} names an expert outside "
              f"[0, {n_experts})")
    if e.shape[-1] > 1:
        s = np.sort(e, axis=-1)
        dup = (s[..., 1:] == s[..., :-1]).any(axis=-1)
        if np.any(dup):
            _fail(path, "experts", "ids distinct", f"{_at(dup)} selects one expert twice")
    w = np.asarray(weights)
    if not np.all(np.isfinite(w)):
        _fail(path, "weights", "weights finite", f"{_at(~np.isfinite(w).all(axis=-1))} has NaN or infinity")
    if np.any(w < 0):
        _fail(path, "weights", "weights >= 0", f"{_at((w < 0).any(axis=-1))} has a negative router weight")
    if w.shape[-1] > 1:
        up = (w[..., 1:] > w[..., :-1] * (1 + WEIGHT_ORDER_TOL) + 1e-30).any(axis=-1)
        if np.any(up):
            _fail(path, "weights", "weights descending", f"{_at(up)}: experts must be ordered by weight, largest first")
    p = np.asarray(phase)
    if np.any(p > DECODE):
        _fail(path, "phase", "phase values", f"{_at(p > DECODE)}: 0 (prefill) or 1 (decode)")
    q = np.asarray(sequence)
    if q.size and (q[0] < 0 or np.any(q[1:] < q[:-1])):
        _fail(path, "sequence", "sequence non-decreasing", "tokens of one sequence must be contiguous, in order")
    back = (q[1:] == q[:-1]) & (p[1:] < p[:-1])
    if np.any(back):
        _fail(path, "phase", "prefill before decode", f"token {int(np.flatnonzero(back)[0]) + 1} is prefill "
              "after a decode token of its sequence")


def write_routing_trace(out_dir: str | Path, *, model: str, n_layers: int, moe_layers, n_experts: int, top_k: int,
                        experts: np.ndarray, weights: np.ndarray, phase: np.ndarray, source: dict[str, Any],
                        sequence: np.ndarray | None = None, overwrite: bool = False) -> Path:
    """Validate and write a routing trace atomically; returns its path.

    experts int [T, M, K] and weights float [T, M, K] (cast to int16 / float32), phase [T] 0/1,
    sequence [T] (default: one sequence). FlashsimError on any rule of `check_routing_arrays`."""
    out = Path(out_dir)
    experts, weights = np.asarray(experts), np.asarray(weights)
    if experts.ndim != 3 or weights.shape != experts.shape:
        raise FlashsimError(f"experts and weights must both be [tokens, MoE layers, top_k], got "
                            f"{experts.shape} and {weights.shape}")
    T, M, K = experts.shape
    if T < 1:
        raise FlashsimError("a routing trace needs at least one token")
    check_routing_size(T, M, K)
    check_output_dir(out, "--out", overwrite, kind="routing trace")
    seq = np.zeros(T, np.int32) if sequence is None else np.asarray(sequence)
    phase = np.asarray(phase)
    for name, a in (("phase", phase), ("sequence", seq)):
        if a.shape != (T,):
            raise FlashsimError(f"{name} must have one entry per token ({T}), got shape {a.shape}")
    if not 1 <= n_experts <= MAX_EXPERTS:
        raise FlashsimError(f"n_experts must be in [1, {MAX_EXPERTS}], got {n_experts}")
    check_routing_arrays(None, n_experts, experts, weights.astype(np.float32), phase, seq)
    arrays = {"experts": experts.astype(np.int16), "weights": weights.astype(np.float32),
              "phase": phase.astype(np.uint8), "sequence": seq.astype(np.int32)}
    files = {n: {"sha256": "", "shape": list(a.shape), "dtype": str(a.dtype)} for n, a in arrays.items()}
    try:
        manifest = RoutingManifest(schema_version=ROUTING_SCHEMA_VERSION, model=model, n_layers=n_layers,
                                   moe_layers=[int(x) for x in moe_layers], n_experts=n_experts, top_k=K,
                                   n_tokens=T, source=source, files=files)
    except ValidationError as e:
        raise FlashsimError(f"routing trace {out}: {validation_message(e)}") from None
    if top_k != K or len(manifest.moe_layers) != M:
        raise FlashsimError(f"routing trace {out}: arrays are [T={T}, M={M}, K={K}] but top_k={top_k} and "
                            f"{len(manifest.moe_layers)} moe_layers were given")
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out)
    tmp = temp_name(out)
    tmp.mkdir()
    try:
        for name, a in arrays.items():
            np.save(tmp / f"{name}.npy", np.ascontiguousarray(a), allow_pickle=False)
            files[name]["sha256"] = sha256_file(tmp / f"{name}.npy")
        manifest = manifest.model_copy(update={"files": {k: FileEntry(**v) for k, v in files.items()}})
        (tmp / "manifest.json").write_text(json.dumps(manifest.model_dump(mode="json"), indent=1))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    publish_dir(tmp, out, overwrite, "routing trace")
    return out


def open_routing_trace(path: str | Path, verify: bool = True) -> RoutingTrace:
    """Open and validate a routing trace directory; FlashsimError names the file and the field.
    verify=True also checks every array's SHA-256 and the value rules (ids, weights, phase)."""
    path = Path(path)
    mpath = path / "manifest.json"
    if not path.is_dir():
        raise FlashsimError(f"{path}: not a routing trace directory (no such directory)")
    if not mpath.is_file():
        raise FlashsimError(f"{path}: not a routing trace directory (manifest.json is missing)")
    raw = read_versioned_json(mpath, ROUTING_FORMAT, ROUTING_SCHEMA_VERSION, kind="routing trace manifest",
                              remedy="re-capture, re-import or re-synthesise the trace")
    try:
        m = RoutingManifest.model_validate(raw)
    except ValidationError as e:
        raise FlashsimError(f"{mpath}: {validation_message(e)}") from None
    expected = expected_routing_arrays(m.n_tokens, len(m.moe_layers), m.top_k)
    arrays = load_listed_arrays(path, mpath, m.files, expected, verify, "re-create the trace")
    if verify:
        check_routing_arrays(path, m.n_experts, arrays["experts"], arrays["weights"], arrays["phase"],
                             arrays["sequence"])
    return RoutingTrace(path, m, arrays["experts"], arrays["weights"], arrays["phase"], arrays["sequence"])


def is_routing_trace(path: str | Path) -> bool:
    """True when `path` is a directory whose manifest.json says kind "routing" (no other check)."""
    mpath = Path(path) / "manifest.json"
    try:
        data = json.loads(mpath.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("kind") == "routing"


def order_by_weight(experts: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sort each [..., K] row by weight descending (stable), as the format stores them."""
    order = np.argsort(-np.asarray(weights, np.float32), axis=-1, kind="stable")
    return np.take_along_axis(np.asarray(experts), order, -1), np.take_along_axis(np.asarray(weights, np.float32), order, -1)
