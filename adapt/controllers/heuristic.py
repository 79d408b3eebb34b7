"""`heuristic`: drop the least important blocks until the footprint fits; restore when memory returns.

At each decision (footprint = BlockMemory.footprint_bytes(dropped, kv_tokens), bytes):
  * over budget: drop kept blocks one at a time until the footprint fits the available memory. Which
    block: `rule="importance"` the least important (the GSI removal order: RAP's heuristic);
    `rule="per-byte"` the smallest importance lost per byte saved (weights + the KV of an MHA block
    at the current kv_tokens), which favours large blocks. Then any dropped block that now fits
    again with the headroom is restored (dropping a large block may leave room for a small one).
  * under budget: restore dropped blocks, most important first, each only if the footprint after it
    stays <= (1 - headroom) x available. The headroom is the hysteresis: a restore that would fill
    the memory to the brim would be undone at the next KV growth or small dip, so the set would
    oscillate. A block that does not fit is skipped and smaller, less important ones are tried.
Never violates when a feasible set exists: dropping only lowers the footprint, so the drop loop
ends either fitting or with every block dropped (footprint = always_bytes, the least possible).
The episode calls `decide` whenever the KV cache outgrows the budget, so growth is handled too.

All weights are resident in RAP's setting, so there is no window or resident set to shrink; the
flash-streaming trade-off is the `static-window` baseline's.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from adapt.controllers.base import AdaptState
from devices.errors import FlashsimError

# 5% of the available memory: 25-35 decode steps of KV growth at batch 16 on SmolLM2-135M (360 KiB a step)
DEFAULT_HEADROOM = 0.05


class Heuristic:
    def __init__(self, rule: Literal["importance", "per-byte"] = "importance", headroom: float = DEFAULT_HEADROOM):
        if rule not in ("importance", "per-byte"):
            raise FlashsimError(f"heuristic rule {rule!r}: use importance or per-byte")
        if not 0.0 <= headroom < 1.0:
            raise FlashsimError(f"--headroom {headroom}: must be in [0, 1)")
        self.rule, self.headroom = rule, headroom
        self.name = "heuristic" if rule == "importance" else "heuristic-bytes"

    def reset(self) -> None:
        pass

    def decide(self, state: AdaptState) -> np.ndarray:
        blocks, kv, avail = state.blocks, state.kv_tokens, state.available_bytes
        d = np.asarray(state.dropped, bool).copy()
        saved = blocks.weight_bytes + blocks.kv_bytes_per_token * kv   # bytes each block frees, int64 [2L]
        fp = blocks.footprint_bytes(d, kv)
        imp = state.importance
        if fp > avail and not d.all():
            # the scores do not change within a decision, so dropping the lowest one at a time is one
            # stable sort (ties: the lower block index) and a cumulative sum of the bytes freed
            kept = np.flatnonzero(~d)
            score = imp[kept] if self.rule == "importance" else imp[kept] / np.maximum(saved[kept], 1)
            order = kept[np.argsort(score, kind="stable")]
            after = fp - np.cumsum(saved[order])           # footprint after dropping order[:i+1]
            fits = after <= avail
            n_drop = int(np.argmax(fits)) + 1 if fits.any() else len(order)
            d[order[:n_drop]] = True
            fp = int(after[n_drop - 1])
        limit = int((1.0 - self.headroom) * avail)
        cand = np.flatnonzero(d)[np.argsort(-imp[d], kind="stable")]   # most important first
        for b, freed in zip(cand.tolist(), saved[cand].tolist()):
            if fp + freed <= limit:
                d[b] = False
                fp += freed
        return d
