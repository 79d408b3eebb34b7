"""Cache-aware routing (Skliar et al., 'Mixture of Cache-Conditional Experts for Efficient Mobile
Device Inference', arXiv 2412.00099): the router prefers experts already in the cache, trading a
little quality for hits. Replacement is LRU.

Model on a routing trace (which holds the top-k and their weights, not the full logits): at each
step, up to `max_swaps` missed experts of rank >= `protect_top` whose router weight is below
`max_weight` (lowest weight first) are replaced by the most recently used cached expert of the
same layer that the token did not pick. The quality cost is reported as the router-weight mass
replaced (mean over tokens and layers): the share of the MoE output the swapped experts carried.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.moe.base import register
from sim.moe.policies.lru import LruCache


@register("cache-aware")
class CacheAwareRouting(LruCache):
    """LRU replacement plus swaps of low-weight missed experts for cached ones."""

    reroutes = True

    @dataclass(frozen=True)
    class Params:
        max_swaps: int = 1
        protect_top: int = 1
        max_weight: float = 0.25

        def __post_init__(self) -> None:
            if self.max_swaps < 0 or self.protect_top < 0:
                raise ValueError("max_swaps and protect_top must be >= 0")
            if not 0 < self.max_weight <= 1:
                raise ValueError(f"max_weight must be in (0, 1], got {self.max_weight}")

    def reroute(self, step: int, keys: np.ndarray, weights: np.ndarray,
                resident: np.ndarray) -> tuple[np.ndarray, float]:
        ctx = self.ctx
        assert ctx is not None
        p = self.params
        E = ctx.n_experts
        lo = int(keys[0] // E) * E                        # the same layer's experts
        out = keys.copy()
        rank = np.arange(len(keys))
        swap = (~resident[keys]) & (rank >= p.protect_top) & (weights < p.max_weight)
        idx = rank[swap][np.argsort(weights[swap], kind="stable")][: p.max_swaps]
        if not len(idx):
            return keys, 0.0
        cached = np.flatnonzero(resident[lo:lo + E]) + lo
        cached = cached[~np.isin(cached, keys)]
        if not len(cached):
            return keys, 0.0
        cached = cached[np.argsort(-self.last[cached], kind="stable")]
        n = min(len(idx), len(cached))
        out[idx[:n]] = cached[:n]
        total = float(weights.sum()) or 1.0
        return out, float(weights[idx[:n]].sum()) / total
