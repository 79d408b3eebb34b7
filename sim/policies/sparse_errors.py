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
_NO_EVENT = np.iinfo(np.int64).max
STREAMS = ("rz", "gap", "value", "extra", "first")
# Keep probabilities up to this carry kept latents by chain depth (work ~ kept cells / (1 - lam));
# above it row by row (work ~ rows x columns).
_DEPTH_CARRY_MAX_LAM = 0.5


def carry_kept(full: np.ndarray, keep: np.ndarray, lam: float) -> None:
    """In place on `full` [S + 1, M]: where `keep[s]` (bool [S, M]) row s + 1 takes row s's value, in
    row order, so a kept latent repeats along its run of kept steps; row 0 is the state before the
    block. `lam`, the keep probability, only picks the faster of two equal computations."""
    n_rows, m = keep.shape
    if lam > _DEPTH_CARRY_MAX_LAM:
        for s in range(n_rows):
            np.copyto(full[s + 1], full[s], where=keep[s])
        return
    flat, kflat = full.reshape(-1), keep.reshape(-1)
    idx = np.flatnonzero(kflat) + m          # kept cells, as flat indices of `full`
    depth = 1
    while len(idx):
        # a cell d deep in a run of kept cells is final after d passes (each pass gathers, then writes)
        flat[idx] = flat[idx - m]
        above = idx - (depth + 1) * m        # `depth` rows up, as an index of `keep` (< 0: the state row)
        depth += 1
        deeper = above >= 0
        deeper[deeper] = kflat[above[deeper]]
        idx = idx[deeper]


def _search_table(p: float) -> np.ndarray:
    """float64: P(X <= x) of a geometric(p) for x = 1, 2, ..., summed term by term (as NumPy does)."""
    sums: list[float] = []
    s = prod = p
    while s < 1.0 and len(sums) < 4096 and (not sums or s != sums[-1]):
        sums.append(s)
        prod *= 1.0 - p
        s += prod
    sums.append(s)
    return np.array(sums)


def geometric(rng: np.random.Generator, p: float, n: int) -> np.ndarray:
    """int64 [n]: geometric(p) variates (number of trials to the first success), the very numbers
    `rng.geometric(p, n)` draws from the stream, vectorised: below p = 1/3 by inversion of standard
    exponentials E, ceil(-E / log1p(-p)); from 1/3 the smallest x with U <= P(X <= x), U uniform."""
    if p < 0.333333333333333333333333:
        z = np.ceil(-rng.standard_exponential(n) / np.log1p(-p))
        return np.minimum(z, 2.0 ** 62).astype(np.int64)
    u = rng.random(n)
    out = np.ones(n, np.int64)
    big = np.flatnonzero(u > p)
    if len(big):
        table = _search_table(p)
        out[big] = np.minimum(np.searchsorted(table, u[big]), len(table) - 1) + 1
    return out


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
        out = geometric(rng, 1.0 - self.stay, n)
        out -= 1
        return out

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
            pos = np.cumsum(geometric(self.rngs["gap"], self.rate, n))
            pos += self.last_pos
            vals = self.rngs["value"].random(n)
            vals *= self.width
            vals += self.lo
            chunks.append((pos, vals.astype(np.float32), self.extras(self.rngs["extra"], n)))
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
    if q_cap > recall:
        raise ValueError(f"false-positive region [0, {q_cap:.4g}) overlaps the miss region [{recall:.4g}, 1)")
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
    full = np.empty((n_rows + 1, m), np.float32)      # row 0: the latent before the block
    d = full[1:]
    ks.rngs["rz"].random((n_rows, m), dtype=np.float32, out=d)
    # one uniform decides keep (< lam), else the score (< c), else a fresh latent: (d - c) / (1 - c),
    # uniform on [0, 1) given d >= c
    c = ks.lam + (1.0 - ks.lam) * ks.a
    keep = d < np.float32(ks.lam)
    to_score = d < np.float32(c)
    if ks.rz_latent is None:             # the run's first step: nothing to keep
        keep[:1] = False
        to_score[:1] = d[:1] < np.float32(ks.a)
        d[:1] = np.where(to_score[:1], d[:1], (d[:1] - np.float32(ks.a)) / np.float32(1.0 - ks.a))
        rest = d[1:]
    else:
        full[0] = ks.rz_latent
        rest = d
    rest -= np.float32(c)
    rest /= np.float32(1.0 - c)
    np.copyto(d, score[ks.rz], where=to_score)
    carry_kept(full, keep, ks.lam)
    if n_rows:
        ks.rz_latent = full[-1].copy()
    return d


def _sojourns(ks: KindState, in_rz: np.ndarray, s0: int, s1: int, n_bits: int) -> tuple[np.ndarray, ...]:
    """(row, cell, latent) of every non-Rz neuron whose latent is in the region at steps [s0, s1):
    row = step - s0, cell = row * N + neuron (the flat index into the block's [S, N] grid)."""
    pos, val, extra = ks.events(s0 * n_bits, s1 * n_bits, n_bits)
    if s0 == 0:   # the first step: redrawn to the score (probability a) or fresh, never kept
        p0 = (1.0 - ks.a) * ks.width
        u0 = ks.rngs["first"].random(n_bits, dtype=np.float32)
        hit = np.flatnonzero(u0 < np.float32(p0))
        v0 = (ks.lo + u0[hit].astype(np.float64) / p0 * ks.width).astype(np.float32)
        pos = np.concatenate([hit.astype(np.int64), pos])      # step 0's flat positions precede the stream's
        val = np.concatenate([v0, val])
        extra = np.concatenate([ks.extras(ks.rngs["first"], len(hit)), extra])
    else:
        pos = pos - s0 * n_bits
    row, neuron = np.divmod(pos, n_bits)
    other = ~in_rz[neuron]                                   # Rz neurons run their own chain
    # a latent kept past its event's step (and those carried in) lasts until the neuron's next event
    held = np.flatnonzero(other & (extra > 0))
    n_rows = s1 - s0
    l_s = np.concatenate([np.full(len(ks.idx), -1, np.int64), row[held]])     # the event's row
    l_i = np.concatenate([ks.idx, neuron[held]])
    l_v = np.concatenate([ks.val, val[held]])
    l_end = np.concatenate([ks.until - s0, row[held] + extra[held]])          # the last row it is kept to
    pos, row, val = pos[other], row[other], val[other]
    span = np.maximum(np.minimum(l_end, n_rows - 1) - l_s, 0)                 # rows after the event in the block
    rep = np.repeat(np.arange(len(l_s)), span)
    h_row = l_s[rep] + 1 + np.arange(len(rep)) - np.repeat(np.cumsum(span) - span, span)
    h_cell = h_row * n_bits + l_i[rep]
    j = np.minimum(np.searchsorted(pos, h_cell), max(len(pos) - 1, 0))
    replaced = (pos[j] == h_cell) if len(pos) else np.zeros(len(h_cell), bool)
    first = np.full(len(l_s), _NO_EVENT, np.int64)            # row of each latent's replacing event
    np.minimum.at(first, rep[replaced], h_row[replaced])
    alive = h_row < first[rep]
    carry = (first == _NO_EVENT) & (l_end >= n_rows)
    ks.idx, ks.val, ks.until = l_i[carry], l_v[carry], l_end[carry] + s0
    return (np.concatenate([row, h_row[alive]]), np.concatenate([pos, h_cell[alive]]),
            np.concatenate([val, l_v[rep][alive]]))


def sparse_noisy_block(st: SparseErrorState, score: np.ndarray, truth: np.ndarray, n_bits: int,
                       recall: float, q: np.ndarray) -> np.ndarray:
    """words [S, W]: the predicted sets of the next S steps (true sets `truth`, false-positive
    rates q [S] <= the state's q_cap); updates `st`."""
    S = truth.shape[0]
    s0, s1 = st.step, st.step + S
    q32 = q.astype(np.float32)
    if np.any(q32 > np.float32(st.kinds[1].width)):
        raise ValueError(f"false-positive rate {float(q.max()):.4g} above the cap {st.kinds[1].width:.4g}")
    words = np.ascontiguousarray(truth, dtype=bitsets.WORD)
    active = np.unpackbits(words.view(np.uint8), axis=-1, count=n_bits, bitorder="little").view(bool)
    # misses are active cells and false positives inactive ones, each cell at most once: the
    # predicted sets are the true ones with the error cells flipped
    flip = np.zeros((S, n_bits), bool)
    for k, ks in enumerate(st.kinds):   # the kinds' Rz neurons are disjoint (new_state)
        lat = _carry_rz(ks, score, S)
        cells = (np.arange(0, S * n_bits, n_bits)[:, None] + ks.rz).reshape(-1)
        act = active.reshape(-1)[cells].reshape(lat.shape)
        if k == 0:
            err = lat >= np.float32(recall)
            err &= act
        else:
            err = lat < q32[:, None]
            err &= ~act
        flip.reshape(-1)[cells] = err.reshape(-1)
    for k, ks in enumerate(st.kinds):
        rows, cells, vals = _sojourns(ks, st.in_rz[k], s0, s1, n_bits)
        act = active.reshape(-1)[cells]
        flip.reshape(-1)[cells[act if k == 0 else (~act & (vals < q32[rows]))]] = True
    st.step = s1
    return words ^ bitsets.pack(flip)
