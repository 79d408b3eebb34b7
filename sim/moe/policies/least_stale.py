"""Least-Stale expert cache (SpecMD, Hoang et al. 2026, arXiv 2602.03921), as we implement it.

In a cache shared by all MoE layers, decode visits layers cyclically; LRU then evicts the experts of
the layers the decode is about to reach (their last use, one token ago, is the oldest), so a cache
smaller than one pass's working set misses on nearly every access ("collision misses"). Least-Stale
ranks experts by staleness instead: the token of the last use first (an expert used for the current
token is fresh and stays), and among equally stale experts it evicts the one whose layer the decode
has just passed: its next possible use is a whole pass away, while the layer about to come may
need its experts within a few layers. In a per-layer cache every candidate belongs to the current
layer, so the rule reduces to LRU by token.
"""

from __future__ import annotations

import numpy as np

from sim.moe.base import register
from sim.moe.policies.lru import LruCache


@register("least-stale")
class LeastStaleCache(LruCache):
    """Keep-priority = (token of the last use, closeness of the expert's layer ahead of the decode); the
    last use of every expert is kept as LRU keeps it."""

    def score(self, step: int, keys: np.ndarray) -> np.ndarray:
        return self.score_many(np.asarray(step), keys)

    def score_many(self, steps: np.ndarray, keys: np.ndarray) -> np.ndarray:
        assert self.ctx is not None
        M, E = self.ctx.n_layers, self.ctx.n_experts
        last_token = np.where(self.last[keys] >= 0, self.last[keys] // M, -1)
        layer = keys // E
        now = (np.asarray(steps) % M).reshape(np.shape(steps) + (1,) * (keys.ndim - np.ndim(steps)))
        ahead = (layer - now - 1) % M + 1               # steps until the decode reaches that layer: 1..M
        return last_token.astype(np.float64) * (M + 1) + (M - ahead)
