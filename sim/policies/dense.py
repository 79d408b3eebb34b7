"""`dense`: every weight resident in DRAM; nothing is read during the run (the upper bound).

The run fails up front (exit 2, with the shortfall in bytes) when the model and KV cache do not fit
the budget. Combine with `precision=quantized` for the llama.cpp-style int8/int4 baseline.
"""

from __future__ import annotations

import numpy as np

from sim import bitsets
from sim.policies.base import Residency
from sim.policies.cache import CachedResidency
from sim.policies.registry import RESIDENCY


@RESIDENCY.register("dense")
class DenseResidency(CachedResidency, Residency):
    """All FFN neurons static (loaded before the first token)."""

    def gathers_at(self, n_computed: np.ndarray) -> np.ndarray:
        """The whole FFN sits in DRAM in neuron order: a layer computing every neuron runs dense on
        it in place; a sparser predictor's subset is gathered out of it."""
        assert self.ctx is not None
        return np.asarray(n_computed) < self.ctx.n_neurons

    def window_k(self) -> int | None:
        return 0

    def static_mask(self, layer: int) -> np.ndarray:
        assert self.ctx is not None
        return bitsets.full(self.ctx.n_neurons)
