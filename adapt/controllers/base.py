"""The controller interface: the state a controller sees at a decision point and what it returns.

An episode (adapt/episode.py) calls `Controller.decide(state)` at every decision point (every
`decide_every` decode steps and at every budget change); the returned bool [2L] mask is the new
dropped set (True = dropped), applied before the step's footprint is checked against
`state.available_bytes`. Block i is sim.blocks' block i (2*l: "mha:l", 2*l+1: "ffn:l").
Sizes in bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from sim.blocks import BlockMemory


@dataclass(frozen=True)
class AdaptState:
    """What a controller sees at a decision point."""

    step: int                     # decode step index
    batch: int                    # sequences decoded together
    seq_len: int                  # tokens in context per sequence now (prompt + generated)
    kv_tokens: int                # KV entries over all sequences now
    available_bytes: int          # memory available now (from the timeline)
    importance: np.ndarray        # float64 [2L], higher = more important (adapt.importance)
    dropped: np.ndarray           # bool [2L]: currently dropped
    blocks: BlockMemory


@runtime_checkable
class Controller(Protocol):
    """Decides the dropped set; `reset` starts a new episode (controllers may keep state)."""

    name: str

    def reset(self) -> None: ...

    def decide(self, state: AdaptState) -> np.ndarray: ...   # the new dropped mask, bool [2L]
