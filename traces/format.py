"""Trace format v1: a directory of memory-mappable .npy arrays plus `manifest.json`.

Layout (L layers, T tokens, N FFN neurons per layer, NB = ceil(N / 8), K stored magnitudes per token):

    manifest.json        schema version, model spec, sparsity rule, prompts, provenance, checksums
    token_ids.npy        int32   [T]        token id of each position
    phase.npy            uint8   [T]        0 = prefill (prompt token), 1 = decode (generated token)
    prompt_index.npy     int32   [T]        index into manifest["prompts"] (each has a task label)
    masks.npy            uint8   [L, T, NB] bitpacked activity (np.packbits, bitorder="little"):
                                            bit n of row (l, t) set <=> neuron n active at token t
    top_idx.npy          uint16/uint32 [L, T, K]  indices of the K largest |a| at (l, t), descending
    top_mag.npy          float16 [L, T, K]  their |a|, descending (re-thresholding reads these)
    abs_sum.npy          float32 [L, T]     sum over ALL N neurons of |a| (the activation-mass
                                            denominator, exact even though only K are stored)

K may be 0 (no magnitudes: e.g. a synthetic trace without them); then the quality proxy counts
active neurons instead of weighing them. Arrays are opened with `mmap_mode="r"` and
`allow_pickle=False`; nothing loads a whole trace to iterate it. `TraceWriter` writes into a hidden
temporary directory next to the target and renames it into place only after every array and the
manifest are complete, so an interrupted write never leaves a valid-looking trace.
"""

from __future__ import annotations

import hashlib
import json
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from devices.errors import FlashsimError
from devices.limits import MAX_TRACE_CELLS, check_memory, check_size
from devices.loading import read_versioned_json, validation_message
from devices.model_spec import ModelSpec
from devices.suggest import sibling_hint
from traces.outputs import (
    check_output_dir,
    os_error_text,
    publish_dir,
    remove_path,
    remove_stale_temporaries,
    temp_name,
)

SCHEMA_VERSION = 1
FORMAT_NAME = "flashsim-trace"
PREFILL, DECODE = 0, 1

ARRAYS = ("token_ids", "phase", "prompt_index", "masks", "top_idx", "top_mag", "abs_sum")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PromptInfo(_Strict):
    """One prompt of the capture: its id, task label and how many tokens it contributed."""

    id: str
    task: str
    text: str = ""
    n_prompt_tokens: int = Field(ge=0)
    n_generated_tokens: int = Field(ge=0)


class SparsityRule(_Strict):
    """How 'active' was decided at capture (or synthesis).

    rule: "relu" (a > 0), "threshold" (|a| >= per-layer threshold calibrated to target_fraction),
    "topk" (the target_fraction * N largest |a| per token), or "synthetic".
    """

    rule: Literal["relu", "threshold", "topk", "synthetic"]
    target_fraction: float | None = Field(default=None, gt=0, le=1)
    thresholds: list[float] | None = None


class FileEntry(_Strict):
    sha256: str
    shape: list[int]
    dtype: str


class TraceManifest(_Strict):
    """The validated contents of manifest.json."""

    format: Literal["flashsim-trace"] = FORMAT_NAME
    schema_version: int
    model: dict[str, Any]                    # ModelSpec.model_dump()
    n_tokens: int = Field(ge=1)
    n_layers: int = Field(ge=1)
    n_neurons: int = Field(ge=1)
    top_k: int = Field(ge=0)
    sparsity: SparsityRule
    prompts: list[PromptInfo]
    synthetic: dict[str, Any] | None = None  # None for captured traces; generator params + fitted stats
    provenance: dict[str, Any] = Field(default_factory=dict)
    files: dict[str, FileEntry]


def sha256_file(path: Path, block: int = 1 << 22) -> str:
    """SHA-256 of a file, streamed (never loads it whole); FlashsimError names the file on EIO."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(block):
                h.update(chunk)
    except OSError as e:
        raise FlashsimError(f"{path}: I/O error while reading ({e.strerror or e}); the file or disk is damaged") from None
    return h.hexdigest()


def check_trace_size(spec: ModelSpec, n_tokens: int, top_k: int = 0) -> None:
    """Refuse a trace too large to write or replay (tokens x layers x neurons above MAX_TRACE_CELLS,
    or one layer's arrays beyond this machine's memory) before anything is allocated."""
    cells = int(n_tokens) * spec.n_layers * spec.d_ff
    check_size(f"the trace's size (tokens x layers x neurons = {n_tokens:,} x {spec.n_layers:,} x {spec.d_ff:,})",
               cells, MAX_TRACE_CELLS, "use fewer --tokens or a smaller model")
    per_layer = int(n_tokens) * (spec.d_ff * 4 + top_k * 6 + 16)   # a layer's float32 work arrays
    check_memory(f"a trace of {n_tokens:,} tokens ({spec.name})", per_layer, "use fewer --tokens")


def index_dtype(n_neurons: int) -> np.dtype:
    return np.dtype(np.uint16) if n_neurons <= np.iinfo(np.uint16).max + 1 else np.dtype(np.uint32)


def expected_arrays(n_layers: int, n_tokens: int, n_neurons: int, top_k: int) -> dict[str, tuple[tuple, np.dtype]]:
    """Shape and dtype of every array for these dimensions (the reader checks against this)."""
    nb = (n_neurons + 7) // 8
    return {
        "token_ids": ((n_tokens,), np.dtype(np.int32)),
        "phase": ((n_tokens,), np.dtype(np.uint8)),
        "prompt_index": ((n_tokens,), np.dtype(np.int32)),
        "masks": ((n_layers, n_tokens, nb), np.dtype(np.uint8)),
        "top_idx": ((n_layers, n_tokens, top_k), index_dtype(n_neurons)),
        "top_mag": ((n_layers, n_tokens, top_k), np.dtype(np.float16)),
        "abs_sum": ((n_layers, n_tokens), np.dtype(np.float32)),
    }


class Trace:
    """A validated, memory-mapped trace. Arrays are read-only views; per-layer access is contiguous."""

    def __init__(self, path: Path, manifest: TraceManifest, arrays: dict[str, np.ndarray]):
        self.path = path
        self.manifest = manifest
        self._a = arrays

    # ---- dimensions and metadata ---------------------------------------------------------------
    @property
    def n_tokens(self) -> int:
        return self.manifest.n_tokens

    @property
    def n_layers(self) -> int:
        return self.manifest.n_layers

    @property
    def n_neurons(self) -> int:
        return self.manifest.n_neurons

    @property
    def top_k(self) -> int:
        return self.manifest.top_k

    @cached_property
    def spec(self) -> ModelSpec:
        return ModelSpec.model_validate(self.manifest.model)

    @property
    def is_synthetic(self) -> bool:
        return self.manifest.synthetic is not None

    @property
    def token_ids(self) -> np.ndarray:
        return self._a["token_ids"]

    @property
    def phase(self) -> np.ndarray:
        return self._a["phase"]

    @property
    def prompt_index(self) -> np.ndarray:
        return self._a["prompt_index"]

    @cached_property
    def task_of_token(self) -> np.ndarray:
        """Task label of every token (object array of str)."""
        tasks = np.array([p.task for p in self.manifest.prompts], dtype=object)
        return tasks[np.asarray(self.prompt_index)]

    # ---- activations ---------------------------------------------------------------------------
    def packed_masks(self, layer: int) -> np.ndarray:
        """uint8 [T, NB] bitpacked activity of one layer (a memory-mapped view)."""
        return self._a["masks"][layer]

    def mask(self, layer: int, tokens: slice | np.ndarray = slice(None)) -> np.ndarray:
        """bool [t, N] activity of one layer for the selected tokens."""
        packed = np.asarray(self._a["masks"][layer][tokens])
        return np.unpackbits(packed, axis=-1, count=self.n_neurons, bitorder="little").astype(bool)

    def top(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """(indices [T, K], |a| float16 [T, K]) of the K strongest neurons per token, descending."""
        return self._a["top_idx"][layer], self._a["top_mag"][layer]

    def abs_sum(self, layer: int) -> np.ndarray:
        """float32 [T]: sum of |a| over all neurons at each token."""
        return self._a["abs_sum"][layer]

    def magnitudes(self, layer: int, tokens: slice | np.ndarray = slice(None)) -> np.ndarray:
        """float32 [t, N]: |a| where stored (the top K), 0 elsewhere."""
        idx = np.asarray(self._a["top_idx"][layer][tokens]).astype(np.int64)
        mag = np.asarray(self._a["top_mag"][layer][tokens]).astype(np.float32)
        out = np.zeros((idx.shape[0], self.n_neurons), np.float32)
        if self.top_k:
            np.put_along_axis(out, idx, mag, axis=1)
        return out

    def __repr__(self) -> str:
        kind = "synthetic" if self.is_synthetic else "captured"
        return (f"Trace({str(self.path)!r}, {kind}, model={self.spec.name}, tokens={self.n_tokens}, "
                f"layers={self.n_layers}, neurons={self.n_neurons}, top_k={self.top_k})")


def _beside(path: Path) -> str:
    """The '; did you mean ...?' tail for the trace folders beside a missing one (a typo, a missing suffix)."""
    parent = path.parent
    if not parent.is_dir():
        return ""
    siblings = [p.name for p in parent.iterdir() if (p / "manifest.json").is_file()]
    suggestion = sibling_hint(str(path), siblings)
    return f"; {suggestion}" if suggestion else ""


def load_listed_arrays(path: Path, mpath: Path, files: dict[str, FileEntry],
                       expected: dict[str, tuple[tuple, np.dtype]], verify: bool, remedy: str) -> dict[str, np.ndarray]:
    """The arrays a manifest lists (`files`), memory-mapped: exactly the `expected` names, no stray .npy
    in the folder, each with its expected shape and dtype and (with `verify`) its checksum; FlashsimError
    names the file and what to do (`remedy`) otherwise. Shared by dense and routing traces."""
    extra = set(files) - set(expected)
    if extra:
        raise FlashsimError(f"{mpath}: field 'files': unexpected array(s) {sorted(extra)}")
    stray = {p.name for p in path.glob("*.npy")} - {f"{n}.npy" for n in expected}
    if stray:
        raise FlashsimError(f"{path}: unexpected file(s) {sorted(stray)}; the trace directory was modified")
    arrays: dict[str, np.ndarray] = {}
    for name, (shape, dtype) in expected.items():
        f = path / f"{name}.npy"
        if name not in files:
            raise FlashsimError(f"{mpath}: field 'files.{name}': required array is not listed")
        if not f.is_file():
            raise FlashsimError(f"{f}: missing array file")
        try:
            arr = np.load(f, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise FlashsimError(f"{f}: unreadable or truncated .npy ({e})") from None
        if arr.shape != shape or arr.dtype != dtype:
            raise FlashsimError(f"{f}: shape {arr.shape} dtype {arr.dtype}, expected {shape} {dtype} from the manifest")
        if verify and sha256_file(f) != files[name].sha256:
            raise FlashsimError(f"{f}: checksum mismatch (the file changed after it was written); {remedy}")
        arrays[name] = arr
    return arrays


def open_trace(path: str | Path, verify: bool = True) -> Trace:
    """Open and validate a trace directory; FlashsimError names the file and the field.

    verify=True checks every array's SHA-256 (streamed; nothing is loaded whole) and scans the
    magnitudes for NaN layer by layer.
    """
    path = Path(path)
    mpath = path / "manifest.json"
    if not path.is_dir():
        raise FlashsimError(f"{path}: not a trace directory (no such directory)" + _beside(path))
    if not mpath.is_file():
        raise FlashsimError(f"{path}: not a trace directory (manifest.json is missing)")
    raw = read_versioned_json(mpath, FORMAT_NAME, SCHEMA_VERSION, kind="trace manifest",
                              remedy="re-capture or convert the trace")
    try:
        manifest = TraceManifest.model_validate(raw)
    except ValidationError as e:
        raise FlashsimError(f"{mpath}: {validation_message(e)}") from None
    try:
        spec = ModelSpec.model_validate(manifest.model)
    except ValidationError as e:
        raise FlashsimError(f"{mpath}: model: {validation_message(e)}") from None
    if spec.n_layers != manifest.n_layers or spec.d_ff != manifest.n_neurons:
        raise FlashsimError(
            f"{mpath}: field 'n_layers'/'n_neurons': trace has {manifest.n_layers} layers x "
            f"{manifest.n_neurons} neurons but its model {spec.name} has {spec.n_layers} x {spec.d_ff}"
        )
    expected = expected_arrays(manifest.n_layers, manifest.n_tokens, manifest.n_neurons, manifest.top_k)
    arrays = load_listed_arrays(path, mpath, manifest.files, expected, verify, "re-capture it")
    if verify:
        _check_values(path, manifest, arrays)
    return Trace(path, manifest, arrays)


def _check_values(path: Path, m: TraceManifest, a: dict[str, np.ndarray]) -> None:
    from traces.checks import check_trace  # the semantic rules (vectorised, one layer at a time)

    check_trace(path, m, a)


# Memory a simulated run holds per (token x layer x neuron) of the trace it replays: the per-layer
# activation sets, their union/intersection caches and the plan arrays. Measured here with
# `flashsim plan` (128 tokens, 1536 neurons, peak RSS): 0.67 MB per layer at 500 and at 2000 layers,
# i.e. 3.4 bytes per cell; 3 is the floor used to refuse a run that cannot fit, before it starts.
RUN_BYTES_PER_CELL = 3


def check_run_memory(n_tokens: int, n_layers: int, n_neurons: int, what: str) -> None:
    """Refuse a simulated run whose trace cells (tokens x layers x neurons) need more memory than
    this machine has available, before anything is allocated; the error names the sizes."""
    cells = int(n_tokens) * int(n_layers) * int(n_neurons)
    check_memory(f"{what}: {n_tokens:,} tokens x {n_layers:,} layers x {n_neurons:,} neurons "
                 f"({cells:,} cells at {RUN_BYTES_PER_CELL} B each)", cells * RUN_BYTES_PER_CELL,
                 "use fewer tokens or a model with fewer layers/neurons")


class TraceWriter:
    """Writes a trace atomically: arrays are memory-mapped files in a temporary sibling directory,
    filled in any order (per token or per layer), then checksummed and renamed into place.

        with TraceWriter(out, spec, n_tokens, top_k, sparsity, prompts) as w:
            w.token_ids[:] = ...; w.phase[:] = ...; w.prompt_index[:] = ...
            w.masks[layer, t0:t1] = np.packbits(active, axis=-1, bitorder="little")
            w.top_idx[...], w.top_mag[...], w.abs_sum[...] = ...
        # on a clean exit: manifest written, directory renamed to `out`; on an exception: removed
    """

    def __init__(self, out: str | Path, spec: ModelSpec, n_tokens: int, top_k: int,
                 sparsity: SparsityRule, prompts: list[PromptInfo], *, synthetic: dict | None = None,
                 provenance: dict | None = None, overwrite: bool = False):
        self.out = Path(out)
        if n_tokens < 1:
            raise FlashsimError("a trace needs at least one token")
        check_trace_size(spec, n_tokens, top_k)
        check_output_dir(self.out, "--out", overwrite)
        if not 0 <= top_k <= spec.d_ff:
            raise FlashsimError(f"top_k must be in [0, {spec.d_ff}], got {top_k}")
        self.spec, self.n_tokens, self.top_k = spec, n_tokens, top_k
        self.sparsity, self.prompts = sparsity, prompts
        self.synthetic, self.provenance = synthetic, provenance or {}
        self.overwrite = overwrite
        self.out.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(self.out)      # of a writer killed before it renamed its work
        self.tmp = temp_name(self.out)
        self.tmp.mkdir()
        shapes = expected_arrays(spec.n_layers, n_tokens, spec.d_ff, top_k)
        try:
            self._arrays = {
                name: np.lib.format.open_memmap(self.tmp / f"{name}.npy", mode="w+", dtype=dtype, shape=shape)
                for name, (shape, dtype) in shapes.items()
            }
        except OSError as e:
            self.abort()
            raise FlashsimError(f"{self.out}: cannot write the trace ({os_error_text(e)})") from None

    def __getattr__(self, name: str) -> np.ndarray:
        arrays = self.__dict__.get("_arrays", {})
        if name in arrays:
            return arrays[name]
        raise AttributeError(name)

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()

    def abort(self) -> None:
        self._arrays = {}
        remove_path(self.tmp)

    def commit(self) -> Path:
        """Flush, checksum, write the manifest, rename into place. Returns the trace path."""
        try:
            return self._commit()
        except OSError as e:
            self.abort()
            raise FlashsimError(f"{self.out}: cannot write the trace ({os_error_text(e)})") from None

    def _commit(self) -> Path:
        files = {}
        for name, arr in self._arrays.items():
            arr.flush()
            files[name] = {"sha256": "", "shape": list(arr.shape), "dtype": str(arr.dtype)}
        self._arrays = {}  # close the memmaps before hashing and renaming
        for name in files:
            files[name]["sha256"] = sha256_file(self.tmp / f"{name}.npy")
        manifest = TraceManifest(
            schema_version=SCHEMA_VERSION, model=self.spec.model_dump(mode="json"), n_tokens=self.n_tokens,
            n_layers=self.spec.n_layers, n_neurons=self.spec.d_ff, top_k=self.top_k, sparsity=self.sparsity,
            prompts=self.prompts, synthetic=self.synthetic, provenance=self.provenance,
            files={k: FileEntry(**v) for k, v in files.items()},
        )
        (self.tmp / "manifest.json").write_text(json.dumps(manifest.model_dump(mode="json"), indent=1))
        publish_dir(self.tmp, self.out, self.overwrite, "trace")
        return self.out


def pack_mask(active: np.ndarray) -> np.ndarray:
    """bool [..., N] -> uint8 [..., ceil(N/8)] in the trace's bit order."""
    return np.packbits(active, axis=-1, bitorder="little")


def top_k_of(abs_act: np.ndarray, k: int, n_neurons: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices (descending |a|) and float16 magnitudes of the k largest entries per row."""
    if k == 0:
        return np.zeros(abs_act.shape[:-1] + (0,), index_dtype(n_neurons)), np.zeros(abs_act.shape[:-1] + (0,), np.float16)
    part = np.argpartition(-abs_act, k - 1, axis=-1)[..., :k]
    vals = np.take_along_axis(abs_act, part, axis=-1)
    order = np.argsort(-vals, axis=-1, kind="stable")
    idx = np.take_along_axis(part, order, axis=-1)
    return idx.astype(index_dtype(n_neurons)), np.take_along_axis(vals, order, axis=-1).astype(np.float16)
