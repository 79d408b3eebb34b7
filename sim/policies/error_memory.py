"""Predictor errors with memory: the sets the `noisy` predictor outputs when its false positives and
misses repeat from step to step, as a real low-rank predictor's do.

Physics. A low-rank predictor maps the hidden state, which changes slowly along a sequence, to
scores per neuron. A neuron whose score sits near the threshold is over-predicted (or missed) on
many consecutive tokens, and some neurons are so for the whole text. Windowing keeps the previous
steps' computed neurons resident, so persistent false positives cost their bytes once instead of
every step.

Memory, the parameter. For an error of rate b (1 - recall for misses, q for false positives: the
probability that an inactive neuron is predicted), P(error at s+k | error at s) = b + (1 - b) *
m_k, where m_k (0: memoryless, 1: the error never changes) is the error's memory at distance k.
Measured on SmolLM2-135M's trained predictor (`flashsim real predictor-errors`), m_k is the same
at two thresholds whose false-positive rates differ twofold (0.34 and 0.71), while P(repeat)
itself moves from 0.61 to 0.83; and m_k stays nearly flat from k = 1 to 5 instead of decaying like
a one-step chain's m**k. So the parameters are m at k = 1 (`memory`) and at distant k
(`memory_far`, the floor the neurons' lasting biases hold up), and they carry over to other
rates, recalls and precisions.

Model, per layer and neuron. Whether a neuron is missed (when active: miss iff latent >= recall)
or added (when inactive: added iff latent < q_s, the false-positive rate that gives the expected
precision at step s) is decided by a latent uniform, one per error kind. Each step the latent is
kept from the previous step with probability lam; otherwise it is redrawn: to the neuron's lasting
score Z with probability a, else to a fresh uniform. Z (one per neuron, drawn once per run) is
shared by both kinds: a neuron the predictor likes is over-predicted when inactive AND caught when
active, as measured. The Z of a layer are stratified (a random permutation of N equal cells, one
uniform within each), so a run's share of neurons below any rate is that rate to within 1/N.

Every latent is uniform, so each step's recall and expected precision are exactly the configured
ones whatever the memory. For a constant rate, m_k = lam**k + (1 - lam**k) * a**2, so a**2 =
memory_far and lam = (memory - memory_far) / (1 - memory_far): any memory_far <= memory is
reachable; memory_far = 0 gives a one-step (Markov) chain; all 0 give fresh draws every step, the
memoryless predictor, whose sets `noisy_sets` draws identically. (A rate that varies with the
active count from step to step moves the realised figures slightly: a kept latent below q_s is
below q_{s+1} with probability min(1, q_{s+1} / q_s).)

Draws (all float32, row order): `rng` the fresh uniforms [S, N] (as `noisy_sets`); `memory_rng`
Z's cell permutation [N] and jitter [N] once, then per row two uniforms per neuron (miss, fp), each
deciding keep (below lam), else redraw to Z (below lam + (1 - lam) a), else take the fresh
uniform. Nothing is drawn from `memory_rng` when all four memories are 0. Rows
are processed in blocks that carry the state, so a range and the same steps one at a time give
identical sets.

Where errors are rare (a ReLU trace with a few % active and a good predictor: `sparse_applies`),
the same model is drawn sparsely by `sim.policies.sparse_errors`, at a cost that grows with the
error regions instead of with every neuron (other random numbers, same distribution).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim import bitsets
from sim.policies.scratch import work
from sim.policies.sparse_errors import (
    SPARSE_MAX_REGION,
    SparseErrorState,
    carry_kept,
    new_state,
    select,
    sparse_noisy_block,
)

# Cells per block of rows: the block's draws ([rows, 3, N] float32) and latents stay in cache.
BLOCK_CELLS = 1 << 18


def false_positive_rate(n_true: np.ndarray, n_bits: int, recall: float, precision: float) -> np.ndarray:
    """float64 [S]: the probability that an inactive neuron is predicted active, per row with
    n_true active neurons, such that the expected precision is `precision`."""
    n_true = np.asarray(n_true, np.float64)
    fp = recall * n_true * (1.0 - precision) / precision
    return np.where(n_bits - n_true > 0, fp / np.maximum(n_bits - n_true, 1), 0.0)


def mixture(memory: float, memory_far: float) -> tuple[float, float]:
    """(a, lam): the probability that a redraw takes the lasting score, and the probability of
    keeping the latent, that give the memory m_1 = memory and m_inf = memory_far (capped at memory)."""
    m = min(max(memory, 0.0), 1.0)
    far = min(max(memory_far, 0.0), m)
    lam = (m - far) / (1.0 - far) if far < 1.0 else 0.0
    return float(np.sqrt(far)), float(lam)


def implied_repeat(rate: float, memory: float, memory_far: float, k: int) -> float:
    """P(error at s+k | error at s) the model gives for a constant error rate."""
    a, lam = mixture(memory, memory_far)
    return rate + (1.0 - rate) * (lam ** k + (1.0 - lam ** k) * a * a)


def stratified_scores(rng: np.random.Generator, n: int) -> np.ndarray:
    """float32 [n]: each uniform on [0, 1), one in each cell [i/n, (i+1)/n), in random order."""
    cells = rng.permutation(n)
    return ((cells + rng.random(n)) / n).astype(np.float32)


@dataclass
class ErrorMemory:
    """A layer's state between calls (None before its first step)."""

    score: np.ndarray | None = None        # float32 [N]: each neuron's lasting score Z
    miss_chain: np.ndarray | None = None   # float32 [N]: the miss latent at the last step
    fp_chain: np.ndarray | None = None     # float32 [N]: the false-positive latent there
    sparse: SparseErrorState | None = None  # the sparse draws' state (sim/policies/sparse_errors.py)


@dataclass(frozen=True)
class Persistence:
    """Each error kind's memory at the next step and at distant steps (see the module docstring)."""

    fp: float = 0.0
    fp_far: float = 0.0
    fn: float = 0.0
    fn_far: float = 0.0

    @property
    def any(self) -> bool:
        return self.fp > 0 or self.fp_far > 0 or self.fn > 0 or self.fn_far > 0


def _latent(kind: str, u: np.ndarray, v: np.ndarray, a: float, lam: float, score: np.ndarray,
            before: np.ndarray | None) -> np.ndarray:
    """float32 [S + 1, N] (a work array named `kind`): row 0 the latent before the block (`before`, or
    anything at the run's first step), rows 1.. each step's latent, from the fresh uniforms `u`
    [S, N] and the deciding uniforms `v` [S, N]: keep (v < lam), else redraw to the score (v < lam +
    (1 - lam) a), else `u`."""
    full = work(kind, (u.shape[0] + 1, u.shape[1]), np.float32)
    full[1:] = u
    keep = np.less(v, np.float32(lam), out=work("keep", v.shape, bool))
    to_score = np.less(v, np.float32(lam + (1.0 - lam) * a), out=work("to_score", v.shape, bool))
    if before is None:                  # the run's first step: nothing to keep
        keep[:1] = False
        to_score[:1] = v[:1] < np.float32(a)
    else:
        full[0] = before
    select(to_score, score, full[1:])
    carry_kept(full, keep, lam)
    return full


def sparse_applies(recall: float, persistence: Persistence, q_cap: float | None) -> bool:
    """Whether the sparse draws serve: errors with memory, both error regions narrow (see
    sim/policies/sparse_errors.py) and latents not kept for long stretches."""
    if q_cap is None or not persistence.any:
        return False
    lams = (mixture(persistence.fn, persistence.fn_far)[1], mixture(persistence.fp, persistence.fp_far)[1])
    return q_cap + (1.0 - recall) <= SPARSE_MAX_REGION and max(lams) < 0.9


def persistent_noisy_sets(rng: np.random.Generator, memory_rng: np.random.Generator, truth: np.ndarray,
                          n_bits: int, recall: float, precision: float, persistence: Persistence,
                          memory: ErrorMemory, q_cap: float | None = None) -> np.ndarray:
    """words [S, W]: the sets a predictor of this recall, precision and error memory outputs
    for the true sets `truth` (words [S, W]), continuing from `memory` (updated in place).
    `q_cap`: an upper bound of the false-positive rate over the whole run (every call with this
    `memory`); where errors are rare (`sparse_applies`) it selects the sparse draws."""
    if sparse_applies(recall, persistence, q_cap):
        assert q_cap is not None
        if memory.score is None:
            memory.score = stratified_scores(memory_rng, n_bits)
            memory.sparse = new_state(memory.score, rng, recall, q_cap,
                                      (mixture(persistence.fn, persistence.fn_far), mixture(persistence.fp, persistence.fp_far)))
        assert memory.sparse is not None
        n_true = bitsets.count(truth)
        return sparse_noisy_block(memory.sparse, memory.score, truth, n_bits, recall,
                                  false_positive_rate(n_true, n_bits, recall, precision))
    return dense_noisy_sets(rng, memory_rng, truth, n_bits, [(recall, precision)], persistence, memory)[0]


def dense_noisy_sets(rng: np.random.Generator, memory_rng: np.random.Generator, truth: np.ndarray, n_bits: int,
                     rates: list[tuple[float, float]], persistence: Persistence, memory: ErrorMemory) -> list[np.ndarray]:
    """The dense draws of `persistent_noisy_sets`, for several (recall, precision) at once: the latents
    depend only on the streams and the error memory, so predictors that differ only in recall and
    precision threshold the same latents (each result identical to its own call)."""
    words = np.ascontiguousarray(truth, dtype=bitsets.WORD)
    n_true = bitsets.count(words)
    q32 = [false_positive_rate(n_true, n_bits, recall, precision).astype(np.float32) for recall, precision in rates]
    outs = [np.empty_like(words) for _ in rates]
    rows = max(1, BLOCK_CELLS // max(n_bits, 1))
    mix = (mixture(persistence.fn, persistence.fn_far), mixture(persistence.fp, persistence.fp_far))
    for r0 in range(0, len(words), rows):
        t = np.unpackbits(words[r0:r0 + rows].view(np.uint8), axis=-1, count=n_bits, bitorder="little").view(bool)
        u = rng.random(dtype=np.float32, out=work("u", t.shape, np.float32))
        if persistence.any:
            if memory.score is None:
                memory.score = stratified_scores(memory_rng, n_bits)
            v = memory_rng.random(dtype=np.float32, out=work("v", (t.shape[0], 2, n_bits), np.float32))
            miss = _latent("miss", u, v[:, 0], *mix[0], memory.score, memory.miss_chain)
            fp = _latent("fp", u, v[:, 1], *mix[1], memory.score, memory.fp_chain)
            memory.miss_chain, memory.fp_chain = miss[-1].copy(), fp[-1].copy()
            miss_l, fp_l = miss[1:], fp[1:]
        else:
            miss_l = fp_l = u
        for (recall, _), q, out in zip(rates, q32, outs):
            pred = np.less(miss_l, np.float32(recall), out=work("pred", t.shape, bool))
            pred &= t
            add = np.less(fp_l, q[r0:r0 + rows, None], out=work("add", t.shape, bool))
            np.greater(add, t, out=add)        # below q and inactive
            pred |= add
            out[r0:r0 + rows] = bitsets.pack(pred)
    return outs
