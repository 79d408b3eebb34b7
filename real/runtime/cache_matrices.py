"""The neuron cache: per-layer preallocated matrices of neuron bundles in DRAM (sizes in bytes).

LLM in a flash's DRAM management: each layer owns one matrix of `capacity` rows, allocated once
(page aligned and pre-faulted, so direct-I/O reads can land in it and no page fault happens later).
Rows [0, n) are occupied. New neurons are appended at the end (rows [n, n + k)); deleting neurons
moves the last occupied rows into the holes, so the occupied rows stay dense and nothing is ever
reallocated. `slot_of` (int32 [N], -1 = absent) and `neuron_at` (int32 [capacity], -1 = empty)
index both ways.

Cost accounting is exact: `bytes_moved` counts the bytes copied by deletions (rows moved x
row_bytes; padding beyond row_bytes is never copied). A copy reads and writes each byte once, so it
generates 2 x bytes_moved of DRAM traffic; `bytes_inserted` counts bytes copied in by `insert`
(rows a reader fills in place through `append` cost no copy and are not counted here).

Row layout: gate row | up row | down column (the store's bundle), `row_bytes` long, in a row of
`row_stride_bytes` (>= row_bytes; equal to the store's padded stride for zero-copy reads). Per-token
work allocates only O(k) index arrays, never weight memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from devices.errors import FlashsimError
from real.io.buffers import AlignedBuffer

MOVE_BATCH_ROWS = 256  # rows copied per batch through the preallocated scratch


@dataclass(frozen=True)
class MoveStats:
    rows_moved: int
    bytes_moved: int


class LayerCache:
    """Up to `capacity` neurons (of `n_neurons`) of one layer.

    Raises ValueError when capacity < 0, n_neurons < 1, row_bytes < 1 or row_stride_bytes < row_bytes.
    """

    def __init__(self, capacity: int, n_neurons: int, row_bytes: int, row_stride_bytes: int | None = None,
                 memory: np.ndarray | None = None):
        """`memory`: uint8 [>= capacity * stride] to hold the rows (a slice of a shared arena,
        see `layer_caches`); None allocates an AlignedBuffer of its own."""
        stride = row_bytes if row_stride_bytes is None else row_stride_bytes
        if capacity < 0 or n_neurons < 1 or row_bytes < 1 or stride < row_bytes:
            raise ValueError(f"bad cache shape: capacity={capacity}, n_neurons={n_neurons}, "
                             f"row_bytes={row_bytes}, row_stride_bytes={stride}")
        self.capacity, self.n_neurons = capacity, n_neurons
        self.row_bytes, self.row_stride_bytes = row_bytes, stride
        if memory is None:
            self._buf: AlignedBuffer | None = AlignedBuffer(max(1, capacity) * stride, huge=True)
            memory = self._buf.array
        elif memory.dtype != np.uint8 or memory.ndim != 1 or len(memory) < capacity * stride:
            raise ValueError(f"memory must be uint8 [>= {capacity * stride}], got {memory.dtype} {list(memory.shape)}")
        self.rows = memory[: capacity * stride].reshape(capacity, stride)  # uint8 [capacity, stride]
        self._data = self.rows[:, :row_bytes]                     # the copied part of each row
        self._scratch = np.empty((min(MOVE_BATCH_ROWS, max(1, capacity)), row_bytes), np.uint8)
        self._mark = np.zeros(max(1, capacity), bool)
        self.slot_of = np.full(n_neurons, -1, np.int32)
        self.neuron_at = np.full(max(1, capacity), -1, np.int32)[:capacity]
        self.n = 0
        self.bytes_moved = 0
        self.rows_moved = 0
        self.bytes_inserted = 0

    # ---- queries ---------------------------------------------------------------------------------------
    @property
    def resident_bytes(self) -> int:
        """DRAM the occupied rows take (whole strides)."""
        return self.n * self.row_stride_bytes

    @property
    def allocated_bytes(self) -> int:
        return self.capacity * self.row_stride_bytes

    def resident_ids(self) -> np.ndarray:
        return self.neuron_at[: self.n]

    def contains(self, neuron_ids: np.ndarray) -> np.ndarray:
        return self.slot_of[np.asarray(neuron_ids, dtype=np.int64)] >= 0

    def missing(self, neuron_ids: np.ndarray) -> np.ndarray:
        """The ids (in the given order) that are not resident."""
        ids = np.asarray(neuron_ids, dtype=np.int64)
        return ids[self.slot_of[ids] < 0]

    def occupied(self) -> np.ndarray:
        """uint8 [n, row_stride_bytes]: the occupied rows (a view)."""
        return self.rows[: self.n]

    def segment(self, index: int, segment_bytes: int, dtype: np.dtype | str) -> np.ndarray:
        """[n, segment_bytes / itemsize] view of one segment (e.g. 0 = gate) of the occupied rows.
        bf16 stores: pass np.uint16 and decode, or use `torch_segment`."""
        a = self.rows[: self.n, index * segment_bytes: (index + 1) * segment_bytes]
        return a.view(np.dtype(dtype))

    def torch_segment(self, index: int, segment_bytes: int, torch_dtype: object) -> object:
        """The same view as a torch tensor sharing memory (torch imported lazily; bf16 works)."""
        import torch

        t = torch.from_numpy(self.rows[: self.n, index * segment_bytes: (index + 1) * segment_bytes])
        return t.view(torch_dtype)  # type: ignore[arg-type]

    # ---- updates ---------------------------------------------------------------------------------------
    def append(self, neuron_ids: np.ndarray) -> tuple[int, int]:
        """Reserve rows [n, n + k) for absent neurons (in the given order) and index them; the
        caller fills `rows[start:stop]` (e.g. `BundleReader.read(..., dest=cache.rows[start:stop])`)."""
        ids = np.asarray(neuron_ids, dtype=np.int64)
        k = len(ids)
        if self.n + k > self.capacity:
            raise FlashsimError(f"neuron cache full: {self.n} + {k} rows > capacity {self.capacity}; "
                                "evict first or give the layer more memory")
        if k and (np.any(self.slot_of[ids] >= 0) or len(np.unique(ids)) != k):
            raise ValueError("append: some neurons are already resident or repeated")
        start, stop = self.n, self.n + k
        self.slot_of[ids] = np.arange(start, stop, dtype=np.int32)
        self.neuron_at[start:stop] = ids
        self.n = stop
        return start, stop

    def insert(self, neuron_ids: np.ndarray, data: np.ndarray) -> tuple[int, int]:
        """Append and copy `data` (uint8 [k, >= row_bytes]) into the new rows."""
        start, stop = self.append(neuron_ids)
        self._data[start:stop] = np.asarray(data, np.uint8)[:, : self.row_bytes]
        self.bytes_inserted += (stop - start) * self.row_bytes
        return start, stop

    def delete(self, neuron_ids: np.ndarray, missing_ok: bool = False) -> MoveStats:
        """Evict neurons: the last occupied rows move into their holes. Returns what was copied."""
        ids = np.asarray(neuron_ids, dtype=np.int64)
        slots = self.slot_of[ids].astype(np.int64)
        if np.any(slots < 0):
            if not missing_ok:
                raise ValueError("delete: some neurons are not resident")
            ids, slots = ids[slots >= 0], slots[slots >= 0]
        k = len(slots)
        if k == 0:
            return MoveStats(0, 0)
        if len(np.unique(slots)) != k:
            raise ValueError("delete: repeated neuron ids")
        n_new = self.n - k
        self._mark[slots] = True
        holes = np.sort(slots[slots < n_new])
        tail = np.arange(n_new, self.n)
        movers = tail[~self._mark[n_new: self.n]][::-1]  # the last rows first
        self._mark[slots] = False
        for a in range(0, len(holes), len(self._scratch)):
            h, m = holes[a: a + len(self._scratch)], movers[a: a + len(self._scratch)]
            # fancy indexing, not np.take: np.take first copies a non-contiguous source (this row
            # view of a padded matrix) whole, which made a 135-row move of SmolLM2 10x slower
            self._scratch[: len(m)] = self._data[m]
            self._data[h] = self._scratch[: len(m)]
        moved_ids = self.neuron_at[movers]
        self.slot_of[ids] = -1
        self.neuron_at[holes] = moved_ids
        self.slot_of[moved_ids] = holes.astype(np.int32)
        self.neuron_at[n_new: self.n] = -1
        self.n = n_new
        stats = MoveStats(len(holes), len(holes) * self.row_bytes)
        self.rows_moved += stats.rows_moved
        self.bytes_moved += stats.bytes_moved
        return stats

    def keep_only(self, keep: np.ndarray) -> MoveStats:
        """Evict every resident neuron whose entry in `keep` (bool [n_neurons]) is False."""
        res = self.neuron_at[: self.n]
        return self.delete(res[~keep[res]])

    def clear(self) -> None:
        self.slot_of[self.neuron_at[: self.n]] = -1
        self.neuron_at[: self.n] = -1
        self.n = 0


def layer_caches(capacities: list[int], n_neurons: int, row_bytes: int,
                 row_stride_bytes: int | None = None) -> list[LayerCache]:
    """One LayerCache per layer, their rows carved out of one AlignedBuffer (the arena).

    One mapping, not one per layer, so that the rows sit on huge pages whatever a layer's size:
    a layer's own buffer under 2 MiB would get 4 KiB pages, and direct reads into 4 KiB pages cost
    this host 1.25-1.33x the time of reads into huge pages (real.io.buffers). Each layer's rows start
    at a multiple of the row stride, so rows stay as aligned as the stride is."""
    stride = row_bytes if row_stride_bytes is None else row_stride_bytes
    sizes = [max(0, c) * stride for c in capacities]
    arena = AlignedBuffer(max(1, sum(sizes)), huge=True)
    out, start = [], 0
    for c, nbytes in zip(capacities, sizes):
        out.append(LayerCache(c, n_neurons, row_bytes, stride, memory=arena.array[start: start + nbytes]))
        out[-1]._buf = arena  # every layer keeps the arena alive
        start += nbytes
    return out


class NeuronCache:
    """One LayerCache per layer (capacities may differ; rows in one arena), with totals across layers."""

    def __init__(self, capacities: list[int], n_neurons: int, row_bytes: int, row_stride_bytes: int | None = None):
        self.layers = layer_caches(capacities, n_neurons, row_bytes, row_stride_bytes)

    def __getitem__(self, layer: int) -> LayerCache:
        return self.layers[layer]

    def __len__(self) -> int:
        return len(self.layers)

    @property
    def bytes_moved(self) -> int:
        return sum(c.bytes_moved for c in self.layers)

    @property
    def resident_bytes(self) -> int:
        return sum(c.resident_bytes for c in self.layers)

    @property
    def allocated_bytes(self) -> int:
        return sum(c.allocated_bytes for c in self.layers)


# Extra bytes per row of the gather scratch. A padded store makes every cache row a multiple of
# 4 KiB; with that row stride the down segment's transposed copy (real.runtime.sparse_ffn) reads one element per
# row from addresses 4 KiB apart, which all map to the same L1/L2 cache sets, so the copy thrashes.
# Measured here (1 thread, fp32 unless noted), gather + transpose per layer, 4 KiB-multiple stride vs
# the same stride + 64 B: SmolLM2 384 x 576 (8 KiB rows) 556 vs 246 us; d 1024 x 205 rows (12 KiB)
# 509 vs 212 us; Llama-2-7B fp16 1100 x 4096 (24 KiB) 22.2 vs 7.4 ms. Same bytes, same results.
GATHER_ROW_PAD_BYTES = 64


def gather_scratch(n_rows: int, row_bytes: int) -> np.ndarray:
    """A gather destination for up to n_rows cache rows of row_bytes (rows padded, see above)."""
    return np.empty((n_rows, row_bytes + GATHER_ROW_PAD_BYTES), np.uint8)


def gather_rows(rows: np.ndarray, slots: np.ndarray, scratch: np.ndarray, dtype: Any) -> Any:
    """Copy rows[slots] into the first len(slots) rows of `scratch` (from gather_scratch) and return
    them as a torch tensor of `dtype` (a torch dtype whose size divides the row bytes): the
    [k, (row_bytes + pad) / itemsize] view whose leading row_bytes hold the rows.

    torch.index_select on the rows viewed as `dtype`, not np.take on the bytes: one thread gathered
    205 12 KiB rows at 46 GB/s against np.take's 14 GB/s here (and 18 vs 8 GB/s for 1100 16 KiB
    rows out of 180 MB)."""
    import torch

    k, w = len(slots), rows.shape[1]
    src = torch.from_numpy(rows).view(dtype)
    out = torch.from_numpy(scratch).view(dtype)
    es = out.element_size()
    torch.index_select(src, 0, torch.from_numpy(np.asarray(slots, np.int64)), out=out[:k, : w // es])
    return out[:k]


# the transposed down copy goes into a preallocated scratch from this size on (TransposeScratch)
TRANSPOSE_SCRATCH_MIN_BYTES = 8 << 20


class TransposeScratch:
    """The sparse FFN's transposed down copy ([k, d] -> [d, k], contiguous), into a preallocated
    destination when it is large.

    `seg.T.contiguous()` allocates the destination on every layer of every token. A large block is
    not reliably handed back by glibc's heap: from 32 MiB on (its mmap threshold's ceiling) every
    allocation is a fresh mapping, and below that the heap's top may have been trimmed in between,
    so the pages fault again on first write. After the backend's gather, a [4096, 2048] fp32 copy
    took 50.7 ms that way against 10.6 ms into this scratch, and the same 16 MiB fp16 copy 7.5, 24
    or 39 ms from one measurement to the next. Up to 8 MiB both ways took the
    same time (SmolLM2 and the validation shapes: 0.25 ms for 409 x 1024 fp32), so smaller copies
    keep `contiguous()` and the decoder loop makes the same torch calls as before
    (sim/components/compute.py LOOP_FFN_OPS). Same elements, same order either way: `copy_` is the
    kernel `contiguous()` runs."""

    def __init__(self, torch: Any, device: Any = None):
        self.torch, self.device = torch, device
        self.flat: Any = None
        self._elems, self._dtype = 0, None

    def transposed(self, seg: Any, k: int, d: int, elem_bytes: int) -> Any:
        """seg [k, d] (any strides, elements of elem_bytes) as a contiguous [d, k] tensor; from the
        scratch (valid until the next call) from TRANSPOSE_SCRATCH_MIN_BYTES on."""
        n = k * d
        if n * elem_bytes < TRANSPOSE_SCRATCH_MIN_BYTES:
            return seg.T.contiguous()
        if self.flat is None or self._elems < n or self._dtype != seg.dtype:
            self.flat = self.torch.empty(n, dtype=seg.dtype, device=self.device or seg.device)
            self._elems, self._dtype = n, seg.dtype
        out = self.torch.as_strided(self.flat, (d, k), (k, 1))
        out.copy_(seg.T)
        return out
