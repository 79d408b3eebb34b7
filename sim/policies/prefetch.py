"""Prefetch slot: read neurons before the step that needs them, so flash reads overlap compute.

- `none`: nothing is read ahead; every read is a demand read that stalls the layer.
- `lookahead` (next layer, Deja Vu style): while layer l-1 computes, predict layer l's set of the
  SAME step and read what is not resident.
- `delta` (NeuroPrefetcher): while a step computes layer l, predict the NEXT step's set of layer l
  and read its delta (predicted, not resident). One full step of compute to hide the reads.

The prediction is the computed set of the target step seen through `recall`/`precision` noise
(1/1 = perfect foresight). Mispredicted neurons are read on demand at the step (a stall);
false positives cost bytes and DRAM and are dropped after the step. A prefetch that has not
arrived when the layer needs it stalls the layer until it lands: that depends on how busy flash
is, so these policies have timing feedback (no analytic fast path).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.params import check, param
from sim.policies.base import IssuePoint, Prefetcher
from sim.policies.predictor import noisy_sets
from sim.policies.registry import PREFETCHERS
from sim.workload import StepSlice


@PREFETCHERS.register("none")
class NoPrefetcher(Prefetcher):
    """Read nothing ahead."""

    trigger = IssuePoint.NONE

    def predict(self, layer: int, steps: StepSlice, computed: np.ndarray) -> np.ndarray:
        return np.zeros_like(computed)


class _PredictingPrefetcher(Prefetcher):
    timing_feedback = True

    @dataclass(frozen=True)
    class Params:
        recall: float = param(1.0, "fraction of the target step's computed neurons the prefetch predicts")
        precision: float = param(1.0, "fraction of prefetch-predicted neurons the step really computes")

        def __post_init__(self) -> None:
            check(0.0 <= self.recall <= 1.0, f"recall must be in [0, 1], got {self.recall}")
            check(0.0 < self.precision <= 1.0, f"precision must be in (0, 1], got {self.precision}")

    def predict(self, layer: int, steps: StepSlice, computed: np.ndarray) -> np.ndarray:
        assert self.ctx is not None
        p = self.params
        if p.recall == 1.0 and p.precision == 1.0:
            return computed
        rng = self.state.get(layer)
        if rng is None:
            rng = self.state[layer] = self.ctx.rng.fresh(f"prefetch/{self.name}/layer{layer}")
        return noisy_sets(rng, computed, self.ctx.n_neurons, p.recall, p.precision)


@PREFETCHERS.register("lookahead")
class LookaheadPrefetcher(_PredictingPrefetcher):
    """Predict the next layer of the same step; read it while this layer computes."""

    trigger = IssuePoint.PREVIOUS_LAYER


@PREFETCHERS.register("delta")
class DeltaPrefetcher(_PredictingPrefetcher):
    """Predict the next step's set of this layer; read its delta while this step computes."""

    trigger = IssuePoint.PREVIOUS_STEP
