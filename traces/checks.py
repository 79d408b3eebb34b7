"""Semantic checks of a trace's arrays: the rules that hold for any trace an activation capture (or
the synthetic generator) can write, checked at open, vectorised per layer.

A trace whose checksums match can still be wrong (an array edited and re-hashed, a buggy
converter); numbers computed from it would be silently wrong. The rules (names used in messages):

* `finite (no NaN or infinity)`: magnitudes and Σ|a| are finite numbers;
* `abs_sum >= 0`: Σ|a| is a sum of absolute values;
* `abs_sum >= top magnitude`: Σ|a| over all neurons is at least the largest stored |a| (within the
  float16 rounding of the stored magnitudes and the float32 sum: relative 2e-3);
* `magnitudes >= 0` and `magnitudes descending`: top_mag holds |a| of the K strongest, strongest first;
* `indices in range` and `indices unique`: top_idx names K distinct neurons of the layer;
* `mask agrees with magnitudes`: a rule that decides activity by magnitude (threshold, topk, relu)
  marks the strongest neurons active: no stored neuron marked inactive is stronger than one marked
  active, and none is left out while a weaker one is in the mask's top-K. ("synthetic" traces are
  exempt: a predictor's or an executed run's sets are written as synthetic masks over the source's
  magnitudes, and need not be the strongest neurons);
* `threshold rule`: with per-layer thresholds, a stored neuron is active iff |a| >= the threshold;
* `phase values`, `prefill before decode`: phase is 0/1 and, within a prompt, prefill tokens come
  before the decode tokens; `prompt token counts`: each prompt's prefill / decode tokens match the
  manifest's n_prompt_tokens / n_generated_tokens;
* `prompt_index in range`.

A failure raises FlashsimError naming the array file, the layer and token, and the rule.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from devices.errors import FlashsimError

REL_TOL = 2e-3          # float16 magnitudes (2^-11 relative) against a float32 sum over N neurons
PREFILL, DECODE = 0, 1
FINITE_RULE = "finite (no NaN or infinity)"
MAGNITUDE_RULES = ("threshold", "topk", "relu")     # activity decided by |a| (traces/format.py SparsityRule)


def _fail(path: Path, array: str, rule: str, layer: int | None, token: int | None, detail: str = "") -> None:
    where = ", ".join(x for x in (f"layer {layer}" if layer is not None else "",
                                  f"token {token}" if token is not None else "") if x)
    raise FlashsimError(f"{path / (array + '.npy')}: {where + ': ' if where else ''}violates rule "
                        f"'{rule}'{': ' + detail if detail else ''}; the trace is inconsistent: re-capture it")


def _first(bad: np.ndarray) -> int:
    return int(np.flatnonzero(bad.reshape(-1))[0])


def check_tokens(path: Path, prompts: list[Any], phase: np.ndarray, prompt_index: np.ndarray) -> None:
    """Per-token arrays: phase values and order within each prompt, prompt indices and counts."""
    phase, pi = np.asarray(phase), np.asarray(prompt_index)
    if np.any(phase > DECODE):
        _fail(path, "phase", "phase values", None, _first(phase > DECODE), "0 (prefill) or 1 (decode)")
    if pi.size and (pi.min() < 0 or pi.max() >= len(prompts)):
        _fail(path, "prompt_index", "prompt_index in range", None, _first((pi < 0) | (pi >= len(prompts))),
              f"{len(prompts)} prompts")
    same = pi[1:] == pi[:-1]
    back = same & (phase[1:] < phase[:-1])          # decode followed by prefill in one prompt
    if np.any(back):
        _fail(path, "phase", "prefill before decode", None, _first(back) + 1,
              f"a prefill token after a decode token of prompt {int(pi[_first(back) + 1])}")
    n = len(prompts)
    pre = np.bincount(pi[phase == PREFILL], minlength=n)
    dec = np.bincount(pi[phase == DECODE], minlength=n)
    want_pre = np.array([p.n_prompt_tokens for p in prompts], np.int64)
    want_dec = np.array([p.n_generated_tokens for p in prompts], np.int64)
    bad = (pre != want_pre) | (dec != want_dec)
    if np.any(bad):
        p = _first(bad)
        _fail(path, "phase", "prompt token counts", None, None,
              f"prompt {p} has {pre[p]} prefill / {dec[p]} decode tokens, the manifest says "
              f"{want_pre[p]} / {want_dec[p]}")


def check_layer(path: Path, layer: int, n_neurons: int, rule: str, threshold: float | None,
                packed: np.ndarray, idx: np.ndarray, mag: np.ndarray, abs_sum: np.ndarray) -> None:
    """One layer's arrays: packed masks [T, NB], top_idx / top_mag [T, K], abs_sum [T]."""
    s = np.asarray(abs_sum, np.float32)
    if not np.all(np.isfinite(s)):
        _fail(path, "abs_sum", FINITE_RULE, layer, _first(~np.isfinite(s)))
    if np.any(s < 0):
        _fail(path, "abs_sum", "abs_sum >= 0", layer, _first(s < 0), f"got {float(s[s < 0][0]):g}")
    K = idx.shape[1] if idx.ndim == 2 else 0
    if K == 0:
        return
    m = np.asarray(mag).astype(np.float32)
    if not np.all(np.isfinite(m)):
        _fail(path, "top_mag", FINITE_RULE, layer, _first(~np.isfinite(m).all(axis=1)))
    if np.any(m < 0):
        _fail(path, "top_mag", "magnitudes >= 0", layer, _first((m < 0).any(axis=1)))
    if K > 1 and np.any(m[:, 1:] > m[:, :-1]):
        _fail(path, "top_mag", "magnitudes descending", layer, _first((m[:, 1:] > m[:, :-1]).any(axis=1)))
    over = m[:, 0] > s * (1 + REL_TOL) + 1e-30
    if np.any(over):
        t = _first(over)
        _fail(path, "abs_sum", "abs_sum >= top magnitude", layer, t,
              f"Σ|a| = {float(s[t]):g} < the largest stored |a| = {float(m[t, 0]):g}")
    ix = np.asarray(idx)
    if np.any(ix >= n_neurons):
        _fail(path, "top_idx", "indices in range", layer, _first((ix >= n_neurons).any(axis=1)),
              f"neuron index >= {n_neurons}")
    if K > 1:   # 16-bit indices (layers up to 65,536 neurons) sort stably by radix, several times faster
        srt = np.sort(ix, axis=1, kind="stable" if ix.dtype.itemsize <= 2 else "quicksort")
        dup = (srt[:, 1:] == srt[:, :-1]).any(axis=1)
        if np.any(dup):
            _fail(path, "top_idx", "indices unique", layer, _first(dup))
    if rule not in MAGNITUDE_RULES:
        return
    mask = np.unpackbits(np.asarray(packed), axis=-1, count=n_neurons, bitorder="little").astype(bool)
    act = np.take_along_axis(mask, ix, axis=1)                          # [T, K] stored neuron active?
    amin = np.where(act, m, np.inf).min(axis=1)
    imax = np.where(~act, m, -np.inf).max(axis=1)
    left_out = (mask.sum(axis=1) > act.sum(axis=1)) & (~act).any(axis=1)  # an active neuron weaker than
    bad = (imax > amin) | left_out                                        # an inactive stored one
    if np.any(bad):
        _fail(path, "masks", "mask agrees with magnitudes", layer, _first(bad),
              "a neuron marked inactive is stronger than one marked active")
    if rule == "threshold" and threshold is not None:
        thr = np.float32(threshold)
        wrong = (act & (m < thr * (1 - REL_TOL))) | (~act & (m > thr * (1 + REL_TOL)))
        if np.any(wrong.any(axis=1)):
            _fail(path, "masks", "threshold rule", layer, _first(wrong.any(axis=1)),
                  f"active must mean |a| >= the layer's threshold {float(thr):g}")


def check_trace(path: Path, manifest: Any, arrays: dict[str, np.ndarray]) -> None:
    """Every rule above on an opened trace's arrays (memory-mapped; one layer at a time)."""
    check_tokens(path, manifest.prompts, arrays["phase"], arrays["prompt_index"])
    thr = manifest.sparsity.thresholds
    for layer in range(manifest.n_layers):
        check_layer(path, layer, manifest.n_neurons, manifest.sparsity.rule,
                    thr[layer] if thr is not None and layer < len(thr) else None,
                    arrays["masks"][layer], arrays["top_idx"][layer], arrays["top_mag"][layer],
                    arrays["abs_sum"][layer])
