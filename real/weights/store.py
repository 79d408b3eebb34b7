"""The weight store: FFN neurons on disk in a flash layout, resident tensors, and its manifest.

A store is a directory (sizes in bytes; every FFN region starts on a 4 KiB boundary):

    manifest.json          format, schema version, model spec, dtype, layouts, per-layer files and
                           offsets, read-unit sizes, neuron order, SHA-256 of every file
    order.npy              int32 [L, N]: slot -> neuron id (row p of layer l holds neuron order[l, p])
    resident.safetensors   attention, norms, embeddings, lm_head, FFN biases (HF tensor names)
    ffn/layer_LLL.bundled.bin     (file_mode "per-layer"; "single" puts every layer in ffn/bundled.bin)
    ffn/layer_LLL.unbundled.bin

Layouts of one layer's FFN (N neurons, d = d_model, e = bytes per element, segments = gate, up,
down for gated FFNs; up, down otherwise):
* **bundled**: slot p holds neuron order[l, p]'s bundle = gate row | up row | down column
  (3*d*e bytes; 2*d*e ungated): one read fetches a whole neuron.
* **unbundled**: one region per matrix (gate rows, then up rows, then down columns), each
  N rows of d*e bytes: a neuron costs one read per matrix. This is also the dense layout the mmap
  baseline computes over.

Alignment (`alignment`): **padded** rounds every unit (bundle or row) up to a 4 KiB stride, so any
run of adjacent units is one aligned O_DIRECT read that can land straight in the neuron cache (no
copy), at the price of the padding bytes on disk, on the wire and in the cache (SmolLM2 fp16:
3456 -> 4096 B, 18.5%; Llama-2-7B fp16: 24576 B, already aligned, 0%). **packed** stores units back to
back (only each region is 4 KiB aligned): no padding, but a read must be widened to 4 KiB
boundaries (an isolated SmolLM2 bundle costs 4096 or 8192 B instead of 3456) and lands in a
staging buffer first. Padded is the default: sparse FFNs read mostly short runs, where padded
reads fewer device pages and skips the copy; packed wins only for long runs of small units.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from devices.errors import FlashsimError
from devices.loading import read_versioned_json, validation_message
from devices.model_spec import ModelSpec
from real.io.buffers import ALIGN_BYTES, round_up
from real.weights.dtypes import ELEMENT_BYTES, decode
from traces.format import sha256_file  # noqa: F401  (re-exported: real.weights.convert, real.weights.store_writer)

FORMAT_NAME = "flashsim-store"
SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
ORDER_FILE = "order.npy"
RESIDENT_FILE = "resident.safetensors"
LAYOUTS = ("bundled", "unbundled")
Layout = Literal["bundled", "unbundled"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LayoutInfo(_Strict):
    """Read-unit sizes of one layout: a bundle (bundled) or one matrix row (unbundled)."""

    unit_bytes: int = Field(gt=0, description="useful bytes of one unit")
    stride_bytes: int = Field(gt=0, description="distance between consecutive units on disk")
    region_bytes: int = Field(gt=0, description="one region (bundled: a layer; unbundled: a matrix), 4 KiB multiple")
    regions_per_layer: int = Field(ge=1)


class LayerEntry(_Strict):
    """Where one layer of one layout lives."""

    file: str
    offset_bytes: int = Field(ge=0)
    region_offsets_bytes: list[int]


class FileInfo(_Strict):
    bytes: int = Field(ge=0)
    sha256: str


class OrderInfo(_Strict):
    kind: Literal["original", "hot-first"]
    file: str = ORDER_FILE
    profile: str | None = None
    profile_sha256: str | None = None
    ranking: str | None = None


class ResidentInfo(_Strict):
    file: str = RESIDENT_FILE
    complete: bool
    tensors: int = Field(ge=0)
    note: str = ""


class StoreManifest(_Strict):
    """The validated contents of manifest.json."""

    format: Literal["flashsim-store"] = FORMAT_NAME
    schema_version: int
    mode: Literal["model", "shape"]
    model: dict[str, Any]
    dtype: Literal["fp32", "fp16", "bf16"]
    element_bytes: int
    segments: list[str]
    alignment: Literal["padded", "packed"]
    align_bytes: int
    file_mode: Literal["per-layer", "single"]
    layouts: dict[str, LayoutInfo]
    layers: list[dict[str, LayerEntry]]
    order: OrderInfo
    resident: ResidentInfo
    source: dict[str, Any] = Field(default_factory=dict)
    files: dict[str, FileInfo]


# ---- layout arithmetic (shared by the writer and the verifier) ---------------------------------------
def segments_of(spec: ModelSpec) -> list[str]:
    return ["gate", "up", "down"] if spec.gated else ["up", "down"]


def plan_layout(spec: ModelSpec, dtype: str, layouts: list[str], alignment: str,
                file_mode: str) -> tuple[dict[str, LayoutInfo], list[dict[str, LayerEntry]], dict[str, int]]:
    """Unit sizes, per-layer entries and FFN file sizes for a store of `spec` at `dtype`."""
    seg_bytes = spec.d_model * ELEMENT_BYTES[dtype]
    n_seg = len(segments_of(spec))
    N = spec.d_ff
    infos: dict[str, LayoutInfo] = {}
    for lay in layouts:
        unit = seg_bytes * n_seg if lay == "bundled" else seg_bytes
        stride = round_up(unit) if alignment == "padded" else unit
        regions = 1 if lay == "bundled" else n_seg
        infos[lay] = LayoutInfo(unit_bytes=unit, stride_bytes=stride,
                                region_bytes=round_up(N * stride), regions_per_layer=regions)
    entries: list[dict[str, LayerEntry]] = []
    sizes: dict[str, int] = {}
    for layer in range(spec.n_layers):
        row: dict[str, LayerEntry] = {}
        for lay, info in infos.items():
            layer_bytes = info.region_bytes * info.regions_per_layer
            name = f"ffn/layer_{layer:03d}.{lay}.bin" if file_mode == "per-layer" else f"ffn/{lay}.bin"
            base = sizes.get(name, 0)
            row[lay] = LayerEntry(file=name, offset_bytes=base,
                                  region_offsets_bytes=[base + r * info.region_bytes for r in range(info.regions_per_layer)])
            sizes[name] = base + layer_bytes
        entries.append(row)
    return infos, entries, sizes


# ---- the store ------------------------------------------------------------------------------------------
class WeightStore:
    """An opened, validated store. Offsets are absolute byte offsets in the layer's file."""

    def __init__(self, path: Path, manifest: StoreManifest, neuron_at: np.ndarray):
        self.path = path
        self.manifest = manifest
        self.neuron_at = neuron_at                      # int32 [L, N]: slot -> neuron
        self.position = np.argsort(neuron_at, axis=1).astype(np.int32)  # neuron -> slot

    @cached_property
    def spec(self) -> ModelSpec:
        return ModelSpec.model_validate(self.manifest.model)

    @property
    def dtype(self) -> str:
        return self.manifest.dtype

    @property
    def n_layers(self) -> int:
        return len(self.manifest.layers)

    @property
    def n_neurons(self) -> int:
        return int(self.neuron_at.shape[1])

    @property
    def d_model(self) -> int:
        return self.spec.d_model

    @property
    def segments(self) -> list[str]:
        return list(self.manifest.segments)

    @property
    def segment_bytes(self) -> int:
        """One matrix row (or column) of one neuron."""
        return self.d_model * self.manifest.element_bytes

    @property
    def bundle_bytes(self) -> int:
        """All of one neuron's rows: the unit a cache row holds, whatever the layout on disk."""
        return self.segment_bytes * len(self.segments)

    @property
    def layouts(self) -> list[str]:
        return list(self.manifest.layouts)

    def layout(self, name: str) -> LayoutInfo:
        if name not in self.manifest.layouts:
            raise FlashsimError(f"{self.path}: the store has no {name!r} layout (it has "
                                f"{', '.join(self.layouts)}); convert with --layout {name} or both")
        return self.manifest.layouts[name]

    def entry(self, layer: int, layout: str) -> LayerEntry:
        self.layout(layout)
        if not 0 <= layer < self.n_layers:
            raise FlashsimError(f"layer {layer} is out of range: the store has {self.n_layers} layers")
        return self.manifest.layers[layer][layout]

    def file_path(self, layer: int, layout: str) -> Path:
        return self.path / self.entry(layer, layout).file

    def unit_offsets(self, layer: int, neuron_ids: np.ndarray, layout: str = "bundled",
                     region: int = 0) -> np.ndarray:
        """int64 absolute file offsets of the neurons' units (bundles, or rows of one region)."""
        ids = np.asarray(neuron_ids, dtype=np.int64)
        slots = self.position[layer][ids].astype(np.int64)
        e, info = self.entry(layer, layout), self.layout(layout)
        return e.region_offsets_bytes[region] + slots * info.stride_bytes

    def sort_by_position(self, layer: int, neuron_ids: np.ndarray) -> np.ndarray:
        """The neuron ids reordered by their place on disk (reads of sorted ids coalesce best)."""
        ids = np.asarray(neuron_ids, dtype=np.int64)
        return ids[np.argsort(self.position[layer][ids], kind="stable")]

    # ---- simple buffered access (tests, verification, dense references) --------------------------
    def read_bundles(self, layer: int, neuron_ids: np.ndarray, layout: str | None = None) -> np.ndarray:
        """uint8 [k, bundle_bytes]: the neurons' bundles by plain buffered reads (no direct I/O),
        from `layout` (default: the store's first layout)."""
        ids = np.asarray(neuron_ids, dtype=np.int64)
        layout = layout or self.layouts[0]
        out = np.empty((len(ids), self.bundle_bytes), np.uint8)
        info = self.layout(layout)
        with open(self.file_path(layer, layout), "rb", buffering=0) as f:
            for r in range(info.regions_per_layer):
                offs = self.unit_offsets(layer, ids, layout, r)
                col = r * self.segment_bytes
                for i, off in enumerate(offs.tolist()):
                    f.seek(off)
                    data = f.read(info.unit_bytes)
                    if len(data) != info.unit_bytes:
                        raise FlashsimError(f"{f.name}: short read at offset {off} ({len(data)} of {info.unit_bytes} bytes)")
                    out[i, col: col + info.unit_bytes] = np.frombuffer(data, np.uint8)
        return out

    def matrix(self, layer: int, segment: str) -> np.ndarray:
        """fp32 [N, d] of one segment (gate/up rows, down columns) in ORIGINAL neuron order."""
        k = self.segments.index(segment)
        raw = self.read_bundles(layer, np.arange(self.n_neurons), self.layouts[0])
        seg = raw[:, k * self.segment_bytes: (k + 1) * self.segment_bytes]
        return decode(seg, self.dtype).reshape(self.n_neurons, self.d_model)

    def resident_path(self) -> Path:
        return self.path / self.manifest.resident.file

    def summary(self) -> dict[str, Any]:
        m = self.manifest
        return {
            "path": str(self.path), "mode": m.mode, "model": self.spec.name, "dtype": m.dtype,
            "n_layers": self.n_layers, "n_neurons": self.n_neurons, "d_model": self.d_model,
            "segments": m.segments, "alignment": m.alignment, "file_mode": m.file_mode,
            "order": m.order.kind, "bundle_bytes": self.bundle_bytes,
            "layouts": {k: v.model_dump() for k, v in m.layouts.items()},
            "ffn_file_bytes": sum(f.bytes for n, f in m.files.items() if n.startswith("ffn/")),
            "total_file_bytes": sum(f.bytes for f in m.files.values()),
            "resident_complete": m.resident.complete,
        }


def open_store(path: str | Path, verify: Literal["full", "sizes", "record"] = "sizes") -> WeightStore:
    """Open and validate a store. "sizes" checks the manifest, every file's presence, size and
    alignment and the neuron order; "full" also checks every file's SHA-256 (reads everything);
    "record" (what runs use) does the full check only when the store's verified-once record is
    missing or any file changed since (real/weights/store_integrity.py), so a run never reads a changed byte."""
    path = Path(path)
    man_path = path / MANIFEST
    if not path.is_dir():
        raise FlashsimError(f"{path}: no such weight store directory (create one with `flashsim real convert`)")
    if not man_path.is_file():
        raise FlashsimError(f"{path}: no {MANIFEST}; not a flashsim weight store (create one with `flashsim real convert`)")
    data = read_versioned_json(man_path, FORMAT_NAME, SCHEMA_VERSION, kind="weight store",
                               remedy="re-create the store with `flashsim real convert`")
    try:
        m = StoreManifest.model_validate(data)
        spec = ModelSpec.model_validate(m.model)
    except ValidationError as e:
        raise FlashsimError(f"{man_path}: {validation_message(e)}") from None
    _check_layout(man_path, m, spec)
    _check_confined(path, man_path, m)
    _check_files(path, m)
    if verify in ("full", "record"):
        from real.weights.store_integrity import record_matches, verify_store

        if verify == "full" or not record_matches(path, list(m.files)):
            verify_store(path, {name: info.sha256 for name, info in m.files.items()})
    neuron_at = _load_order(path, m, spec)
    return WeightStore(path, m, neuron_at)


def _check_layout(man_path: Path, m: StoreManifest, spec: ModelSpec) -> None:
    """The manifest's offsets must be exactly what this flashsim would write (aligned, in range)."""
    if m.align_bytes != ALIGN_BYTES or m.element_bytes != ELEMENT_BYTES[m.dtype]:
        raise FlashsimError(f"{man_path}: field 'align_bytes'/'element_bytes' do not match dtype {m.dtype} and 4 KiB alignment")
    if not m.layouts or set(m.layouts) - set(LAYOUTS):
        raise FlashsimError(f"{man_path}: field 'layouts': expected some of {', '.join(LAYOUTS)}")
    if m.segments != segments_of(spec):
        raise FlashsimError(f"{man_path}: field 'segments': {m.segments} does not match ffn_kind {spec.ffn_kind}")
    infos, entries, sizes = plan_layout(spec, m.dtype, list(m.layouts), m.alignment, m.file_mode)
    for name, info in infos.items():
        if m.layouts[name] != info:
            raise FlashsimError(f"{man_path}: field 'layouts.{name}': {m.layouts[name].model_dump()} does not "
                                f"match the model's shape ({info.model_dump()})")
    if len(m.layers) != spec.n_layers:
        raise FlashsimError(f"{man_path}: field 'layers': {len(m.layers)} entries for {spec.n_layers} layers")
    for layer, (got, want) in enumerate(zip(m.layers, entries)):
        for lay in want:
            e = got.get(lay)
            if e is None:
                raise FlashsimError(f"{man_path}: field 'layers.{layer}.{lay}' is missing")
            if any(o % ALIGN_BYTES for o in (e.offset_bytes, *e.region_offsets_bytes)):
                raise FlashsimError(f"{man_path}: field 'layers.{layer}.{lay}': offset not aligned to {ALIGN_BYTES} bytes")
            if e != want[lay]:
                raise FlashsimError(f"{man_path}: field 'layers.{layer}.{lay}': {e.model_dump()} does not match the layout")
    for name, size in sizes.items():
        if name not in m.files or m.files[name].bytes != size:
            raise FlashsimError(f"{man_path}: field 'files.{name}': expected {size} bytes for this layout")


def _check_confined(path: Path, man_path: Path, m: StoreManifest) -> None:
    """Every path the manifest names is a relative path inside the store that resolves (symlinks
    followed) inside it, and the order and resident files are among the checksummed files: a
    manifest cannot make a run or `real verify` read /etc/passwd or ../outside.npy."""
    root = path.resolve()
    named = [(f"files.{n}", n) for n in m.files]
    named += [("order.file", m.order.file), ("resident.file", m.resident.file)]
    named += [(f"layers.{i}.{lay}.file", e.file) for i, row in enumerate(m.layers) for lay, e in row.items()]
    for field, name in named:
        rel = Path(name)
        inside = not rel.is_absolute() and ".." not in rel.parts and name.strip() != ""
        if inside:
            try:
                inside = (root / rel).resolve().is_relative_to(root)
            except (OSError, RuntimeError):
                inside = False
        if not inside:
            raise FlashsimError(f"{man_path}: field '{field}': {name!r} is outside the store folder; "
                                "a store names only files inside it: re-create the store")
        if not field.startswith("files.") and name not in m.files:
            raise FlashsimError(f"{man_path}: field '{field}': {name!r} is not among the store's checksummed files")


def _check_files(path: Path, m: StoreManifest) -> None:
    for name, info in m.files.items():
        p = path / name
        if not p.is_file():
            raise FlashsimError(f"{p}: missing (listed in {MANIFEST}); the store is incomplete: re-create it")
        size = p.stat().st_size
        if size < info.bytes:
            raise FlashsimError(f"{p}: truncated: {size} bytes, {MANIFEST} says {info.bytes}; re-create the store")
        if name.startswith("ffn/") and size % ALIGN_BYTES:
            raise FlashsimError(f"{p}: {size} bytes is not a multiple of {ALIGN_BYTES} (unaligned); direct I/O "
                                "reads whole 4 KiB blocks: re-create the store")
        if size != info.bytes:
            raise FlashsimError(f"{p}: {size} bytes, {MANIFEST} says {info.bytes}; the file was changed")


def _load_order(path: Path, m: StoreManifest, spec: ModelSpec) -> np.ndarray:
    p = path / m.order.file
    try:
        order = np.load(p, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise FlashsimError(f"{p}: not a readable .npy neuron order ({e})") from None
    if order.shape != (spec.n_layers, spec.d_ff) or order.dtype != np.int32:
        raise FlashsimError(f"{p}: expected int32 [{spec.n_layers}, {spec.d_ff}], got {order.dtype} {list(order.shape)}")
    srt = np.sort(order, axis=1)
    if not np.array_equal(srt, np.broadcast_to(np.arange(spec.d_ff, dtype=np.int32), srt.shape)):
        raise FlashsimError(f"{p}: a row is not a permutation of 0..{spec.d_ff - 1}")
    return np.ascontiguousarray(order)
