"""The real backend's sparse FFN compute: one layer's computed neurons, already in the layer's
neuron cache (real/runtime/cache_matrices.py), run through the FFN on the CPU or a CUDA device
(torch; times are taken by the caller, real/runtime/backend.py `RealExecutor.ffn`).

`SparseFFN.compute` gathers the computed rows (gate | up | down) out of the cache, SwiGLU (or the
model's activation) on them only. Where the residency's rows are contiguous (`Residency.gathers_at`
False: naive's rows read in neuron order, dense's whole FFN) and the cache holds them so, on the
cache's own rows without a gather, the down GEMV on the row layout (a SmolLM2 naive run keeping every
neuron: FFN 139.6 -> 35.4 ms per token, logits 1.07e-4 from HF's, greedy tokens identical; the
gathering path's transposed copy keeps <= 1e-4). The device part (where compute runs, pinned host
buffers) is real/runtime/device.py; on CUDA the cache's arena is page-locked in place and the
gather scratch is pinned, so the rows' host-to-device copies are asynchronous.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from real.runtime.cache_matrices import GATHER_ROW_PAD_BYTES, TransposeScratch, gather_rows

TORCH_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


class SparseFFN:
    """The sparse FFN of one store on one compute device: its dtype, its scratches (the gathered rows,
    pinned on CUDA; the down rows transposed) and, on CUDA, the cache arena pinned in place. `close`
    releases them."""

    def __init__(self, torch: Any, dev: Any, tdtype: Any, spec: Any, seg_bytes: int, n_seg: int,
                 arena: Any = None):
        from real.runtime.device import HostScratch, pin_host_buffer

        self.torch, self.dev, self.tdev, self.tdtype = torch, dev, dev.torch_device(), tdtype
        self.spec, self.seg_bytes, self.n_seg = spec, seg_bytes, n_seg
        # on CUDA the cache rows are page-locked in place, so in-place FFNs copy them asynchronously
        self._arena_pin = pin_host_buffer(arena, dev) if arena is not None else None
        self._gather = HostScratch(dev)   # the gathered rows (pinned on CUDA)
        self._down_t = TransposeScratch(torch, self.tdev)   # the down rows, transposed

    def close(self) -> None:
        from real.runtime.device import unpin_host_buffer

        self._gather.close()
        unpin_host_buffer(self._arena_pin)
        self._arena_pin = None

    def compute(self, cache: Any, comp_ids: np.ndarray, x: Any, in_place: bool = False) -> Any:
        """The FFN of `cache`'s neurons `comp_ids` on hidden vector(s) x [t, d] (torch); in place: on the
        cache's rows [0, k) without a gather (module doc)."""
        torch = self.torch
        F = torch.nn.functional
        if len(comp_ids) == 0:
            return torch.zeros_like(x)
        k = len(comp_ids)
        if in_place:    # the cache's own rows [0, k): no gather, and the down GEMV on the row layout
            rows_t = torch.from_numpy(cache.rows[:k]).view(self.tdtype)
        else:
            # gather: whole cache rows into the preallocated scratch (real.runtime.cache_matrices.gather_rows), then
            # the segments are views of it. The scratch's rows are GATHER_ROW_PAD_BYTES wider than
            # the cache's: see real.runtime.cache_matrices.GATHER_ROW_PAD_BYTES
            scratch = self._gather.get(max(k, cache.capacity), cache.row_stride_bytes + GATHER_ROW_PAD_BYTES)
            rows_t = gather_rows(cache.rows, cache.slot_of[comp_ids], scratch, self.tdtype)
        es = rows_t.element_size()
        w = self.seg_bytes // es
        xs = x.to(self.tdtype)
        if self.dev.kind != "cpu":
            # one host-to-device copy of the whole [k, stride] block, from page-locked memory (the
            # pinned gather scratch, or the cache arena pinned in __init__), then the segments are
            # views on the device. A column slice of the host rows is not contiguous: `.to()` of it
            # first copies it into pageable memory on the CPU, and the transfer is then synchronous.
            rows_t = rows_t.to(self.tdev, non_blocking=True)
            xs = xs.to(self.tdev)
        segs = [rows_t[:, i * w:(i + 1) * w] for i in range(self.n_seg)]
        if self.spec.gated:
            gate, up, down = segs
            h = _act(torch, self.spec.ffn_kind, F.linear(xs, gate)) * F.linear(xs, up)
        else:
            up, down = segs
            h = _act(torch, self.spec.ffn_kind, F.linear(xs, up))
        # down: one contiguous [d, k] copy (from 8 MiB on a preallocated one: real.runtime.cache_matrices.TransposeScratch),
        # then the same GEMV kernel (F.linear) HF's dense down_proj uses; `h @ down` on the row
        # layout accumulates in another order (SmolLM2 logits then differ from HF by ~1.4e-4
        # instead of <= 1e-4). The copy is k*d elements. In place, the copy would read the cache's
        # 4 KiB-strided rows (the thrashing GATHER_ROW_PAD_BYTES avoids): the row layout instead
        if in_place:
            y = h @ down
        else:
            y = F.linear(h, self._down_t.transposed(down, k, w, es))
        y = y.to(x.dtype).to(x.device)
        if self.dev.kind == "cuda":
            # the step's compute time includes the GPU's, and the host may rewrite the cache rows
            # (reads, keep_only's moves) only after their asynchronous copy has finished
            torch.cuda.current_stream().synchronize()
        return y


def _act(torch: Any, kind: str, g: Any) -> Any:
    if kind in ("swiglu", "silu"):
        return torch.nn.functional.silu(g)
    if kind in ("geglu", "gelu"):
        return torch.nn.functional.gelu(g)
    return torch.relu(g)

