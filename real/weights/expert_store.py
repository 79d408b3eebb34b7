"""The expert store: every routed expert of an MoE as one aligned block on disk (sizes in bytes).

A store is a directory, written like the FFN weight store (real/weights/store_writer.py): a hidden
temporary sibling, every byte written (padding as zeros), fsync'ed, checksummed, then renamed:

    manifest.json            format "flashsim-expert-store", schema version, shape, dtype, per-layer
                             files, unit sizes, SHA-256 of every file, provenance
    experts/layer_MMM.bin    MoE layer m (stored index): E slots of `stride_bytes` each; slot e holds
                             expert e = gate [F, d] | up [F, d] | down [d, F] (row-major, the store
                             dtype), zero-padded to a 4 KiB multiple

One expert is one contiguous, 4 KiB-aligned unit: a miss costs one read of the whole expert, and the
read lands straight in a page-aligned cache slot of `stride_bytes` (no copy). `ExpertStore` presents
the interface real/io/reader.BundleReader reads through (one "bundle" per expert, layout "bundled",
padded), so experts are read by the same direct-I/O reader as FFN neurons.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from devices.errors import FlashsimError
from devices.loading import read_versioned_json, validation_message
from devices.units import format_bytes
from real.io.buffers import ALIGN_BYTES, round_up
from real.weights.dtypes import ELEMENT_BYTES, check_dtype, decode, encode
from real.weights.store import FileInfo, LayerEntry, LayoutInfo
from traces.format import sha256_file
from traces.outputs import check_output_dir, publish_dir, remove_stale_temporaries, temp_name

FORMAT_NAME = "flashsim-expert-store"
SCHEMA_VERSION = 1
MANIFEST = "manifest.json"


class ExpertStoreManifest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["flashsim-expert-store"] = FORMAT_NAME
    schema_version: int
    model: str
    n_layers: int = Field(gt=0)
    moe_layers: list[int] = Field(min_length=1)
    n_experts: int = Field(gt=0)
    top_k: int = Field(gt=0)
    d_model: int = Field(gt=0)
    d_expert_ff: int = Field(gt=0)
    dtype: str
    alignment: Literal["padded"] = "padded"      # every expert starts on a 4 KiB boundary
    expert_bytes: int = Field(gt=0)
    stride_bytes: int = Field(gt=0)
    layer_files: list[str]
    files: dict[str, FileInfo]
    source: dict[str, Any]


def expert_bytes_of(d_model: int, d_ff: int, dtype: str) -> int:
    return 3 * d_model * d_ff * ELEMENT_BYTES[check_dtype(dtype)]


class ExpertStore:
    """An opened expert store; the attributes BundleReader uses (n_neurons = experts per layer,
    bundle_bytes = one expert, position = identity, layout "bundled", padded) plus expert decoding."""

    def __init__(self, path: Path, manifest: ExpertStoreManifest):
        self.path, self.manifest = path, manifest
        m = manifest
        self.n_layers = len(m.moe_layers)              # the reader's "layer" = stored MoE layer index
        self.n_neurons = m.n_experts
        self.bundle_bytes = m.expert_bytes
        self.segment_bytes = m.expert_bytes            # one region per layer: one segment per unit
        self.position = np.tile(np.arange(m.n_experts, dtype=np.int32), (self.n_layers, 1))
        self._layout = LayoutInfo(unit_bytes=m.expert_bytes, stride_bytes=m.stride_bytes,
                                  region_bytes=m.stride_bytes * m.n_experts, regions_per_layer=1)

    @property
    def dtype(self) -> str:
        return self.manifest.dtype

    @property
    def total_bytes(self) -> int:
        return sum(f.bytes for f in self.manifest.files.values())

    def layout(self, name: str) -> LayoutInfo:
        if name != "bundled":
            raise FlashsimError(f"{self.path}: an expert store has only the 'bundled' layout (one unit per expert)")
        return self._layout

    def entry(self, layer: int, layout: str = "bundled") -> LayerEntry:
        self.layout(layout)
        if not 0 <= layer < self.n_layers:
            raise FlashsimError(f"MoE layer {layer} is out of range: the store has {self.n_layers}")
        return LayerEntry(file=self.manifest.layer_files[layer], offset_bytes=0, region_offsets_bytes=[0])

    def file_path(self, layer: int, layout: str = "bundled") -> Path:
        return self.path / self.entry(layer, layout).file

    def split(self, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """fp32 (gate [F, d], up [F, d], down [d, F]) of one expert from its stored bytes (>= expert_bytes)."""
        d, F = self.manifest.d_model, self.manifest.d_expert_ff
        vals = decode(np.asarray(raw[: self.bundle_bytes], np.uint8), self.dtype)
        return vals[: F * d].reshape(F, d), vals[F * d: 2 * F * d].reshape(F, d), vals[2 * F * d:].reshape(d, F)

    def read_expert(self, layer: int, expert: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One expert by a plain buffered read (tests and model-mode checks; runs use the reader)."""
        with open(self.file_path(layer), "rb") as f:
            f.seek(expert * self.manifest.stride_bytes)
            return self.split(np.frombuffer(f.read(self.bundle_bytes), np.uint8))

    def summary(self) -> dict[str, Any]:
        m = self.manifest
        return {"path": str(self.path), "model": m.model, "moe_layers": len(m.moe_layers), "n_experts": m.n_experts,
                "dtype": m.dtype, "expert_bytes": m.expert_bytes, "stride_bytes": m.stride_bytes,
                "total_bytes": self.total_bytes, "source": m.source}


def open_expert_store(path: str | Path, verify: bool = False) -> ExpertStore:
    """Open and check an expert store (sizes always; SHA-256 of every file with verify=True)."""
    path = Path(path)
    mpath = path / MANIFEST
    if not mpath.is_file():
        raise FlashsimError(f"{path}: not an expert store (manifest.json is missing)")
    raw = read_versioned_json(mpath, FORMAT_NAME, SCHEMA_VERSION, kind="expert store",
                              remedy="rebuild it with `flashsim real run --moe ... --build-store`")
    try:
        m = ExpertStoreManifest.model_validate(raw)
    except ValidationError as e:
        raise FlashsimError(f"{mpath}: {validation_message(e)}") from None
    want = m.stride_bytes * m.n_experts
    for name in m.layer_files:
        f = path / name
        if not f.is_file() or f.stat().st_size != want:
            raise FlashsimError(f"{f}: missing or not {want:,} bytes; the store is damaged: rebuild it")
        if verify and sha256_file(f) != m.files[name].sha256:
            raise FlashsimError(f"{f}: checksum mismatch (changed after it was written); rebuild the store")
    return ExpertStore(path, m)


ExpertFn = Callable[[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]]


def random_experts(d_model: int, d_ff: int, seed: int, pool: int = 4) -> ExpertFn:
    """Expert weights for shape mode: `pool` distinct random experts (N(0, 1/sqrt(d)) entries), expert
    (m, e) takes pool entry (m * 31 + e) % pool; content does not change read or compute cost."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 17]))
    mats = [(rng.standard_normal((d_ff, d_model), np.float32) / np.sqrt(d_model),
             rng.standard_normal((d_ff, d_model), np.float32) / np.sqrt(d_model),
             rng.standard_normal((d_model, d_ff), np.float32) / np.sqrt(d_ff)) for _ in range(pool)]
    return lambda m, e: mats[(m * 31 + e) % pool]


def write_expert_store(out: str | Path, *, model: str, n_layers: int, moe_layers: list[int], n_experts: int,
                       top_k: int, d_model: int, d_expert_ff: int, dtype: str, experts: ExpertFn,
                       source: dict[str, Any], overwrite: bool = False) -> Path:
    """Write every expert (experts(m, e) -> fp32 gate [F, d], up [F, d], down [d, F]) atomically."""
    out = Path(out)
    check_output_dir(out, "--store", overwrite, kind="expert store")
    eb = expert_bytes_of(d_model, d_expert_ff, dtype)
    stride = round_up(eb, ALIGN_BYTES)
    total = stride * n_experts * len(moe_layers)
    out.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(out.parent).free
    if total + (64 << 20) > free:
        raise FlashsimError(f"{out.parent}: the expert store needs {format_bytes(total)}, only {format_bytes(free)} "
                            "free; choose another folder")
    remove_stale_temporaries(out)
    tmp = temp_name(out)
    (tmp / "experts").mkdir(parents=True)
    files, names = {}, []
    pad = np.zeros(stride - eb, np.uint8)
    try:
        for m in range(len(moe_layers)):
            name = f"experts/layer_{m:03d}.bin"
            with open(tmp / name, "wb") as f:
                for e in range(n_experts):
                    g, u, d = experts(m, e)
                    if g.shape != (d_expert_ff, d_model) or u.shape != g.shape or d.shape != (d_model, d_expert_ff):
                        raise FlashsimError(f"expert ({m}, {e}): shapes {g.shape} {u.shape} {d.shape} do not match "
                                            f"d_model {d_model}, d_expert_ff {d_expert_ff}")
                    for part, what in ((g, "gate"), (u, "up"), (d, "down")):
                        f.write(encode(part, dtype, f"expert ({m}, {e}) {what}").view(np.uint8).tobytes())
                    f.write(pad.tobytes())
                f.flush()
                os.fsync(f.fileno())
            names.append(name)
            files[name] = FileInfo(bytes=(tmp / name).stat().st_size, sha256=sha256_file(tmp / name))
        man = ExpertStoreManifest(schema_version=SCHEMA_VERSION, model=model, n_layers=n_layers,
                                  moe_layers=list(moe_layers), n_experts=n_experts, top_k=top_k, d_model=d_model,
                                  d_expert_ff=d_expert_ff, dtype=dtype, expert_bytes=eb, stride_bytes=stride,
                                  layer_files=names, files=files, source=source)
        (tmp / MANIFEST).write_text(json.dumps(man.model_dump(mode="json"), indent=1))
        publish_dir(tmp, out, overwrite, "expert store")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out

