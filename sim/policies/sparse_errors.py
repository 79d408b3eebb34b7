"""The `noisy` predictor's persistent errors drawn sparsely, for traces where errors are rare.

Same model as `sim.policies.error_memory` (read it first): per neuron and error kind a latent
uniform that each step is kept (probability lam), redrawn to the neuron's lasting score Z
(probability (1 - lam) a) or redrawn fresh; a miss where an active neuron's miss latent is >= recall,
a false positive where an inactive neuron's false-positive latent is < q_s. Only latents inside an
error kind's "region" ([recall, 1) for misses, [0, q_cap) for false positives, q_cap >= every q_s
of the run) can ever make an error, and on a sparse trace (a ReLU model: a few % active) with a
good predictor those regions are a few % of [0, 1). So instead of a uniform per neuron per step:

* neurons whose score Z lies in the region ("Rz", a region-width share of them: Z is stratified)
  run the latent chain exactly, with draws for them only;
* every other neuron's latent is in the region only after a fresh redraw that landed there, an
  event of probability r = (1 - lam)(1 - a) width at every step whatever the neuron's state; the
  events are a Bernoulli(r) process over the (step, neuron) grid, drawn as geometric gaps; after
  an event the latent stays (same value) at each later step with probability lam / (1 - r) (kept,
  given no new event) until its first failure or the neuron's next event.

Both are exact for the model (the per-step recall and expected precision are the configured
ones); they use other random numbers than the dense draws. Cost: O(region width x N) per step
instead of O(N). Streams (each its own Generator spawned from the layer's stream, so a range and
the same steps one at a time draw identical numbers): per kind the Rz draws [S, |Rz|] row by
row, the events' gaps, values and persistence, and the first step's draws.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sim import bitsets

# Sparse draws when the two regions together cover at most this share of latents: beyond it the
# per-event bookkeeping costs more than the dense draws (measured: equal near 0.3 at 8192 neurons).
SPARSE_MAX_REGION = 0.25
CHUNK = 8192        # events drawn per refill of a kind's stream
_NO_EVENT = np.iinfo(np.int64).max
STREAMS = ("rz", "gap", "value", "extra", "first")


@dataclass
class KindState:
    """One error kind of one layer: its region [lo, lo + width), chain parameters and carried state."""

    lo: float
    width: float
    lam: float
    a: float
    rz: np.ndarray                         # int64: neurons whose score lies in the region
    rngs: dict[str, np.random.Generator]   # "rz", "gap", "value", "extra", "first": one stream each
    rz_latent: np.ndarray | None = None    # float32 [|rz|]: their latent at the last step
    idx: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))     # other neurons in the region
    val: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))   # their latent
    until: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))   # last step it is kept to
    buf_pos: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # drawn, not yet used events
    buf_val: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    buf_extra: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    last_pos: int = -1                     # flat position (step * N + neuron) of the last drawn event

    @property
    def rate(self) -> float:
        """r: probability of a fresh redraw into the region at a step."""
        return (1.0 - self.lam) * (1.0 - self.a) * self.width

    @property
    def stay(self) -> float:
        """Probability that a latent in the region is kept at a step without an event."""
        return self.lam / (1.0 - self.rate)

    def extras(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Steps a new latent is kept after its event (geometric: P(>= g) = stay**g)."""
        if self.stay <= 0.0:
            return np.zeros(n, np.int64)
        return rng.geometric(1.0 - self.stay, n) - 1

    def events(self, lo_flat: int, hi_flat: int, n_bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(pos, val, extra) of the fresh-in-region events with flat position in [lo_flat, hi_flat).
        Gaps, values and persistence each come from their own stream, so how many are drawn at a
        time never changes the numbers."""
        if self.rate <= 0.0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32), np.zeros(0, np.int64)
        if self.last_pos < 0:
            self.last_pos = n_bits - 1          # the stream starts at step 1 (step 0 is drawn apart)
        chunks = [(self.buf_pos, self.buf_val, self.buf_extra)]
        while self.last_pos < hi_flat - 1:
            n = int(1.05 * self.rate * (hi_flat - 1 - self.last_pos)) + 64
            pos = self.last_pos + np.cumsum(self.rngs["gap"].geometric(self.rate, n))
            vals = (self.lo + self.rngs["value"].random(n) * self.width).astype(np.float32)
            chunks.append((pos, vals, self.extras(self.rngs["extra"], n)))
            self.last_pos = int(pos[-1])
        pos, vals, extra = (np.concatenate(c) for c in zip(*chunks)) if len(chunks) > 1 else chunks[0]
        a, b = np.searchsorted(pos, [lo_flat, hi_flat])
        self.buf_pos, self.buf_val, self.buf_extra = pos[b:], vals[b:], extra[b:]
        return pos[a:b], vals[a:b], extra[a:b]


@dataclass
class SparseErrorState:
    """A layer's sparse state: the step count so far and both kinds (miss first)."""

    kinds: list[KindState]
    in_rz: list[np.ndarray]                # bool [N] per kind
    step: int = 0


def new_state(score: np.ndarray, rng: np.random.Generator, recall: float, q_cap: float,
              mixtures: tuple[tuple[float, float], tuple[float, float]]) -> SparseErrorState:
    """Sparse state for scores `score` [N]; `mixtures` = ((a, lam) of misses, (a, lam) of false positives)."""
    gens = rng.spawn(10)
    kinds, in_rz = [], []
    for k, (lo, width) in enumerate(((recall, 1.0 - recall), (0.0, q_cap))):
        a, lam = mixtures[k]
        inside = (score >= lo) & (score < lo + width) if a > 0 else np.zeros(len(score), bool)
        kinds.append(KindState(lo, width, lam, a, np.flatnonzero(inside),
                               dict(zip(STREAMS, gens[len(STREAMS) * k: len(STREAMS) * (k + 1)]))))
        in_rz.append(inside)
    return SparseErrorState(kinds, in_rz)


def _carry_rz(ks: KindState, score: np.ndarray, n_rows: int) -> np.ndarray:
    """float32 [S, |rz|]: the Rz neurons' latents over the block (the dense chain on those columns)."""
    m = len(ks.rz)
    d = ks.rngs["rz"].random((n_rows, m), dtype=np.float32)
    # one uniform decides keep (< lam), else the score (< c), else a fresh latent: (d - c) / (1 - c),
    # uniform on [0, 1) given d >= c
    c = ks.lam + (1.0 - ks.lam) * ks.a
    keep = d < np.float32(ks.lam)
    to_score = d < np.float32(c)
    if ks.rz_latent is None:             # the run's first step: nothing to keep
        keep[0] = False
        to_score[0] = d[0] < np.float32(ks.a)
        d[0] = np.where(to_score[0], d[0], (d[0] - np.float32(ks.a)) / np.float32(1.0 - ks.a))
        d[1:] = (d[1:] - np.float32(c)) / np.float32(1.0 - c)
    else:
        d = (d - np.float32(c)) / np.float32(1.0 - c)
    redraw = np.where(to_score, score[ks.rz][None, :], d)
    if not keep.any():
        latent = redraw
    else:
        src = np.where(keep, np.int32(-1), np.arange(n_rows, dtype=np.int32)[:, None])
        np.maximum.accumulate(src, axis=0, out=src)      # last redraw at or before each row
        latent = np.take_along_axis(redraw, np.maximum(src, 0), axis=0)
        if ks.rz_latent is not None and (src < 0).any():
            latent = np.where(src < 0, ks.rz_latent[None, :], latent)
    if n_rows:
        ks.rz_latent = latent[-1].copy()
    return latent


def _sojourns(ks: KindState, in_rz: np.ndarray, s0: int, s1: int, n_bits: int) -> tuple[np.ndarray, ...]:
    """(step, neuron, latent) of every non-Rz neuron whose latent is in the region at steps [s0, s1)."""
    pos, val, extra = ks.events(s0 * n_bits, s1 * n_bits, n_bits)
    if s0 == 0:   # the first step: redrawn to the score (probability a) or fresh, never kept
        p0 = (1.0 - ks.a) * ks.width
        u0 = ks.rngs["first"].random(n_bits, dtype=np.float32)
        hit = np.flatnonzero(u0 < np.float32(p0))
        v0 = (ks.lo + u0[hit].astype(np.float64) / p0 * ks.width).astype(np.float32)
        pos = np.concatenate([hit.astype(np.int64), pos])      # step 0's flat positions precede the stream's
        val = np.concatenate([v0, val])
        extra = np.concatenate([ks.extras(ks.rngs["first"], len(hit)), extra])
    other = ~in_rz[pos % n_bits]                              # Rz neurons run their own chain
    pos, val, extra = pos[other], val[other], extra[other]
    # a latent kept past its event's step (and those carried in) lasts until the neuron's next event
    held = extra > 0
    l_s = np.concatenate([np.full(len(ks.idx), s0 - 1, np.int64), pos[held] // n_bits])
    l_i = np.concatenate([ks.idx, pos[held] % n_bits])
    l_v = np.concatenate([ks.val, val[held]])
    l_end = np.concatenate([ks.until, pos[held] // n_bits + extra[held]])
    span = np.minimum(l_end, s1 - 1) - l_s                   # steps after the event inside the block
    span = np.maximum(span, 0)
    rep = np.repeat(np.arange(len(l_s)), span)
    step = l_s[rep] + 1 + np.arange(len(rep)) - np.repeat(np.cumsum(span) - span, span)
    flat = step * n_bits + l_i[rep]
    j = np.minimum(np.searchsorted(pos, flat), max(len(pos) - 1, 0))
    replaced = (pos[j] == flat) if len(pos) else np.zeros(len(flat), bool)
    first = np.full(len(l_s), _NO_EVENT, np.int64)            # step of each latent's replacing event
    np.minimum.at(first, rep[replaced], step[replaced])
    alive = step < first[rep]
    carry = (first == _NO_EVENT) & (l_end >= s1)
    ks.idx, ks.val, ks.until = l_i[carry], l_v[carry], l_end[carry]
    steps = np.concatenate([pos // n_bits, step[alive]])
    return steps, np.concatenate([pos % n_bits, l_i[rep][alive]]), np.concatenate([val, l_v[rep][alive]])


def _bits_at(truth: np.ndarray, rows: np.ndarray, neurons: np.ndarray) -> np.ndarray:
    """bool: whether each (row, neuron) is set in words [S, W]."""
    w = truth[rows, neurons >> 6]
    return ((w >> (neurons & 63).astype(np.uint64)) & bitsets._ONE).astype(bool)


def sparse_noisy_block(st: SparseErrorState, score: np.ndarray, truth: np.ndarray, n_bits: int,
                       recall: float, q: np.ndarray) -> np.ndarray:
    """words [S, W]: the predicted sets of the next S steps (true sets `truth`, false-positive
    rates q [S] <= the state's q_cap); updates `st`."""
    S = truth.shape[0]
    s0, s1 = st.step, st.step + S
    q32 = q.astype(np.float32)
    if np.any(q32 > np.float32(st.kinds[1].width)):
        raise ValueError(f"false-positive rate {float(q.max()):.4g} above the cap {st.kinds[1].width:.4g}")
    flips_r, flips_n = [], []
    for k, ks in enumerate(st.kinds):
        lat = _carry_rz(ks, score, S)
        act = ((np.take(truth, ks.rz >> 6, axis=1) >> (ks.rz & 63).astype(np.uint64)) & bitsets._ONE).astype(bool)
        err = (act & (lat >= np.float32(recall))) if k == 0 else (~act & (lat < q32[:, None]))
        r, c = np.nonzero(err)
        flips_r.append(r)
        flips_n.append(ks.rz[c])
        steps, neurons, vals = _sojourns(ks, st.in_rz[k], s0, s1, n_bits)
        rows = steps - s0
        act = _bits_at(truth, rows, neurons)
        err = act if k == 0 else (~act & (vals < q32[rows]))
        flips_r.append(rows[err])
        flips_n.append(neurons[err])
    st.step = s1
    out = np.array(truth, dtype=bitsets.WORD, copy=True)
    rows, neurons = np.concatenate(flips_r), np.concatenate(flips_n)
    # misses are active bits and false positives inactive ones, each (row, neuron) at most once: xor flips them
    np.bitwise_xor.at(out.reshape(-1), rows * out.shape[1] + (neurons >> 6),
                      np.left_shift(bitsets._ONE, (neurons & 63).astype(np.uint64)))
    return out
