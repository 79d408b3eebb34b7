"""Re-thresholding a trace at load time: new activity masks from its stored top-K magnitudes.

`rethreshold(trace, "threshold:0.2" | "topk:0.1" | "relu")` returns an in-memory `Trace` (the same
class, sharing the source's memory-mapped arrays except the masks) whose masks follow the new rule:

- ``topk:F``: the first ceil(F * N) of each token's stored neurons (stored in descending |a|),
  so K >= ceil(F * N) is required.
- ``threshold:F``: one |a| threshold per layer, calibrated exactly as capture does (the
  (1 - F) quantile of |a| over all T * N values, `traces.sparsity.calibrate_threshold`) with the
  neurons that were not stored counted as 0. That is exact when every token's smallest stored
  |a| lies below the threshold (then nothing unstored can reach it); a token where it does not
  would need more than K magnitudes, and the call fails naming the layer and how many tokens.
- ``relu``: |a| > 0; only for ReLU FFNs (a >= 0, so |a| > 0 <=> a > 0), with the same K check.

Re-deriving a trace's own rule reproduces its masks bit for bit (capture derives masks from the
same fp16 magnitudes it stores). Units: |a| in the model's activation units; fractions of N.
"""

from __future__ import annotations

import math

import numpy as np

from devices.errors import FlashsimError
from traces.format import FileEntry, SparsityRule, Trace, pack_mask
from traces.sparsity import calibrate_threshold, parse_rule


def rethreshold(trace: Trace, rule: str) -> Trace:
    """A Trace with masks re-derived under `rule`; FlashsimError when the stored K is too small."""
    name, fraction = parse_rule(rule)
    L, T, N, K = trace.n_layers, trace.n_tokens, trace.n_neurons, trace.top_k
    if K == 0:
        raise FlashsimError(f"{trace.path}: the trace stores no magnitudes (top_k = 0); it cannot be re-thresholded")
    if name == "relu" and trace.spec.ffn_kind != "relu":
        raise FlashsimError(
            f"{trace.path}: relu needs the sign of a, which a trace stores only as |a|; it is exact only "
            f"for ReLU FFNs and this model's FFN is {trace.spec.ffn_kind}: use threshold:F or topk:F"
        )
    if name == "threshold" and fraction is not None and fraction > K / N:
        raise FlashsimError(
            f"{trace.path}: {rule} keeps {fraction:.3g} of the neurons on average but the trace stores "
            f"only the top {K} of {N} ({K / N:.3g}) per token; use a sparser rule or re-capture with "
            "a larger --magnitude-fraction"
        )
    masks = np.empty((L, T, (N + 7) // 8), np.uint8)
    thresholds: list[float] = []
    for layer in range(L):
        idx, mag = trace.top(layer)
        if name == "topk":
            assert fraction is not None
            k = max(1, math.ceil(fraction * N))
            if k > K:
                raise FlashsimError(
                    f"{trace.path}: topk:{fraction} needs the {k} strongest neurons per token but the trace "
                    f"stores {K} ({K / N:.3g} of {N}); use topk <= {K / N:.4g} or re-capture with a larger "
                    "--magnitude-fraction"
                )
            active = np.zeros((T, N), bool)
            np.put_along_axis(active, np.asarray(idx[:, :k]).astype(np.int64), True, axis=1)
        else:
            if name == "threshold":
                assert fraction is not None
                thr = calibrate_threshold(trace.magnitudes(layer), fraction)
                thresholds.append(thr)
                active_of = np.asarray(mag, np.float32) >= thr
            else:
                thr = 0.0
                active_of = np.asarray(mag, np.float32) > 0
            if K < N:
                smallest = np.asarray(mag[:, K - 1], np.float32)
                short = (smallest >= thr) if name == "threshold" else (smallest > 0)
                if short.any():
                    raise FlashsimError(
                        f"{trace.path}: {rule} needs more than the {K} stored magnitudes per token in "
                        f"layer {layer} ({int(short.sum())} of {T} tokens, first token {int(np.argmax(short))}); "
                        "choose a sparser rule or re-capture with a larger --magnitude-fraction"
                    )
            active = np.zeros((T, N), bool)
            rows = np.broadcast_to(np.arange(T)[:, None], active_of.shape)
            active[rows[active_of], np.asarray(idx, np.int64)[active_of]] = True
        masks[layer] = pack_mask(active)
    m = trace.manifest
    sparsity = SparsityRule(rule=name, target_fraction=fraction, thresholds=thresholds or None)
    files = dict(m.files)
    files["masks"] = FileEntry(sha256="", shape=list(masks.shape), dtype=str(masks.dtype))  # in memory only
    provenance = {**m.provenance, "rethresholded": {"from": m.sparsity.model_dump(mode="json"), "rule": rule}}
    manifest = m.model_copy(update={"sparsity": sparsity, "files": files, "provenance": provenance})
    arrays = {name_: trace._a[name_] for name_ in trace._a}
    arrays["masks"] = masks
    return Trace(trace.path, manifest, arrays)
