"""`hybrid`: a fixed part of the model resident in DRAM, the rest read whenever it is computed.

LLM in a flash's second baseline keeps half of the model in DRAM. `fraction` is the share of ALL
weights kept resident: the non-FFN weights (attention, embeddings, norms) count first, and FFN
neurons fill the rest, the same number in every layer. Which neurons: the first by index
(`select=first`: a layout that knows nothing) or the most frequently active in the replayed trace
(`select=hot`: an optimistic, profile-guided choice, noted in the results). Streamed neurons pass
through a one-layer buffer and are dropped (no cache).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from sim import bitsets
from sim.params import check, param
from sim.policies.base import Residency
from sim.policies.cache import CachedResidency
from sim.policies.registry import RESIDENCY


@RESIDENCY.register("hybrid")
class HybridResidency(CachedResidency, Residency):
    """Static resident FFN part sized by `fraction` of the model; the rest streamed."""

    @dataclass(frozen=True)
    class Params:
        fraction: float = param(0.5, "share of all model weights kept resident (non-FFN weights first, "
                                     "then FFN neurons, equally per layer)")
        select: Literal["first", "hot"] = param("first", "which FFN neurons are resident: first by index, "
                                                          "or the most often active in the trace (optimistic)")

        def __post_init__(self) -> None:
            check(0.0 <= self.fraction <= 1.0, f"fraction must be in [0, 1], got {self.fraction}")

    def window_k(self) -> int | None:
        return 0

    def resident_neurons_per_layer(self) -> int:
        assert self.ctx is not None
        spec = self.ctx.spec
        ffn_bytes = self.params.fraction * spec.total_weight_bytes - spec.non_ffn_bytes
        n = int(max(0.0, ffn_bytes) // (spec.n_layers * spec.ffn_neuron_bytes))
        return min(n, spec.d_ff)

    def bind(self, ctx) -> None:  # type: ignore[no-untyped-def]
        super().bind(ctx)
        if self.params.select == "hot":
            ctx.notes.append("hybrid: select=hot ranks neurons by their activation counts in the replayed "
                             "trace itself (optimistic: the choice has seen the test tokens)")

    def static_mask(self, layer: int) -> np.ndarray:
        assert self.ctx is not None
        n, N = self.resident_neurons_per_layer(), self.ctx.n_neurons
        mask = np.zeros(N, bool)
        if self.params.select == "first":
            mask[:n] = True
        else:
            counts = self.ctx.view.activation_counts(layer)
            mask[np.argsort(-counts, kind="stable")[:n]] = True
        return bitsets.pack(mask)
