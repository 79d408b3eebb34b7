"""`static-window`: drop no block; keep a fixed resident set of FFN neurons, stream the rest from flash.

The memory-for-speed baseline: quality stays the dense model's (no block is dropped and every FFN
neuron is computed), and the FFN weights that do not fit are read from flash every step. The resident
set is sized once, at the first decision, to fit the budget in force then with the KV cache of the
workload's last step, and never changes; if the budget later falls below it, it violates.

Which simulator policy: `hybrid` (a fixed set of n FFN neurons per layer resident, the rest read
through a one-layer buffer every step) with `predictor=none` (dense FFN compute). LLM in a flash's
`window` policy is not used: it needs activation sparsity (a predictor), whose quality loss the GSI
estimate cannot express, and with dense compute every neuron is needed every step, so a sliding
window degenerates into an LRU cache that a cyclic access pattern thrashes (no hits at all).

DRAM of the hybrid residency (the simulator's accounting, sim/engine.py `_memory_model`):
non-FFN weights + n x L x neuron bytes + the one-layer stream buffer (N - n) x neuron bytes + KV, so
n = floor((available - non_ffn - KV_max - N x neuron_bytes) / ((L - 1) x neuron_bytes)), clipped to
[0, N]. The episode charges the simulator's own per-step DRAM record (`resident_bytes`).
"""

from __future__ import annotations

import numpy as np

from adapt.controllers.base import AdaptState
from devices.model_spec import ModelSpec


class StaticWindow:
    name = "static-window"

    def __init__(self, spec: ModelSpec, kv_tokens_max: int):
        self.spec, self.kv_tokens_max = spec, int(kv_tokens_max)
        self.resident_neurons: int | None = None

    def reset(self) -> None:
        self.resident_neurons = None

    def neurons_for(self, available_bytes: int) -> int:
        s = self.spec
        nb, L, N = s.ffn_neuron_bytes, s.n_layers, s.d_ff
        free = available_bytes - s.non_ffn_bytes - self.kv_tokens_max * s.kv_bytes_per_token - N * nb
        if L == 1:
            return N if free >= 0 else 0
        return int(np.clip(free // ((L - 1) * nb), 0, N))

    def sim_settings(self, state: AdaptState) -> tuple[str, ...]:
        s = self.spec
        n = self.resident_neurons = self.neurons_for(state.available_bytes)
        # hybrid.fraction is a share of ALL weights: non-FFN first, then n neurons in every layer; half a
        # neuron of slack so the policy's floor() lands on n exactly
        frac = min(1.0, (s.non_ffn_bytes + (n + 0.5) * s.n_layers * s.ffn_neuron_bytes) / s.total_weight_bytes)
        return ("residency=hybrid", "predictor=none", f"hybrid.fraction={frac!r}")

    def decide(self, state: AdaptState) -> np.ndarray:
        return np.zeros(len(state.importance), bool)
