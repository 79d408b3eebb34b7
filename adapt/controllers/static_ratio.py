"""`static-ratio`: drop a fixed fraction of the blocks, least important first, once; never adapt.

The baseline of a fixed pruning ratio (RAP): at the first decision it drops the round(ratio x 2L)
least important blocks (the importance order of the GSI file) and keeps that set for the whole
episode, whatever the budget does. It may exceed the budget; the evaluation reports it as failing
when it does. Sizes in bytes.
"""

from __future__ import annotations

import numpy as np

from adapt.controllers.base import AdaptState
from devices.errors import FlashsimError


class StaticRatio:
    name = "static-ratio"

    def __init__(self, ratio: float = 0.25):
        if not 0.0 <= ratio <= 1.0:
            raise FlashsimError(f"--static-ratio {ratio}: must be in [0, 1]")
        self.ratio = ratio
        self._mask: np.ndarray | None = None

    def reset(self) -> None:
        self._mask = None

    def decide(self, state: AdaptState) -> np.ndarray:
        if self._mask is None:
            n = len(state.importance)
            k = int(round(self.ratio * n))
            mask = np.zeros(n, bool)
            mask[np.argsort(state.importance, kind="stable")[:k]] = True
            self._mask = mask
        return self._mask.copy()
