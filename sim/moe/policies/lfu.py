"""LFU expert cache: evict the expert used the fewest times so far (ties: the least recent)."""

from __future__ import annotations

import numpy as np

from sim.moe.base import CacheContext, ExpertCache, register


@register("lfu")
class LfuCache(ExpertCache):
    """Keep-priority = uses so far, then the step of the last use."""

    vectorised = True

    def bind(self, ctx: CacheContext) -> None:
        super().bind(ctx)
        self.count = np.zeros(ctx.n_keys, np.int64)
        self.last = np.full(ctx.n_keys, -1, np.int64)
        self.n_steps = len(ctx.steps_keys) + 1

    def touch(self, step: int, keys: np.ndarray) -> None:
        self.count[keys] += 1
        self.last[keys] = step

    def score(self, step: int, keys: np.ndarray) -> np.ndarray:
        return self.count[keys].astype(np.float64) * self.n_steps + self.last[keys]

    def touch_many(self, steps: np.ndarray, keys: np.ndarray) -> None:
        self.count[keys] += 1                       # keys of one token are distinct across its layers
        self.last[keys] = steps[:, None]

    def score_many(self, steps: np.ndarray, keys: np.ndarray) -> np.ndarray:
        return self.count[keys].astype(np.float64) * self.n_steps + self.last[keys]
