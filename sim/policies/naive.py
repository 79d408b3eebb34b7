"""`naive`: nothing of the FFN stays resident; every computed neuron is read from flash every step.

The baseline of LLM in a flash ("load the whole FFN from flash for each token"): with the `none`
predictor every FFN neuron is computed, so each step streams every layer's FFN through a buffer
of one layer and drops it. Reads go through the layout, so with coalescing a dense layer is read as
large contiguous chunks (the device's large-chunk throughput, ~sequential). Streaming the
attention/embedding weights too is `memory.stream_non_ffn=true` (the paper's naive reads the whole
model: 13.4 GB per token for OPT-6.7B).
"""

from __future__ import annotations

from sim.policies.base import Residency
from sim.policies.cache import CachedResidency
from sim.policies.registry import RESIDENCY


@RESIDENCY.register("naive")
class NaiveResidency(CachedResidency, Residency):
    """Stream every computed neuron every step (a window of 0 tokens, no managed cache)."""

    gathers = False

    def window_k(self) -> int | None:
        return 0
