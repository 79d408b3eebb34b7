"""PolicyStack: the five slot policies composed into per-layer plans. Shared by both backends.

`plan(layer, steps, cap_neurons)` answers, for a range of steps of one layer, everything the trace
and the policies decide (no time involved):

    needed    true active sets (union over each step's tokens)
    computed  predictor's sets, restricted to what the residency allows (SelectInfer)
    demand    computed dynamic neurons not resident: read before the FFN
    prefetch  neurons read ahead for the NEXT step (row s: issued during step s, or at layer l-1 of
              step s+1 with a previous-layer trigger; the sets are the same, only the time differs)

The simulator calls it with whole ranges (vectorised); the real backend calls it with one step at a
time. Each step's predictor output is computed exactly once (the prefetcher needs the next step's
computed set, so one step of lookahead is kept per layer), which makes both call patterns identical.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sim import bitsets
from sim.policies.base import (
    CacheSteps,
    Layout,
    PolicyContext,
    Precision,
    Predictor,
    Prefetcher,
    Residency,
)
from sim.workload import StepSlice


@dataclass
class LayerPlan:
    """Decisions for S steps of one layer. Counts are neurons; words are packed sets [S, W]."""

    needed: np.ndarray
    computed: np.ndarray
    demand: np.ndarray
    prefetch_next: np.ndarray
    cache: CacheSteps
    static_hits: np.ndarray      # int [S]: computed neurons in the static set

    @property
    def hits(self) -> np.ndarray:
        return self.cache.hits + self.static_hits


class PolicyOutputError(TypeError):
    """A policy returned something malformed (a bug in that policy, not bad user input)."""


def _check_rows(policy: object, what: str, rows: np.ndarray, S: int, W: int, pad: np.uint64) -> None:
    """Sets of S steps: words [S, W] of uint64 with no bit beyond the layer's neurons."""
    if not isinstance(rows, np.ndarray) or rows.dtype != bitsets.WORD or rows.shape != (S, W):
        raise PolicyOutputError(f"{type(policy).__name__}.{what} must return uint64 words of shape {(S, W)}, "
                                f"got {getattr(rows, 'dtype', type(rows))} {getattr(rows, 'shape', '')}")
    if S and np.any(rows[:, -1] & ~pad):
        raise PolicyOutputError(f"{type(policy).__name__}.{what} set bits beyond the layer's neurons")


class PolicyStack:
    """One policy per slot, bound to a run; plans layers over step ranges. Policy outputs are
    checked here, in one place: shapes and dtypes, no neuron outside the layer, and every demand
    read a computed neuron (so every computed neuron is resident or read)."""

    def __init__(self, residency: Residency, predictor: Predictor, layout: Layout, prefetch: Prefetcher,
                 precision: Precision):
        self.residency, self.predictor, self.layout = residency, predictor, layout
        self.prefetch, self.precision = prefetch, precision
        self.ctx: PolicyContext | None = None

    @property
    def policies(self) -> dict[str, Any]:
        return {"residency": self.residency, "predictor": self.predictor, "layout": self.layout,
                "prefetch": self.prefetch, "precision": self.precision}

    @property
    def timing_feedback(self) -> list[str]:
        """Slots whose policy has timing feedback (the fast path declines these)."""
        return [slot for slot, p in self.policies.items() if p.timing_feedback]

    def bind(self, ctx: PolicyContext) -> None:
        self.ctx = ctx
        for p in (self.precision, self.predictor, self.layout, self.prefetch, self.residency):
            p.bind(ctx)
        self._rows: dict[int, tuple[int, np.ndarray]] = {}
        self._static: dict[int, np.ndarray] = {}
        self._W = bitsets.n_words(ctx.n_neurons)
        self._pad = bitsets.full(ctx.n_neurons)[-1]

    # ---- snapshots (for callers that must re-run a range) -------------------------------------
    def snapshot(self) -> Any:
        return ({k: p.snapshot() for k, p in self.policies.items()},
                {k: (a, r.copy()) for k, (a, r) in self._rows.items()})

    def restore(self, snap: Any) -> None:
        states, rows = snap
        for k, p in self.policies.items():
            p.restore(states[k])
        self._rows = {k: (a, r.copy()) for k, (a, r) in rows.items()}

    # ---- planning -----------------------------------------------------------------------------
    def static_mask(self, layer: int) -> np.ndarray:
        m = self._static.get(layer)
        if m is None:
            m = self.residency.static_mask(layer)
            _check_rows(self.residency, "static_mask", np.asarray(m)[None, :], 1, self._W, self._pad)
            self._static[layer] = m
        return m

    def _steps(self, start: int, stop: int) -> StepSlice:
        assert self.ctx is not None
        return self.ctx.view.steps.slice(start, stop)

    def computed(self, layer: int, start: int, stop: int) -> np.ndarray:
        """words [stop-start, W]: computed sets; the predictor sees each step once, in order."""
        assert self.ctx is not None
        a0, rows = self._rows.get(layer, (start, np.zeros((0, bitsets.n_words(self.ctx.n_neurons)), bitsets.WORD)))
        have = a0 + len(rows)
        if start < a0 or start > have:
            raise ValueError(f"layer {layer}: steps must be planned in order (asked {start}, have [{a0}, {have}))")
        if stop > have:
            steps = self._steps(have, stop)
            needed = self.ctx.view.needed(layer, have, stop)
            new = self.predictor.predict(layer, steps, needed)
            _check_rows(self.predictor, "predict", new, stop - have, self._W, self._pad)
            allowed = self.residency.allowed(layer, steps)
            if allowed is not None:
                _check_rows(self.residency, "allowed", allowed, stop - have, self._W, self._pad)
                new = new & allowed
            rows = np.concatenate([rows, new]) if len(rows) else new
        out = rows[start - a0: stop - a0]
        self._rows[layer] = (start, rows[start - a0:])
        return out

    def plan(self, layer: int, start: int, stop: int, cap_neurons: np.ndarray) -> LayerPlan:
        """Decisions for steps [start, stop) of `layer`; `cap_neurons` [S+1] is the cache share during
        each step and the next one (see Residency.advance)."""
        assert self.ctx is not None
        n_steps = self.ctx.view.steps.n
        steps = self._steps(start, stop)
        needed = self.ctx.view.needed(layer, start, stop)
        static = self.static_mask(layer)
        has_static = bool(static.any())
        fires = self.prefetch.fires()
        look = min(stop + 1, n_steps) if fires else stop
        rows = self.computed(layer, start, look)
        C = rows[: stop - start]
        C_dyn = bitsets.andnot(C, static) if has_static else C
        hint = None
        if fires:
            nxt = rows[1:]
            hint = np.zeros_like(C)
            if len(nxt):
                pred = self.prefetch.predict(layer, self._steps(start + 1, start + 1 + len(nxt)), nxt)
                _check_rows(self.prefetch, "predict", pred, len(nxt), self._W, self._pad)
                hint[: len(nxt)] = bitsets.andnot(pred, static) if has_static else pred
        cache = self.residency.advance(layer, steps, C_dyn, hint, np.asarray(cap_neurons, np.int64))
        S = stop - start
        _check_rows(self.residency, "advance().demand", cache.demand, S, self._W, self._pad)
        _check_rows(self.residency, "advance().prefetch", cache.prefetch, S, self._W, self._pad)
        if np.any(bitsets.andnot(cache.demand, C_dyn)):
            raise PolicyOutputError(f"{type(self.residency).__name__}.advance: a demand read is not a computed neuron")
        static_hits = bitsets.count(C & static) if has_static else np.zeros(len(C), np.int64)
        return LayerPlan(needed=needed, computed=C, demand=cache.demand, prefetch_next=cache.prefetch,
                         cache=cache, static_hits=static_hits)
