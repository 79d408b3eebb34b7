"""LRU expert cache: evict the expert whose last use is the oldest (the llama.cpp forks' LRU slots)."""

from __future__ import annotations

import numpy as np

from sim.moe.base import CacheContext, ExpertCache, register


@register("lru")
class LruCache(ExpertCache):
    """Keep-priority = the step of the last use."""

    vectorised = True

    def bind(self, ctx: CacheContext) -> None:
        super().bind(ctx)
        self.last = np.full(ctx.n_keys, -1, np.int64)

    def touch(self, step: int, keys: np.ndarray) -> None:
        self.last[keys] = step

    def score(self, step: int, keys: np.ndarray) -> np.ndarray:
        return self.last[keys].astype(np.float64)

    def touch_many(self, steps: np.ndarray, keys: np.ndarray) -> None:
        self.last[keys] = steps[:, None]

    def score_many(self, steps: np.ndarray, keys: np.ndarray) -> np.ndarray:
        return self.last[keys].astype(np.float64)
