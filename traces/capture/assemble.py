"""From recorded FFN activations to a trace: sparsity rule, stored magnitudes, atomic write.

`ActivationStore` keeps, for every captured prompt, what the trace needs and nothing more:
|a| rounded to fp16 (the stored magnitudes, and the data the per-layer thresholds are calibrated
on), the exact fp32 sum of |a| per token, and the sign bit a > 0 (bitpacked, for the ``relu``
rule). It holds 2 * L * N bytes per token (SmolLM2: 92 KB/token), because a ``threshold`` rule is
calibrated over ALL captured tokens of a layer before any mask can be written.

Masks are derived from the same fp16 magnitudes that are stored, so re-thresholding a trace with
its own rule (`traces.rethreshold`) reproduces its masks bit for bit whenever the stored top K
covers them. Pure NumPy: no torch here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from devices.errors import FlashsimError
from devices.model_spec import ModelSpec
from traces.format import (
    DECODE,
    PREFILL,
    PromptInfo,
    SparsityRule,
    TraceWriter,
    index_dtype,
    pack_mask,
)
from traces.sparsity import calibrate_threshold

FP16_MAX = float(np.finfo(np.float16).max)


@dataclass(frozen=True)
class _Piece:
    token_ids: np.ndarray      # int32 [n]
    n_prompt: int
    mag16: np.ndarray          # float16 [L, n, N]  |a|
    positive: np.ndarray       # uint8 [L, n, NB]   packed a > 0
    abs_sum: np.ndarray        # float32 [L, n]


def default_rule(spec: ModelSpec) -> tuple[str, float | None]:
    """relu for ReLU FFNs (exact zeros); otherwise a per-layer threshold keeping half the neurons.

    SiLU/GELU activations have almost no exact zeros. Computing only the strongest 50% of
    SmolLM2-135M's FFN neurons raises teacher-forced perplexity from 2.33 to 2.51 (+8%); 30% gives
    3.18 (+36%), 10% gives 19 (../shared/environment.md). Half is the sparsest point that keeps
    quality close to dense for a small SwiGLU model (TEAL reports ~40-50% sparsity as the
    near-lossless range for Llama-class models), so it is the default; sparser points are a
    re-threshold away (`traces.rethreshold`).
    """
    return ("relu", None) if spec.ffn_kind == "relu" else ("threshold", 0.5)


def top_k_fp16(mag16: np.ndarray, k: int, n_neurons: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices and values of the k largest of each row of non-negative fp16 [T, N], descending.

    The bit patterns of non-negative fp16 numbers sort like the numbers, so one stable radix sort
    of the inverted 16-bit patterns orders every row (ties: lower neuron index first), several
    times faster than a float partition + sort. The order is a prefix property: the first k of a
    larger k are the same neurons, which keeps topk masks and stored indices consistent.
    """
    order = np.argsort(~mag16.view(np.uint16), axis=1, kind="stable")[:, :k]
    return order.astype(index_dtype(n_neurons)), np.take_along_axis(mag16, order, axis=1)


class ActivationStore:
    """Accumulates per-prompt activations; `write` turns them into one trace."""

    def __init__(self, n_layers: int, n_neurons: int):
        self.n_layers, self.n_neurons = n_layers, n_neurons
        self.pieces: list[_Piece] = []

    @property
    def n_tokens(self) -> int:
        return sum(int(p.token_ids.size) for p in self.pieces)

    def add(self, token_ids: np.ndarray, n_prompt: int, acts: np.ndarray) -> None:
        """acts: float [L, n, N], row i = the FFN activations while the model consumed token_ids[i]."""
        acts = np.asarray(acts, dtype=np.float32)
        L, n, N = acts.shape
        if (L, N) != (self.n_layers, self.n_neurons) or n != len(token_ids) or not 0 <= n_prompt <= n:
            raise ValueError(f"activations {acts.shape} do not match {len(token_ids)} tokens "
                             f"of a {self.n_layers} x {self.n_neurons} model")
        absa = np.abs(acts)
        if not np.all(np.isfinite(absa)):
            raise FlashsimError("the model produced NaN or infinite FFN activations; nothing was written")
        # fp16 saturates at 65504; a larger |a| is stored as 65504 (still the largest) while
        # abs_sum keeps the exact fp32 total.
        mag16 = np.minimum(absa, FP16_MAX).astype(np.float16)
        self.pieces.append(_Piece(np.asarray(token_ids, np.int32), int(n_prompt), mag16,
                                  pack_mask(acts > 0), absa.sum(axis=2, dtype=np.float32)))

    def _layer_mag16(self, layer: int) -> np.ndarray:
        """float16 [T, N]: the fp16-rounded |a| of one layer over every captured token."""
        return np.concatenate([p.mag16[layer] for p in self.pieces])

    def write(self, out: str | Path, spec: ModelSpec, prompts: list[PromptInfo], *, rule: str,
              target_fraction: float | None, magnitude_fraction: float | None = None,
              provenance: dict | None = None, overwrite: bool = False) -> Path:
        """Apply the rule per layer over all tokens and write the trace atomically (TraceWriter).

        magnitude_fraction: share of neurons whose |a| is stored per token (top K). None = auto:
        K = one more than the largest active count of any (layer, token) under `rule` (topk: its
        k), the smallest K from which the trace's own masks, and every sparser rule, can be
        re-derived (`traces.rethreshold`).
        """
        if not self.pieces:
            raise FlashsimError("nothing was captured")
        if len(prompts) != len(self.pieces):
            raise ValueError("one PromptInfo per captured prompt")
        if magnitude_fraction is not None and not 0 <= magnitude_fraction <= 1:
            raise FlashsimError(f"--magnitude-fraction must be in [0, 1], got {magnitude_fraction}")
        if rule in ("threshold", "topk") and not (target_fraction and 0 < target_fraction <= 1):
            raise FlashsimError(f"sparsity rule {rule} needs a target fraction in (0, 1]")
        L, N, T = self.n_layers, self.n_neurons, self.n_tokens
        k_fixed = None if magnitude_fraction is None else min(N, math.ceil(magnitude_fraction * N))
        k_rule = max(1, math.ceil(target_fraction * N)) if rule == "topk" and target_fraction else 0
        # Pass 1: masks (and thresholds), so that an automatic K is known before arrays are sized.
        masks = np.empty((L, T, (N + 7) // 8), np.uint8)
        thresholds: list[float] = []
        k_needed = 0
        for layer in range(L):
            if rule == "relu":
                masks[layer] = np.concatenate([p.positive[layer] for p in self.pieces])
            elif rule == "threshold":
                mag = self._layer_mag16(layer).astype(np.float32)
                thresholds.append(calibrate_threshold(mag, target_fraction))
                masks[layer] = pack_mask(mag >= thresholds[-1])
            elif rule == "topk":
                # The first k_rule of the order the stored top K follows: ties break identically.
                idx, _ = top_k_fp16(self._layer_mag16(layer), k_rule, N)
                active = np.zeros((T, N), bool)
                np.put_along_axis(active, idx[:, :k_rule].astype(np.int64), True, axis=1)
                masks[layer] = pack_mask(active)
            else:
                raise ValueError(f"unknown rule {rule!r}")
            k_needed = max(k_needed, int(np.bitwise_count(masks[layer]).sum(axis=1).max()))
        if k_fixed is not None:
            k_store = k_fixed
        elif rule == "topk":
            k_store = k_rule
        else:
            # One more than the largest count: that token's next-strongest |a| is stored too and
            # lies below the threshold, which is what proves nothing unstored was active.
            k_store = min(N, k_needed + 1)
        sparsity = SparsityRule(rule=rule, target_fraction=target_fraction,
                                thresholds=thresholds if rule == "threshold" else None)
        # Pass 2: the arrays, written into the trace's temporary directory.
        with TraceWriter(out, spec, T, k_store, sparsity, prompts, provenance=provenance,
                         overwrite=overwrite) as w:
            w.token_ids[:] = np.concatenate([p.token_ids for p in self.pieces])
            w.phase[:] = np.concatenate([np.where(np.arange(p.token_ids.size) < p.n_prompt, PREFILL, DECODE)
                                         for p in self.pieces]).astype(np.uint8)
            w.prompt_index[:] = np.concatenate([np.full(p.token_ids.size, i, np.int32)
                                                for i, p in enumerate(self.pieces)])
            w.masks[:] = masks
            for layer in range(L):
                if k_store:
                    idx, val = top_k_fp16(self._layer_mag16(layer), k_store, N)
                    w.top_idx[layer], w.top_mag[layer] = idx, val
                w.abs_sum[layer] = np.concatenate([p.abs_sum[layer] for p in self.pieces])
        return Path(out)
