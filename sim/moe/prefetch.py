"""Speculative prefetch of the next MoE layer's experts, with errors that persist from token to token.

Physics: during MoE layer m - 1, applying layer m's gate to the current hidden state predicts
layer m's experts before its attention has run (the residual stream changes little between
adjacent layers). The prediction is right for a share `accuracy` of the K experts; the hidden
state changes slowly along the text, so a slot mispredicted at token t tends to be mispredicted at
t + 1 too, with the same wrong expert.

Model, per MoE layer m >= 1 and rank j: an error indicator that is a two-state chain with the
stationary rate b = 1 - accuracy: P(error at t | error at t - 1) = b + (1 - b) * memory and
P(error at t | right at t - 1) = b * (1 - memory), so every token's expected accuracy is exactly
`accuracy` and `memory` (0: errors independent, 1: an error never ends) is the persistence. A slot
in error predicts a wrong expert drawn (uniformly from those the token did not pick) when the error
begins and kept while it lasts. The first MoE layer has no prediction (no earlier layer this token).

`accuracy` and `memory` are inputs: a measured figure (a captured routing trace with the
speculative gate's output) or a published one, named by whoever runs the simulation.
"""

from __future__ import annotations

import numpy as np

from devices.errors import FlashsimError


def speculative_sets(experts: np.ndarray, n_experts: int, accuracy: float, memory: float,
                     rng: np.random.Generator) -> np.ndarray:
    """int64 [T, M, K]: the predicted experts for each step (-1 for the first MoE layer)."""
    if not 0 <= accuracy <= 1:
        raise FlashsimError(f"prefetch accuracy must be in [0, 1], got {accuracy}")
    if not 0 <= memory < 1:
        raise FlashsimError(f"prefetch error memory must be in [0, 1), got {memory}")
    e = np.asarray(experts, np.int64)
    T, M, K = e.shape
    b = 1.0 - accuracy
    pred = np.full((T, M, K), -1, np.int64)
    err = np.zeros((M, K), bool)
    wrong = np.zeros((M, K), np.int64)
    for t in range(T):
        u = rng.random((M, K))
        p_err = np.where(err, b + (1 - b) * memory, b * (1 - memory)) if t else np.full((M, K), b)
        new_err = u < p_err
        fresh = new_err & ~err if t else new_err
        if fresh.any():
            # a wrong expert not in the token's set: offset the true id by 1..E-1, then resolve clashes
            draw = (e[t] + rng.integers(1, n_experts, (M, K))) % n_experts
            for _ in range(8):                       # redraw guesses that hit another of the token's experts
                clash = fresh & (draw[:, :, None] == e[t][:, None, :]).any(axis=2)
                if not clash.any() or n_experts <= K:
                    break
                draw = np.where(clash, (e[t] + rng.integers(1, n_experts, (M, K))) % n_experts, draw)
            wrong = np.where(fresh, draw, wrong)
        err = new_err
        p = np.where(err, wrong, e[t])
        pred[t] = p
    pred[:, 0] = -1
    return pred


def realised_accuracy(pred: np.ndarray, experts: np.ndarray) -> float:
    """Share of the true experts (layers with a prediction) that the prediction contained."""
    e = np.asarray(experts)[:, 1:]
    p = np.asarray(pred)[:, 1:]
    if not e.size:
        return 0.0
    hit = (e[..., :, None] == p[..., None, :]).any(axis=-1)
    return float(hit.mean())
