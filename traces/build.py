"""Build a trace from dense per-layer activations held in memory (capture of small models, tests).

`write_dense_trace` applies a sparsity rule per layer, keeps the top-K magnitudes and the exact
|a| sums, and writes through `TraceWriter` (atomic). Large traces are written incrementally by
their producers instead (capture per token, synthesis per layer).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from devices.model_spec import ModelSpec
from traces.format import PromptInfo, SparsityRule, TraceWriter, pack_mask, top_k_of
from traces.sparsity import active_mask, calibrate_threshold


def write_dense_trace(out: str | Path, spec: ModelSpec, acts: np.ndarray, token_ids: np.ndarray,
                      phase: np.ndarray, prompt_index: np.ndarray, prompts: list[PromptInfo], *,
                      rule: str, target_fraction: float | None = None, magnitude_fraction: float = 0.25,
                      provenance: dict | None = None, overwrite: bool = False) -> Path:
    """acts: float [L, T, N] (the FFN's intermediate activations). Returns the trace path."""
    L, T, N = acts.shape
    if (L, N) != (spec.n_layers, spec.d_ff):
        raise ValueError(f"activations are {L} x {N}, model {spec.name} is {spec.n_layers} x {spec.d_ff}")
    k = min(N, math.ceil(magnitude_fraction * N))
    thresholds: list[float] | None = [] if rule == "threshold" else None
    with TraceWriter(out, spec, T, k, SparsityRule(rule=rule, target_fraction=target_fraction),
                     prompts, provenance=provenance, overwrite=overwrite) as w:
        w.token_ids[:] = token_ids
        w.phase[:] = phase
        w.prompt_index[:] = prompt_index
        for layer in range(L):
            a = np.asarray(acts[layer], dtype=np.float32)
            absa = np.abs(a)
            thr = None
            if rule == "threshold":
                assert target_fraction is not None and thresholds is not None
                thr = calibrate_threshold(absa, target_fraction)
                thresholds.append(thr)
            w.masks[layer] = pack_mask(active_mask(a, rule, target_fraction, thr))
            w.top_idx[layer], w.top_mag[layer] = top_k_of(absa, k, N)
            w.abs_sum[layer] = absa.sum(axis=1)
        if thresholds is not None:
            w.sparsity = SparsityRule(rule=rule, target_fraction=target_fraction, thresholds=thresholds)
    return Path(out)
