"""Pinned hot experts: a static set, chosen from a profile of expert use and loaded before the first
token, never changed (mlx-moe pins the experts its profiling prompts used most). Misses are read into
the staging buffer and dropped after use.

`profile_tokens`: the profile is the first N tokens of the trace (0: the whole trace, an oracle
frequency profile that bounds what any static set can do on this trace).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.moe.base import ExpertCache, register


@register("pinned")
class PinnedCache(ExpertCache):
    """The `capacity` most used experts (per layer, or in all) of the profile stay; nothing else enters."""

    vectorised = True
    admits_any = False

    @dataclass(frozen=True)
    class Params:
        profile_tokens: int = 0

        def __post_init__(self) -> None:
            if self.profile_tokens < 0:
                raise ValueError(f"profile_tokens must be >= 0, got {self.profile_tokens}")

    def initial(self) -> np.ndarray:
        ctx = self.ctx
        assert ctx is not None
        steps = ctx.steps_keys
        if self.params.profile_tokens:
            steps = steps[: self.params.profile_tokens * ctx.n_layers]
        counts = np.bincount(steps.ravel(), minlength=ctx.n_keys).astype(np.int64)
        keys = np.arange(ctx.n_keys)
        if ctx.scope == "global":
            order = np.lexsort((keys, -counts))
            return np.sort(order[: ctx.capacity])
        c = counts.reshape(ctx.n_layers, ctx.n_experts)
        top = np.argsort(-c, axis=1, kind="stable")[:, : min(ctx.capacity, ctx.n_experts)]
        return np.sort((top + (np.arange(ctx.n_layers) * ctx.n_experts)[:, None]).ravel())

    def admit(self, step: int, keys: np.ndarray) -> np.ndarray:
        return np.zeros(len(keys), bool)

    def score(self, step: int, keys: np.ndarray) -> np.ndarray:
        return np.zeros(len(keys))

    def touch_many(self, steps: np.ndarray, keys: np.ndarray) -> None:
        pass
