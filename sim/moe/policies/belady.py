"""Belady's offline optimum: the bound on every expert cache's hit rate for a trace and capacity.

After each step the cache may hold any subset of its residents and the experts just used (a missed
expert is read into the staging buffer and may be kept or dropped). Keeping the `capacity` experts
whose next use is nearest maximises hits (Belady 1966, MIN with bypass): any online policy is one
choice among those subsets, so its hits are at most Belady's on the same trace. The walk starts
warm: the cache is loaded before the first token with the experts used first (a preloaded policy,
such as a pinned set, starts warm too, so the bound holds for it as well).
"""

from __future__ import annotations

import numpy as np

from sim.moe.base import CacheContext, ExpertCache, register


def next_use(steps_keys: np.ndarray, n_keys: int) -> np.ndarray:
    """[S, K]: the step at which each access's key is used next (S when never again)."""
    S, K = steps_keys.shape
    flat = steps_keys.ravel()
    step = np.repeat(np.arange(S), K)
    order = np.lexsort((step, flat))                     # by key, then by step
    nxt = np.full(flat.size, S, np.int64)
    same = flat[order[1:]] == flat[order[:-1]]
    nxt[order[:-1][same]] = step[order[1:][same]]
    return nxt.reshape(S, K)


@register("belady")
class BeladyCache(ExpertCache):
    """Keep the experts used soonest again; bypass those used later than every resident one."""

    def bind(self, ctx: CacheContext) -> None:
        super().bind(ctx)
        self.nxt = next_use(ctx.steps_keys, ctx.n_keys)
        self.never = len(ctx.steps_keys)
        self.next = np.full(ctx.n_keys, self.never, np.int64)

    def initial(self) -> np.ndarray:
        ctx = self.ctx
        assert ctx is not None
        first = np.full(ctx.n_keys, self.never, np.int64)
        steps = np.repeat(np.arange(len(ctx.steps_keys)), ctx.steps_keys.shape[1])
        np.minimum.at(first, ctx.steps_keys.ravel(), steps)
        keys = np.arange(ctx.n_keys)
        if ctx.scope == "global":
            pick = np.lexsort((keys, first))[: ctx.capacity]
        else:
            f = first.reshape(ctx.n_layers, ctx.n_experts)
            top = np.argsort(f, axis=1, kind="stable")[:, : min(ctx.capacity, ctx.n_experts)]
            pick = (top + (np.arange(ctx.n_layers) * ctx.n_experts)[:, None]).ravel()
        pick = pick[first[pick] < self.never]
        self.next[pick] = first[pick]
        return np.sort(pick)

    def touch(self, step: int, keys: np.ndarray) -> None:
        self.next[keys] = self.nxt[step]

    def score(self, step: int, keys: np.ndarray) -> np.ndarray:
        return -self.next[keys].astype(np.float64)

    def choose(self, step: int, missed: np.ndarray, pool: np.ndarray, keys: np.ndarray,
               room: int) -> tuple[np.ndarray, np.ndarray]:
        both = np.concatenate([pool, missed])
        nu = self.next[both]
        order = np.lexsort((both, nu))
        keep = both[order[: room + len(pool)]]
        keep = keep[self.next[keep] < self.never]
        return missed[np.isin(missed, keep)], pool[~np.isin(pool, keep)]
