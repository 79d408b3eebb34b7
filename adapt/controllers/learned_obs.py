"""The observation of the learned RAP controller: what the Q-network sees at each block of a pass.

Owns the layout (`OBS_NAMES`, version `OBS_VERSION`), the block visiting order (`visiting_order`,
`VISITS`), the entries fixed for one decision point (`pass_context` -> `PassContext`) and the rows
for given positions and dynamic state (`observations`). Used by the controller
(adapt/controllers/learned.py) and by the training environment (adapt/env.py), so that both
see the same numbers.

Every entry is computed from the `AdaptState` alone, so the same policy runs for any layer count
and any model. Sizes are fractions of `full_need` = the footprint with nothing dropped (all weights
+ the KV cache of `kv_tokens` entries), so the policy sees a scale-free problem.

    idx name              value (float32)
     0  log_batch         log2(batch) / 8                      (batch 256 -> 1)
     1  log_seq_len       log2(seq_len) / 15                   (32768 tokens -> 1)
     2  kv_share          KV bytes with nothing dropped / full_need (0: weight-bound, ->1: KV-bound)
     3  available         available_bytes / full_need
     4  plan              footprint of the current plan / full_need (blocks decided "drop" so far are
                          dropped; every block not yet visited is kept)
     5  excess            (plan - available) / full_need; > 0 means the plan does not fit yet
     6  importance        importance of block i (adapt.importance: rank in (0, 1])
     7  block_bytes       block i's weights + its KV (kv_tokens x KV bytes per token) / full_need
     8  is_mha            1 for an attention block, 0 for an FFN block
     9  visited           blocks visited before i / 2L
    10  dropped_frac      blocks dropped so far / 2L
    11  importance_lost   sum of the importance of the blocks dropped so far / sum over all blocks
    12  excess_if_drop    (plan - block_bytes - available) / full_need: the memory estimate of "drop"
    13  droppable_after   bytes of the blocks visited after i / full_need
    14  excess_if_keep    (plan - droppable_after - available) / full_need: > 0 means that keeping
                          block i cannot fit even if every later block is dropped
Entries 0, 1 and 3 are clipped to [0, 4] (a budget of 4x the need is as good as infinite), so
every entry lies in [-OBS_BOUND, OBS_BOUND] = [-6, 6] (the gymnasium Box bounds) without clipping
the rest: the entries that depend on earlier choices (4, 5, 10, 11, 12, 14) are then affine in
(plan, dropped count, importance lost), which `decide_pass` (adapt/controllers/learned.py) uses to score positions cheaply.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from adapt.controllers.base import AdaptState

OBS_VERSION = 1
OBS_NAMES = (
    "log_batch", "log_seq_len", "kv_share", "available", "plan", "excess", "importance",
    "block_bytes", "is_mha", "visited", "dropped_frac", "importance_lost", "excess_if_drop",
    "droppable_after", "excess_if_keep",
)
OBS_DIM = len(OBS_NAMES)
OBS_BOUND = 6.0     # |entry| <= 4 + 1 + 1: see the docstring
STATIC_CLIP = 4.0   # entries 0, 1, 3 (batch, seq_len, available) are clipped to [0, 4]
VISITS = ("importance", "per-byte")


@dataclass(frozen=True, eq=False)
class PassContext:
    """The quantities of one decision point that no choice of the pass changes."""

    order: np.ndarray           # int64 [2L]: visiting order (ascending importance; ties: block index)
    static: np.ndarray          # float64 [2L, OBS_DIM]: the entries fixed for the pass, by position
    block_bytes: np.ndarray     # int64 [2L]: weights + KV of each block, in visiting order
    block_frac: np.ndarray      # float64 [2L]: block_bytes / full_need
    imp_frac: np.ndarray        # float64 [2L]: importance / sum(importance), in visiting order
    after_frac: np.ndarray      # float64 [2L]: droppable_after (entry 13)
    available_frac: float       # entry 3 (clipped)
    available_bytes: int
    full_bytes: int             # full need: every block kept (weights + KV) + always-resident bytes
    n_blocks: int


def visiting_order(state: AdaptState, visit: str = "importance") -> np.ndarray:
    """int64 [2L] block indices in visiting order: ascending importance ("importance") or ascending
    importance per byte freed ("per-byte": weights + KV at kv_tokens); ties: lower block index."""
    return _order(state, np.asarray(state.importance, np.float64), visit)[0]


def _order(state: AdaptState, imp: np.ndarray, visit: str) -> tuple[np.ndarray, np.ndarray]:
    """(visiting order, bytes each block frees in block order)."""
    blocks = state.blocks
    if imp.shape != (len(blocks.names),):
        raise ValueError(f"importance must have shape ({len(blocks.names)},), got {imp.shape}")
    each = blocks.weight_bytes + blocks.kv_bytes_per_token * int(state.kv_tokens)
    if visit == "per-byte":
        key = imp / np.maximum(each, 1)
    elif visit == "importance":
        key = imp
    else:
        raise ValueError(f"visit must be one of {VISITS}, got {visit!r}")
    return np.argsort(key, kind="stable"), each      # stable: ties keep the lower block index first


def pass_context(state: AdaptState, visit: str = "importance") -> PassContext:
    """Everything of the observation that is fixed for one decision point."""
    blocks = state.blocks
    n = len(blocks.names)
    imp = np.asarray(state.importance, np.float64)
    order, each = _order(state, imp, visit)
    kv_tokens = int(state.kv_tokens)
    each = each[order]
    full = int(blocks.always_bytes + each.sum())
    block_frac = each / full
    after = np.concatenate([np.cumsum(block_frac[::-1])[::-1][1:], [0.0]])
    available_frac = min(state.available_bytes / full, STATIC_CLIP)
    imp_o = imp[order]
    static = np.zeros((n, OBS_DIM), np.float64)
    static[:, :4] = (min(math.log2(max(int(state.batch), 1)) / 8.0, STATIC_CLIP),
                     min(math.log2(max(int(state.seq_len), 1)) / 15.0, STATIC_CLIP),
                     int(blocks.kv_bytes_per_token.sum()) * kv_tokens / full, available_frac)
    static[:, 6] = imp_o
    static[:, 7] = block_frac
    static[:, 8] = order % 2 == 0
    static[:, 9] = _VISITED.get(n) if n in _VISITED else _VISITED.setdefault(n, np.arange(n) / n)
    static[:, 13] = after
    imp_sum = float(imp.sum()) or 1.0
    return PassContext(order, static, each, block_frac, imp_o / imp_sum, after, available_frac,
                       int(state.available_bytes), full, n)


_VISITED: dict[int, np.ndarray] = {}   # entry 9 by block count


def observations(ctx: PassContext, pos: np.ndarray, plan: np.ndarray, n_dropped: np.ndarray,
                 imp_lost: np.ndarray) -> np.ndarray:
    """float32 [k, OBS_DIM] for visiting positions `pos` under the given dynamic state (one value per
    row: plan = current footprint / full_need, n_dropped = blocks dropped so far, imp_lost = share of
    importance dropped so far)."""
    obs = ctx.static[pos].copy()
    excess = plan - ctx.available_frac
    obs[:, 4] = plan
    obs[:, 5] = excess
    obs[:, 10] = n_dropped / ctx.n_blocks
    obs[:, 11] = imp_lost
    obs[:, 12] = excess - ctx.block_frac[pos]
    obs[:, 14] = excess - ctx.after_frac[pos]
    return obs.astype(np.float32)
