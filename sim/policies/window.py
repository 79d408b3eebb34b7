"""`window`: LLM in a flash's sliding window. Neurons computed in the last k steps stay resident;
each step reads only the delta (computed now, not resident). k = 'inf' keeps every neuron ever
computed, which under a DRAM cap is exactly an LRU neuron cache of the cap's size.

The cache is one preallocated matrix per layer (shares of the DRAM left after the fixed weights
and the KV cache: equal, or split by the trace with `memory.cache_split`, see
sim/policies/cache_shares.py). Evicting moves the last rows into the holes and new neurons are copied
in after them (LLM in a flash, Sec. 3.3): `memory_mgmt` time = bytes moved / DRAM bandwidth.
When the cap binds, least-recently-used neurons are dropped first (see `sim.policies.cache`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from sim.params import check, param
from sim.policies.base import Residency
from sim.policies.cache import CachedResidency
from sim.policies.registry import RESIDENCY


@RESIDENCY.register("window")
class WindowResidency(CachedResidency, Residency):
    """Keep the neurons computed in the last k steps; read the delta."""

    manages_cache = True

    @dataclass(frozen=True)
    class Params:
        k: int | Literal["inf"] = param(5, "window length in steps: neurons computed in the last k "
                                           "steps stay resident (0: none, 'inf': all, an LRU under the cap)")
        insert_copy: bool = param(True, "new neurons are read into a staging buffer and copied into "
                                        "the layer matrix (LLM in a flash); false: read in place")

        def __post_init__(self) -> None:
            check(self.k == "inf" or (isinstance(self.k, int) and self.k >= 0),
                  f"k must be an integer >= 0 or 'inf', got {self.k!r}")

    def window_k(self) -> int | None:
        return None if self.params.k == "inf" else int(self.params.k)

    def copies_on_insert(self) -> bool:
        return bool(self.params.insert_copy)

    def params_for_in_place_reads(self) -> WindowResidency.Params:
        return replace(self.params, insert_copy=False) if self.params.insert_copy else self.params
