"""Layout slot: `bundling`, how FFN neurons lie on flash and how a set of neurons becomes reads.

* `bundled=true` (LLM in a flash's row-column bundling): neuron i's up row, down column (and gate
  row) are stored together, so a neuron is ONE read of `ffn_neuron_bytes`. `bundled=false`: each
  FFN matrix is stored on its own and a neuron costs one read of `ffn_row_bytes` per matrix
  (2 for ReLU/GELU, 3 for gated FFNs). Bundling thus divides the reads by the number of matrices
  and multiplies the chunk size by it.
* `coalesce=true`: neurons adjacent on flash that are read in the same batch become one larger
  read, up to `max_chunk_bytes` (a run of r neurons is split from its start into pieces of at most
  that size). Any reader of contiguous bytes does this; it is what turns a dense layer into large
  sequential reads. Sparse sets rarely have neighbours, so it matters little for them.
* `order`: neuron order on flash, which decides adjacency (so it only matters with coalescing):
  `original` (index order), `hot-first` (by activation count in the replayed trace), `coactivation`
  (a spectral ordering of the co-activation graph: neurons that fire together end up adjacent; the
  Fiedler vector of the normalised co-activation matrix, by power iteration on sampled tokens).
  Orders computed from the replayed trace are optimistic (they saw the test tokens): noted.

* `align_bytes` (0 = packed): every unit occupies `round_up(unit bytes, align_bytes)` on flash, as
  in a padded weight store (real/weights/store.py: each bundle, or each matrix row when unbundled, starts on
  a 4 KiB boundary so a run of units is one aligned O_DIRECT read). A read of r adjacent units then
  moves r padded strides: the padding is read from the device too. `flashsim real run` and
  `flashsim validate` set it from the store's manifest (4096 for padded stores). SmolLM2-135M fp32:
  bundle 6912 -> 8192 B, row 2304 -> 4096 B; Llama-2-7B fp16: 24576 B bundles are already aligned.
  DRAM too: `dram_bytes_per_neuron(spec)` is what one cached neuron takes in the memory model
  (sim/engine.py `_memory_model`, the planner's dram_bytes, the cache policy's `dynamic_bytes`):
  `round_up(ffn_neuron_bytes, align_bytes)` in BOTH layouts, because the real cache
  (real/runtime/cache_matrices.py `LayerCache`, rows of `BundleReader.dest_row_bytes`) holds every neuron as one
  bundle row padded to 4 KiB whether flash holds it as one bundle or as per-matrix rows (SmolLM2
  fp32: 8192 B, not 3 x 4096). align_bytes = 0: `ffn_neuron_bytes`, unchanged.

Chunk sizes are multiples of the read unit (the padded stride when aligned):
`chunk_sizes()[j] = (j+1) * unit`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from sim import bitsets
from sim.params import check, param
from sim.policies.base import Layout
from sim.policies.registry import LAYOUTS

# Sampled tokens for the co-activation ordering: enough to estimate pairwise co-activation of the
# frequent neurons; rare neurons carry no signal either way.
COACT_SAMPLE_TOKENS = 2048
COACT_ITERATIONS = 60
# O_DIRECT buffer alignment of the real reader (real.io.buffers.ALIGN_BYTES): iovecs of units that are not
# multiples of it cannot point into the destination rows
DIRECT_IO_ALIGN_BYTES = 4096


@LAYOUTS.register("bundling")
class BundlingLayout(Layout):
    """Bundled or per-matrix rows, optional coalescing of adjacent neurons, neuron order on flash."""

    @dataclass(frozen=True)
    class Params:
        bundled: bool = param(True, "store each neuron's rows/columns of all FFN matrices together (one read)")
        coalesce: bool = param(True, "merge reads of neurons adjacent on flash into one larger read")
        max_chunk_bytes: int = param(1 << 20, "largest single read when coalescing (bytes or e.g. '1MiB')",
                                     unit="bytes")
        order: Literal["original", "hot-first", "coactivation"] = param(
            "original", "neuron order on flash (matters only with coalescing)")
        align_bytes: int = param(0, "each unit (bundle, or row when unbundled) occupies its size rounded up to a "
                                 "multiple of this on flash, padding read too (0 = packed; 4096 = a padded store)",
                                 unit="bytes")

        def __post_init__(self) -> None:
            check(self.max_chunk_bytes >= 512, f"max_chunk_bytes must be >= 512, got {self.max_chunk_bytes}")
            check(self.align_bytes >= 0, f"align_bytes must be >= 0, got {self.align_bytes}")

    def bind(self, ctx) -> None:  # type: ignore[no-untyped-def]
        super().bind(ctx)
        spec = ctx.spec
        if self.params.bundled:
            self.unit_bytes, self.units_per_neuron = spec.ffn_neuron_bytes, 1
        else:
            self.unit_bytes, self.units_per_neuron = spec.ffn_row_bytes, spec.ffn_matrices
        self.useful_unit_bytes = self.unit_bytes
        self.unit_bytes = padded_bytes(self.unit_bytes, self.params.align_bytes)
        self.max_units = max(1, self.params.max_chunk_bytes // self.unit_bytes) if self.params.coalesce else 1
        self._perm: dict[int, np.ndarray] = {}
        if self.params.order != "original":
            if self.params.coalesce:
                ctx.notes.append(f"bundling: order={self.params.order} is computed from the replayed trace "
                                 "itself (optimistic)")
            else:
                ctx.notes.append(f"bundling: order={self.params.order} has no effect without coalescing")

    def dram_bytes_per_neuron(self, spec) -> int:  # type: ignore[no-untyped-def]
        """DRAM one cached neuron takes (bytes): the bundle (gate row | up row | down column),
        rounded up to `align_bytes` when aligned, in both layouts (the real cache's row; see the
        module docstring). `spec`: the ModelSpec as stored (after the precision policy)."""
        return padded_bytes(spec.ffn_neuron_bytes, self.params.align_bytes)

    def staged_reads(self) -> bool:
        """Do a direct-I/O reader's reads land in a staging buffer and get copied out (real/io/reader.py
        `_zero_copy_ok`)? Yes on a packed store, and when unbundled rows are not multiples of
        DIRECT_IO_ALIGN_BYTES; a padded bundle lands straight in its cache row. The profile's
        `flash.staged_s_per_read` prices the copy."""
        if self.params.align_bytes <= 0:
            return True
        return not self.params.bundled and self.useful_unit_bytes % DIRECT_IO_ALIGN_BYTES != 0

    def segmented_reads(self) -> bool:
        """Unbundled rows that land in place (padded store, rows multiples of DIRECT_IO_ALIGN_BYTES):
        a run of adjacent rows of one matrix is one read, but each row goes to its own cache row (the
        neuron's bundle row), so the read has one iovec per row (real/io/reader.py `_run`). A bundled
        run lands in consecutive cache rows: one buffer."""
        return not self.params.bundled and self.params.align_bytes > 0 and not self.staged_reads()

    def read_units(self) -> tuple[int, int]:
        return self.unit_bytes, self.units_per_neuron

    def bundled(self) -> bool:
        return bool(self.params.bundled)

    def max_coalesced_bytes(self) -> int:
        return int(self.params.max_chunk_bytes) if self.params.coalesce else 0

    def alignment_bytes(self) -> int:
        return int(self.params.align_bytes)

    def params_aligned_to(self, align_bytes: int) -> BundlingLayout.Params:
        return replace(self.params, align_bytes=int(align_bytes))

    def chunk_sizes(self) -> np.ndarray:
        return self.unit_bytes * np.arange(1, self.max_units + 1, dtype=np.int64)

    def read_counts(self, layer: int, words: np.ndarray) -> np.ndarray:
        if self.max_units == 1:
            return (bitsets.count(words) * self.units_per_neuron)[:, None]
        perm = self.permutation(layer)
        if perm is not None:
            words = bitsets.permute(words, perm, self.ctx.n_neurons)
        counts, _ = bitsets.run_length_counts(words, self.max_units)
        return counts * self.units_per_neuron

    def permutation(self, layer: int) -> np.ndarray | None:
        """Flash position -> neuron (None: index order)."""
        if self.params.order == "original" or self.max_units == 1:
            return None
        p = self._perm.get(layer)
        if p is None:
            view = self.ctx.view
            if self.params.order == "hot-first":
                p = np.argsort(-view.activation_counts(layer), kind="stable")
            else:
                p = coactivation_order(view, layer, self.ctx.rng.fresh(f"layout/coactivation/layer{layer}"))
            self._perm[layer] = p
        return p


def padded_bytes(n_bytes: int, align_bytes: int) -> int:
    """`n_bytes` rounded up to a multiple of `align_bytes` (0: unchanged)."""
    if align_bytes <= 0:
        return int(n_bytes)
    return -(-int(n_bytes) // align_bytes) * align_bytes


def coactivation_order(view, layer: int, rng: np.random.Generator) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Neurons sorted by the Fiedler vector of the normalised co-activation graph (spectral order).

    A = M^T M without its diagonal (M: sampled tokens x neurons, 0/1); the second eigenvector of
    D^-1/2 A D^-1/2 (found by power iteration on (I + .)/2, deflating the known first one,
    D^1/2 1) places strongly co-activated neurons close together. Never-active neurons go last."""
    T = view.trace.n_tokens
    take = np.linspace(0, T - 1, min(T, COACT_SAMPLE_TOKENS)).astype(np.int64)
    M = view.token_active(layer, take).astype(np.float32)
    deg_self = M.sum(axis=0)
    deg = M.T @ (M @ np.ones(M.shape[1], np.float32)) - deg_self
    active = deg > 0
    dinv = np.zeros_like(deg)
    dinv[active] = 1.0 / np.sqrt(deg[active])
    top = np.sqrt(np.maximum(deg, 0))
    top /= np.linalg.norm(top) or 1.0
    v = rng.standard_normal(M.shape[1]).astype(np.float32) * active
    for _ in range(COACT_ITERATIONS):
        v -= top * (top @ v)
        x = dinv * v
        av = M.T @ (M @ x) - deg_self * x
        v = 0.5 * (v + dinv * av)
        n = np.linalg.norm(v)
        if n == 0:
            break
        v /= n
    key = np.where(active, v, np.inf)
    return np.lexsort((np.arange(len(key)), key))
