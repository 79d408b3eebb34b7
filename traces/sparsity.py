"""Sparsity rules: which FFN neurons count as active, from |a| (or a) of one layer.

- ``relu``: exactly a > 0 (ReLU FFNs: OPT, ReLU-fied Falcon).
- ``threshold``: |a| >= t_layer, with t_layer calibrated per layer so that the mean active fraction
  over the calibration tokens equals ``target_fraction`` (CATS / TEAL style: one threshold per layer,
  so the active count varies by token).
- ``topk``: the ceil(target_fraction * N) largest |a| per token (a fixed count every token).

Re-thresholding at load time uses the stored top-K magnitudes: any rule whose active sets fit within
the stored K can be recomputed without the model.
"""

from __future__ import annotations

import math
import re

import numpy as np

from devices.errors import FlashsimError

RULES = ("relu", "threshold", "topk")


def parse_rule(text: str) -> tuple[str, float | None]:
    """'relu' | 'threshold:0.1' | 'topk:0.1' -> (rule, target_fraction)."""
    m = re.fullmatch(r"(relu|threshold|topk)(?::([0-9.]+))?", text.strip())
    if not m:
        raise FlashsimError(f"--sparsity {text!r}: use relu, threshold:FRACTION or topk:FRACTION (e.g. topk:0.1)")
    rule, frac = m.group(1), m.group(2)
    if rule == "relu":
        if frac is not None:
            raise FlashsimError("--sparsity relu takes no fraction (active means a > 0)")
        return rule, None
    if frac is None:
        raise FlashsimError(f"--sparsity {rule} needs a target fraction, e.g. {rule}:0.1")
    try:
        f = float(frac)
    except ValueError:
        raise FlashsimError(f"--sparsity {text!r}: {frac!r} is not a number; e.g. {rule}:0.1") from None
    if not 0 < f <= 1:
        raise FlashsimError(f"--sparsity {rule}:{frac}: the fraction must be in (0, 1]")
    return rule, f


def calibrate_threshold(abs_act: np.ndarray, target_fraction: float) -> float:
    """The |a| threshold at which the mean active fraction over these rows is `target_fraction`."""
    flat = np.asarray(abs_act, dtype=np.float32).ravel()
    return float(np.quantile(flat, 1.0 - target_fraction, method="higher"))


def active_mask(act: np.ndarray, rule: str, target_fraction: float | None = None,
                threshold: float | None = None) -> np.ndarray:
    """bool [T, N] activity of one layer under `rule` (threshold must be given for 'threshold')."""
    act = np.asarray(act)
    if rule == "relu":
        return act > 0
    a = np.abs(act)
    if rule == "threshold":
        if threshold is None:
            raise ValueError("threshold rule needs a calibrated threshold")
        return a >= threshold
    if rule == "topk":
        assert target_fraction is not None
        k = max(1, math.ceil(target_fraction * a.shape[-1]))
        part = np.argpartition(-a, k - 1, axis=-1)[..., :k]
        out = np.zeros(a.shape, bool)
        np.put_along_axis(out, part, True, axis=-1)
        return out
    raise ValueError(f"unknown rule {rule!r}")
