"""An out-of-tree policy for the registry test (loaded as 'tests.sim.plugin_policy:EveryOtherPredictor')."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim import bitsets
from sim.params import param
from sim.policies.base import Predictor


class EveryOtherPredictor(Predictor):
    """Computes the active neurons with an even index only."""

    @dataclass(frozen=True)
    class Params:
        offset: int = param(0, "0: even neurons, 1: odd neurons")

    def predict(self, layer, steps, needed):  # type: ignore[no-untyped-def]
        keep = np.zeros(self.ctx.n_neurons, bool)
        keep[self.params.offset::2] = True
        return needed & bitsets.pack(keep)
