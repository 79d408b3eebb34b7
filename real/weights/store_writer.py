"""StoreWriter: writes a weight store atomically and in bounded memory (sizes in bytes).

Everything goes into a hidden temporary sibling directory; FFN files are written block by block
(at most BLOCK_ROWS neuron slots in memory at a time), every byte explicitly (padding is written as
zeros, so no file has holes that a read would get for free), then fsync'ed, checksummed by reading
them back, described in manifest.json and renamed into place. An exception anywhere removes the
temporary directory, so an interrupted conversion never leaves a store that looks valid.
Before writing anything the writer checks the disk has room (shutil.disk_usage).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from devices.errors import FlashsimError
from devices.model_spec import ModelSpec
from devices.units import format_bytes
from real.weights.dtypes import ELEMENT_BYTES, STORAGE_NUMPY, encode
from real.weights.safetensors_io import write_safetensors
from real.weights.store import (
    FORMAT_NAME,
    MANIFEST,
    ORDER_FILE,
    RESIDENT_FILE,
    SCHEMA_VERSION,
    FileInfo,
    OrderInfo,
    ResidentInfo,
    StoreManifest,
    plan_layout,
    segments_of,
    sha256_file,
)
from traces.outputs import (
    check_output_dir,
    os_error_text,
    publish_dir,
    remove_path,
    remove_stale_temporaries,
    temp_name,
)

BLOCK_ROWS = 1024
# Free space kept beyond the store itself: filesystem metadata and journal, other writers, and the
# files of the store that were not planned (manifest, order) -- never fill a disk to the last block.
HEADROOM_BYTES = 256 * 2**20


class StoreWriter:
    """Plan, check room, then write layer by layer:

        w = StoreWriter(out, spec, dtype, layouts=["bundled"], neuron_at=order, order=OrderInfo(...))
        for layer in range(L): w.write_layer(layer, [gate, up, down_t])   # fp32 [N, d], original order
        w.write_resident({...}); w.commit(mode="model", source={...})
    """

    def __init__(self, out: str | Path, spec: ModelSpec, dtype: str, *, layouts: list[str],
                 neuron_at: np.ndarray, order: OrderInfo, alignment: str = "padded",
                 file_mode: str = "per-layer", overwrite: bool = False, resident_bytes_estimate: int = 0):
        self.out = check_output_dir(out, "--out", overwrite, kind="store")
        self.spec, self.dtype = spec.with_dtype(dtype), dtype
        self.layouts, self.alignment, self.file_mode = list(layouts), alignment, file_mode
        self.segments = segments_of(spec)
        self.infos, self.entries, self.sizes = plan_layout(spec, dtype, self.layouts, alignment, file_mode)
        if neuron_at.shape != (spec.n_layers, spec.d_ff):
            raise FlashsimError(f"neuron order has shape {list(neuron_at.shape)}, expected [{spec.n_layers}, {spec.d_ff}]")
        self.neuron_at = np.ascontiguousarray(neuron_at, dtype=np.int32)
        self.order = order
        self.overwrite = overwrite
        self.planned_bytes = sum(self.sizes.values()) + self.neuron_at.nbytes + resident_bytes_estimate
        self.out.parent.mkdir(parents=True, exist_ok=True)
        check_disk_room(self.out.parent, self.planned_bytes)
        remove_stale_temporaries(self.out)      # of a writer killed before it renamed its work
        self.tmp = temp_name(self.out)
        (self.tmp / "ffn").mkdir(parents=True)
        self._fds: dict[str, int] = {}
        self._resident: ResidentInfo | None = None
        self._done_layers: set[int] = set()

    # ---- FFN layers --------------------------------------------------------------------------------
    def write_layer(self, layer: int, matrices: list[np.ndarray]) -> None:
        """One layer from its segment matrices (fp32 [N, d] each: gate rows, up rows, down columns,
        in ORIGINAL neuron order); rows are permuted into slot order here."""
        N, d = self.spec.d_ff, self.spec.d_model
        if len(matrices) != len(self.segments) or any(np.shape(m) != (N, d) for m in matrices):
            raise FlashsimError(f"layer {layer}: expected {len(self.segments)} matrices of shape [{N}, {d}] "
                                f"({', '.join(self.segments)}), got {[list(np.shape(m)) for m in matrices]}")
        order = self.neuron_at[layer]

        def blocks() -> Iterable[list[np.ndarray]]:
            for s in range(0, N, BLOCK_ROWS):
                rows = order[s: s + BLOCK_ROWS]
                yield [encode(np.asarray(m)[rows], self.dtype, f"layer {layer} {name}")
                       for m, name in zip(matrices, self.segments)]

        self.write_layer_blocks(layer, blocks())

    def write_layer_blocks(self, layer: int, blocks: Iterable[list[np.ndarray]]) -> None:
        """One layer from blocks already in SLOT order and already encoded (storage dtype), each a
        list of per-segment arrays [b, d]; the blocks must cover the N slots in order."""
        N = self.spec.d_ff
        if layer in self._done_layers:
            raise ValueError(f"layer {layer} written twice")
        start = 0
        for seg_blocks in blocks:
            b = seg_blocks[0].shape[0]
            for a in seg_blocks:
                if a.shape != (b, self.spec.d_model) or a.dtype != STORAGE_NUMPY[self.dtype]:
                    raise ValueError(f"block of layer {layer}: got {a.dtype} {a.shape}")
            self._write_block(layer, start, seg_blocks)
            start += b
        if start != N:
            raise ValueError(f"layer {layer}: blocks covered {start} of {N} neuron slots")
        self._pad_tails(layer)
        self._done_layers.add(layer)

    def _write_block(self, layer: int, start: int, seg_blocks: list[np.ndarray]) -> None:
        b = seg_blocks[0].shape[0]
        seg_bytes = self.spec.d_model * ELEMENT_BYTES[self.dtype]
        for lay, info in self.infos.items():
            entry = self.entries[layer][lay]
            fd = self._fd(entry.file)
            if lay == "bundled":
                rows = np.zeros((b, info.stride_bytes), np.uint8)
                for k, a in enumerate(seg_blocks):
                    rows[:, k * seg_bytes: (k + 1) * seg_bytes] = a.view(np.uint8).reshape(b, seg_bytes)
                _pwrite_all(fd, rows, entry.region_offsets_bytes[0] + start * info.stride_bytes, entry.file)
            else:
                for k, a in enumerate(seg_blocks):
                    rows = np.zeros((b, info.stride_bytes), np.uint8)
                    rows[:, :seg_bytes] = a.view(np.uint8).reshape(b, seg_bytes)
                    _pwrite_all(fd, rows, entry.region_offsets_bytes[k] + start * info.stride_bytes, entry.file)

    def _pad_tails(self, layer: int) -> None:
        """Zero-fill each region from the last unit to its 4 KiB-aligned end."""
        N = self.spec.d_ff
        for lay, info in self.infos.items():
            entry = self.entries[layer][lay]
            for off in entry.region_offsets_bytes:
                used = N * info.stride_bytes
                if info.region_bytes > used:
                    _pwrite_all(self._fd(entry.file), np.zeros(info.region_bytes - used, np.uint8), off + used, entry.file)

    def _fd(self, name: str) -> int:
        if name not in self._fds:
            self._fds[name] = os.open(self.tmp / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        return self._fds[name]

    # ---- resident tensors, commit, abort ----------------------------------------------------------
    def write_resident(self, tensors: Mapping[str, tuple[str, np.ndarray]], complete: bool, note: str = "") -> None:
        """`{name: (safetensors dtype, storage array)}` into resident.safetensors."""
        try:
            write_safetensors(self.tmp / RESIDENT_FILE, tensors, {"format": "flashsim-store-resident"})
        except OSError as e:
            raise _write_error(self.tmp / RESIDENT_FILE, e) from None
        self._resident = ResidentInfo(complete=complete, tensors=len(tensors), note=note)

    def commit(self, mode: str, source: dict[str, Any]) -> Path:
        """fsync, checksum, write the manifest, rename into place; returns the store path."""
        missing = sorted(set(range(self.spec.n_layers)) - self._done_layers)
        if missing:
            raise ValueError(f"layers not written: {missing[:5]}")
        if self._resident is None:
            self.write_resident({}, complete=False, note="no resident tensors")
        np.save(self.tmp / ORDER_FILE, self.neuron_at, allow_pickle=False)
        for fd in self._fds.values():
            os.fsync(fd)
            os.close(fd)
        self._fds = {}
        files = {}
        for p in sorted(self.tmp.rglob("*")):
            if p.is_file():
                rel = p.relative_to(self.tmp).as_posix()
                files[rel] = FileInfo(bytes=p.stat().st_size, sha256=sha256_file(p))
        manifest = StoreManifest(
            format=FORMAT_NAME, schema_version=SCHEMA_VERSION, mode=mode,  # type: ignore[arg-type]
            model=self.spec.model_dump(mode="json"), dtype=self.dtype,  # type: ignore[arg-type]
            element_bytes=ELEMENT_BYTES[self.dtype], segments=self.segments,
            alignment=self.alignment, align_bytes=4096, file_mode=self.file_mode,  # type: ignore[arg-type]
            layouts=self.infos, layers=self.entries, order=self.order, resident=self._resident,
            source=source, files=files,
        )
        with open(self.tmp / MANIFEST, "w", encoding="utf-8") as f:
            f.write(json.dumps(manifest.model_dump(mode="json"), indent=1))
            f.flush()
            os.fsync(f.fileno())
        try:
            publish_dir(self.tmp, self.out, self.overwrite, "store")
        except FlashsimError:
            self.abort()
            raise
        _fsync_dir(self.out.parent)
        return self.out

    def abort(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}
        remove_path(self.tmp)

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()


def check_disk_room(folder: Path, need_bytes: int) -> None:
    """FlashsimError when `folder`'s filesystem lacks need_bytes + HEADROOM_BYTES of free space."""
    free = shutil.disk_usage(folder).free
    if need_bytes + HEADROOM_BYTES > free:
        raise FlashsimError(
            f"{folder}: not enough disk space: the store needs {format_bytes(need_bytes)} (+ "
            f"{format_bytes(HEADROOM_BYTES)} headroom) but only {format_bytes(free)} is free; "
            "free space or choose --out on another disk"
        )


def _pwrite_all(fd: int, data: np.ndarray, offset: int, name: str) -> None:
    mv = memoryview(np.ascontiguousarray(data)).cast("B")
    done = 0
    try:
        while done < len(mv):
            done += os.pwrite(fd, mv[done:], offset + done)
    except OSError as e:
        raise _write_error(Path(name), e) from None


def _write_error(path: Path, e: OSError) -> FlashsimError:
    if e.errno == errno.ENOSPC:
        return FlashsimError(f"{path}: the disk filled up while writing the store; free space and convert again")
    return FlashsimError(f"{path}: write failed ({os_error_text(e)})")


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
