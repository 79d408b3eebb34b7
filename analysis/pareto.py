"""Pareto fronts over result rows: the configurations no other one beats on every objective.

A row is dominated when another row is at least as good on every objective and strictly better on
one. Objectives are columns to maximize (tokens_per_s, activation_mass_kept) or to minimize
(dram_peak_bytes); rows with a missing objective are never on the front.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

_BLOCK = 1024  # rows compared at once: memory is _BLOCK * n booleans per objective


def pareto_mask(df: pd.DataFrame | Mapping[str, Any], maximize: Sequence[str] = (),
                minimize: Sequence[str] = ()) -> np.ndarray:
    """bool [len(df)]: True where the row is not dominated (ties are all kept). `df`: a DataFrame or
    a mapping of column name to values."""
    cols = [np.asarray(df[c], float) for c in maximize] + [-np.asarray(df[c], float) for c in minimize]
    if not cols:
        raise ValueError("give at least one objective")
    v = np.stack(cols, axis=1)  # every objective: larger is better
    valid = np.all(np.isfinite(v), axis=1)
    mask = valid.copy()
    good = v[valid]
    idx = np.flatnonzero(valid)
    for start in range(0, len(good), _BLOCK):
        block = good[start:start + _BLOCK]                              # [b, m]
        ge = np.all(good[None, :, :] >= block[:, None, :], axis=2)      # [b, n]: other >= this
        gt = np.any(good[None, :, :] > block[:, None, :], axis=2)
        mask[idx[start:start + _BLOCK]] = ~np.any(ge & gt, axis=1)
    return mask
