"""The `noisy` predictor's persistent errors drawn sparsely, for traces where errors are rare.

Same model as `sim.policies.error_memory` (read it first): per neuron and error kind a latent
uniform that each step is kept (probability lam), redrawn to the neuron's lasting score Z
(probability (1 - lam) a) or redrawn fresh; a miss where an active neuron's miss latent is >= recall,
a false positive where an inactive neuron's false-positive latent is < q_s. Only latents inside an
error kind's "region" ([recall, 1) for misses, [0, q_cap) for false positives, q_cap >= every q_s
of the run) can ever make an error, and on a sparse trace (a ReLU model: a few % active) with a
good predictor those regions are a few % of [0, 1). So instead of a uniform per neuron per step:

* neurons whose score Z lies in the region ("Rz", a region-width share of them: Z is stratified)
  run the latent chain exactly, with draws for them only; a miss latent decides something only
  where the neuron is active, so the miss chain is evaluated there alone (stepping back through
  the kept steps to the value last set);
* every other neuron's latent is in the region only after a fresh redraw that landed there, an
  event of probability r = (1 - lam)(1 - a) width at every step whatever the neuron's state; the
  events are a Bernoulli(r) process over the (step, neuron) grid, drawn as geometric gaps; after
  an event the latent stays (same value) at each later step with probability lam / (1 - r) (kept,
  given no new event) until its first failure or the neuron's next event. The process runs over
  Rz neurons too, whose cells the chain then overwrites, so each stream's numbers do not depend on
  which neurons are Rz. Any latent in the miss region is a miss: miss events draw no values.

Both are exact for the model (the per-step recall and expected precision are the configured
ones); they use other random numbers than the dense draws. Cost: O(region width x N) per step
instead of O(N). Streams (each its own Generator spawned from the layer's stream, so a range and
the same steps one at a time draw identical numbers): per kind the Rz draws [S, |Rz|] row by
row, the events' gaps (geometric: by inversion of standard exponentials, the numbers
`Generator.geometric` gives), values (false positives) and kept steps (geometric, by its CDF
table, the same numbers), and the first step's draws. A block is done in row chunks of about
CHUNK_CELLS cells, each continuing the state of the one before; the predicted sets are the true
ones with each chunk's error cells flipped on a [rows, N] grid.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np

from sim import bitsets
from sim.policies.scratch import work

# Sparse draws when the two regions together cover at most this share of latents: beyond it the
# per-event bookkeeping costs more than the dense draws (measured: equal near 0.3 at 8192 neurons).
SPARSE_MAX_REGION = 0.25
_NO_EVENT = np.iinfo(np.int64).max
STREAMS = ("rz", "gap", "value", "extra", "first")
# Cells per piece of work on the [S, N] grid (a block is done in row chunks of about this many
# cells, so each chunk's grids and temporaries stay in cache and are reused).
CHUNK_CELLS = 1 << 21
# Keep probabilities up to this carry kept latents by chain depth (work ~ kept cells / (1 - lam));
# above it row by row (work ~ rows x columns).
_DEPTH_CARRY_MAX_LAM = 0.5


def carry_kept(full: np.ndarray, keep: np.ndarray, lam: float) -> None:
    """In place on float32 `full` [S + 1, M]: where `keep[s]` (bool [S, M]) row s + 1 takes row s's
    value, in row order, so a kept latent repeats along its run of kept steps; row 0 is the state
    before the block. `lam`, the keep probability, only picks the faster of two equal computations."""
    n_rows, m = keep.shape
    if lam > _DEPTH_CARRY_MAX_LAM:
        for s in range(n_rows):
            np.copyto(full[s + 1], full[s], where=keep[s])
        return
    # every kept cell takes the cell above at once: final for runs of one kept step; a cell d deep
    # in a longer run is final after d such passes, done for the few deeper cells by index
    select(keep, full[:-1], full[1:])
    if n_rows < 2:
        return
    flat, kflat = full.reshape(-1), keep.reshape(-1)
    deep = np.logical_and(keep[1:], keep[:-1], out=work("deep", (n_rows - 1, m), bool))
    idx = np.flatnonzero(deep) + 2 * m          # as flat indices of `full`
    depth = 2
    while len(idx):
        flat[idx] = flat[idx - m]               # gathers, then writes
        above = idx - (depth + 1) * m           # `depth` rows up, as an index of `keep` (< 0: the state row)
        depth += 1
        deeper = above >= 0
        deeper[deeper] = kflat[above[deeper]]
        idx = idx[deeper]


@functools.lru_cache(maxsize=64)
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
        z = rng.standard_exponential(n)
        z /= -math.log1p(-p)                # = -E / log1p(-p) exactly (division is sign-symmetric)
        np.ceil(z, out=z)
        np.minimum(z, 2.0 ** 62, out=z)
        return z.astype(np.int64)
    big, x = geometric_above_one(rng, p, n)
    out = np.ones(n, np.int64)
    out[big] = x + 1
    return out


def event_positions(rng: np.random.Generator, p: float, start: int, out: np.ndarray) -> None:
    """out (int64 [n]) = `start` plus the running sums of `geometric(rng, p, n)` gaps (the same numbers)."""
    n = len(out)
    if p < 1e-9 or p >= 0.333333333333333333333333:
        out[:] = geometric(rng, p, n)
    else:
        z = rng.standard_exponential(out=work("gaps", (n,), np.float64))
        z /= -math.log1p(-p)
        np.ceil(z, out=z)
        out[:] = z
    if n:
        out[0] += start
    np.cumsum(out, out=out)


def geometric_above_one(rng: np.random.Generator, p: float, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(i, X - 1) for the draws i of `geometric(rng, p, n)` that are above 1 (the same numbers, sparse)."""
    if p < 0.333333333333333333333333:
        x = geometric(rng, p, n)
        big = np.flatnonzero(x > 1)
        return big, x[big] - 1
    u = rng.random(out=work("geometric_u", (n,), np.float64))
    big = np.flatnonzero(u > p)
    if not len(big):
        return big, np.zeros(0, np.int64)
    table = _search_table(p)
    return big, np.minimum(np.searchsorted(table, u[big]), len(table) - 1)


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
    rz_score: np.ndarray | None = None     # float32 [|rz|]: their score
    idx: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))     # neurons whose event latent is kept on
    val: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))   # their latent
    until: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))   # last step it is kept to
    buf_pos: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # drawn, not yet used events
    buf_val: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    buf_held: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))   # which of them are kept ...
    buf_extra: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # ... and for how many steps
    last_pos: int = -1                     # flat position (step * N + neuron) of the last drawn event

    @property
    def rate(self) -> float:
        """r: probability of a fresh redraw into the region at a step."""
        return (1.0 - self.lam) * (1.0 - self.a) * self.width

    @property
    def stay(self) -> float:
        """Probability that a latent in the region is kept at a step without an event."""
        return self.lam / (1.0 - self.rate)

    @property
    def valued(self) -> bool:
        """Whether an event's value matters: a false positive compares it with q_s each step; any
        latent in the miss region is a miss, so miss events draw no values (the low end stands in)."""
        return self.lo == 0.0

    def extras(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(i, g): the new latents i = 0..n-1 that are kept g > 0 steps after their event (geometric:
        P(>= g) = stay**g); the others are kept 0 steps."""
        if self.stay <= 0.0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return geometric_above_one(rng, 1.0 - self.stay, n)

    def events(self, lo_flat: int, hi_flat: int, n_bits: int) -> tuple[np.ndarray, ...]:
        """(pos, val, held, extra) of the fresh-in-region events with flat position in [lo_flat,
        hi_flat): the events `held` (indices into pos) are kept `extra` > 0 steps after theirs.
        Gaps, values and persistence each come from their own stream, so how many are drawn at a
        time never changes the numbers."""
        if self.rate <= 0.0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32), np.zeros(0, np.int64), np.zeros(0, np.int64)
        if self.last_pos < 0:
            self.last_pos = n_bits - 1          # the stream starts at step 1 (step 0 is drawn apart)
        # the buffered events, then fresh ones drawn after them into the same (work) arrays
        n_buf = len(self.buf_pos)
        need = max(int(1.05 * self.rate * (hi_flat - 1 - self.last_pos)) + 64, 0) if self.last_pos < hi_flat - 1 else 0
        name = "fp" if self.valued else "miss"
        pos = work(f"{name}_pos", (n_buf + need,), np.int64)
        vals = work(f"{name}_val", (n_buf + need,), np.float32)
        pos[:n_buf], vals[:n_buf] = self.buf_pos, self.buf_val
        helds, extras = [self.buf_held], [self.buf_extra]
        while self.last_pos < hi_flat - 1:
            if need == 0:        # rarely: the first draw fell short; another, in fresh arrays
                need = int(1.05 * self.rate * (hi_flat - 1 - self.last_pos)) + 64
                pos, vals = np.concatenate([pos, np.empty(need, np.int64)]), np.concatenate([vals, np.empty(need, np.float32)])
            new_pos, new_vals = pos[len(pos) - need:], vals[len(vals) - need:]
            event_positions(self.rngs["gap"], self.rate, self.last_pos, new_pos)
            if self.valued:
                v64 = self.rngs["value"].random(out=work("values", (need,), np.float64))
                v64 *= self.width
                v64 += self.lo
                new_vals[:] = v64
            else:
                new_vals.fill(self.lo)
            held, extra = self.extras(self.rngs["extra"], need)
            helds.append(held + (len(pos) - need))
            extras.append(extra)
            self.last_pos = int(new_pos[-1])
            need = 0
        held, extra = (np.concatenate(helds), np.concatenate(extras)) if len(helds) > 1 else (helds[0], extras[0])
        a, b = np.searchsorted(pos, [lo_flat, hi_flat])
        ha, hb = np.searchsorted(held, [a, b])
        # copies: the few events beyond this range (the arrays are reused by the next call)
        self.buf_pos, self.buf_val = pos[b:].copy(), vals[b:].copy()
        self.buf_held, self.buf_extra = held[hb:] - b, extra[hb:].copy()
        return pos[a:b], vals[a:b], held[ha:hb] - a, extra[ha:hb]


@dataclass
class SparseErrorState:
    """A layer's sparse state: the step count so far and both kinds (miss first)."""

    kinds: list[KindState]
    step: int = 0


def new_state(score: np.ndarray, rng: np.random.Generator, recall: float, q_cap: float,
              mixtures: tuple[tuple[float, float], tuple[float, float]]) -> SparseErrorState:
    """Sparse state for scores `score` [N]; `mixtures` = ((a, lam) of misses, (a, lam) of false positives)."""
    gens = rng.spawn(10)
    if q_cap > recall:
        raise ValueError(f"false-positive region [0, {q_cap:.4g}) overlaps the miss region [{recall:.4g}, 1)")
    kinds = []
    for k, (lo, width) in enumerate(((recall, 1.0 - recall), (0.0, q_cap))):
        a, lam = mixtures[k]
        inside = (score >= lo) & (score < lo + width) if a > 0 else np.zeros(len(score), bool)
        kinds.append(KindState(lo, width, lam, a, np.flatnonzero(inside),
                               dict(zip(STREAMS, gens[len(STREAMS) * k: len(STREAMS) * (k + 1)]))))
    return SparseErrorState(kinds)


def select(mask: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """b = where(mask, a, b) in place for float32 b [S, M] and a (broadcast to it; it may be b's rows
    shifted): bitwise, so exact and free of the branch mispredictions that make np.where slow on
    random masks."""
    bb = b.view(np.uint32)
    m32 = np.negative(mask.view(np.uint8), out=work("select_mask", b.shape, np.uint32), dtype=np.uint32)
    diff = np.bitwise_xor(bb, a.view(np.uint32), out=work("select_diff", b.shape, np.uint32))
    diff &= m32                                # mask: 0 or all ones
    bb ^= diff


def _carry_rz(ks: KindState, score: np.ndarray, n_rows: int) -> np.ndarray:
    """float32 [S, |rz|]: the Rz neurons' latents over the block (the dense chain on those columns)."""
    m = len(ks.rz)
    full = work("rz_latent", (n_rows + 1, m), np.float32)   # row 0: the latent before the block
    d = full[1:]
    ks.rngs["rz"].random((n_rows, m), dtype=np.float32, out=d)
    # one uniform decides keep (< lam), else the score (< c), else a fresh latent: (d - c) / (1 - c),
    # uniform on [0, 1) given d >= c
    c = ks.lam + (1.0 - ks.lam) * ks.a
    keep = np.less(d, np.float32(ks.lam), out=work("keep", d.shape, bool))
    to_score = np.less(d, np.float32(c), out=work("to_score", d.shape, bool))
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
    if ks.rz_score is None:
        ks.rz_score = score[ks.rz]
    select(to_score, ks.rz_score, d)
    carry_kept(full, keep, ks.lam)
    if n_rows:
        ks.rz_latent = full[-1].copy()
    return d


def _rz_latents_at(ks: KindState, score: np.ndarray, n_rows: int, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """float32: the Rz neurons' latents at the cells (rows, cols) of the block only (the same values as
    `_carry_rz`, from the same draws): each is the value set at the last step at or before it
    that did not keep, found by stepping back through the kept steps."""
    m = len(ks.rz)
    d = ks.rngs["rz"].random((n_rows, m), dtype=np.float32)
    if n_rows == 0:
        return np.zeros(0, np.float32)
    first = ks.rz_latent is None
    last = np.arange(m)
    n_asked = len(rows)                  # then the last row's, the state for the next block
    rows, cols = np.concatenate([rows, np.full(m, n_rows - 1)]), np.concatenate([cols, last])
    src = rows.copy()
    back = np.arange(len(src))
    lam = np.float32(ks.lam)
    while len(back):
        r = src[back]
        kept = (r >= 0) & (d[np.maximum(r, 0), cols[back]] < lam)
        if first:
            kept &= r > 0                    # the run's first step keeps nothing
        back = back[kept]
        src[back] -= 1
    x = d[np.maximum(src, 0), cols]
    c = ks.lam + (1.0 - ks.lam) * ks.a
    lo = np.full(len(x), np.float32(c))
    hi = np.full(len(x), np.float32(1.0 - c))
    if first:                                # the first step: the score below a, else fresh
        lo[src == 0], hi[src == 0] = np.float32(ks.a), np.float32(1.0 - ks.a)
    val = np.where(x < lo, score[ks.rz][cols], (x - lo) / hi)
    if not first:
        val[src < 0] = ks.rz_latent[cols[src < 0]]
    if n_rows:
        ks.rz_latent = val[n_asked:].copy()
    return val[:n_asked]


def _sojourns(ks: KindState, s0: int, s1: int, n_bits: int) -> tuple[np.ndarray, ...]:
    """(cells, vals, h_rows, h_cells, h_vals): the cells (flat indices row * N + neuron of the block's
    [S, N] grid, row = step - s0) where a neuron's latent is in the region at steps [s0, s1) by the
    event process, with its value: at the events (`cells`, sorted) and at the later steps a latent
    is kept (`h_*`). Rz neurons are included; their own chain replaces them (`_chunk`)."""
    pos, val, held, extra = ks.events(s0 * n_bits, s1 * n_bits, n_bits)
    if s0 == 0:   # the first step: redrawn to the score (probability a) or fresh, never kept
        p0 = (1.0 - ks.a) * ks.width
        u0 = ks.rngs["first"].random(n_bits, dtype=np.float32)
        hit = np.flatnonzero(u0 < np.float32(p0))
        v0 = (ks.lo + u0[hit].astype(np.float64) / p0 * ks.width).astype(np.float32)
        pos = np.concatenate([hit.astype(np.int64), pos])      # step 0's flat positions precede the stream's
        val = np.concatenate([v0, val])
        held0, extra0 = ks.extras(ks.rngs["first"], len(hit))
        held, extra = np.concatenate([held0, held + len(hit)]), np.concatenate([extra0, extra])
    else:
        pos -= s0 * n_bits                                     # in place: the events' work array
    # a latent kept past its event's step (and those carried in) lasts until the neuron's next event
    row, neuron = np.divmod(pos[held], n_bits)
    n_rows = s1 - s0
    l_s = np.concatenate([np.full(len(ks.idx), -1, np.int64), row])        # the event's row
    l_i = np.concatenate([ks.idx, neuron])
    l_v = np.concatenate([ks.val, val[held]])
    l_end = np.concatenate([ks.until - s0, row + extra])              # the last row it is kept to
    span = np.maximum(np.minimum(l_end, n_rows - 1) - l_s, 0)              # rows after the event in the block
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
    return pos, val, h_row[alive], h_cell[alive], l_v[rep][alive]


def sparse_noisy_block(st: SparseErrorState, score: np.ndarray, truth: np.ndarray, n_bits: int,
                       recall: float, q: np.ndarray) -> np.ndarray:
    """words [S, W]: the predicted sets of the next S steps (true sets `truth`, false-positive
    rates q [S] <= the state's q_cap); updates `st`. Done in row chunks of about CHUNK_CELLS cells,
    each continuing the state of the one before (the same sets as the whole block at once)."""
    q32 = q.astype(np.float32)
    if np.any(q32 > np.float32(st.kinds[1].width)):
        raise ValueError(f"false-positive rate {float(q.max()):.4g} above the cap {st.kinds[1].width:.4g}")
    words = np.ascontiguousarray(truth, dtype=bitsets.WORD)
    out = np.empty_like(words)
    rows = max(1, min(CHUNK_CELLS // max(n_bits, 1), len(words)))
    # each kind's Rz cells in a chunk: flat indices into the chunk's [rows, N] grid
    rz_cells = [(np.arange(0, rows * n_bits, n_bits)[:, None] + ks.rz).reshape(-1) for ks in st.kinds]
    for r0 in range(0, len(words), rows):
        flip = _chunk(st, score, words[r0:r0 + rows], n_bits, recall, q32[r0:r0 + rows], rz_cells)
        if n_bits % 64 == 0:                           # whole words: the packed bytes are the words
            packed = np.packbits(flip, axis=-1, bitorder="little").view(bitsets.WORD)
        else:
            packed = bitsets.pack(flip)
        np.bitwise_xor(words[r0:r0 + rows], packed, out=out[r0:r0 + rows])
    return out


def _chunk(st: SparseErrorState, score: np.ndarray, words: np.ndarray, n_bits: int, recall: float,
           q32: np.ndarray, rz_cells: list[np.ndarray]) -> np.ndarray:
    """bool [S, N] (a work array): the error cells of the next S steps (true sets `words`); updates `st`."""
    S = len(words)
    s0, s1 = st.step, st.step + S
    active = np.unpackbits(words.view(np.uint8), axis=-1, count=n_bits, bitorder="little").view(bool).reshape(-1)
    # misses are active cells and false positives inactive ones, so each cell has at most one
    # error: the predicted sets are the true ones with the error cells flipped
    flip = work("flip", (S * n_bits,), bool)
    flip.fill(False)
    miss, fp = st.kinds
    # false positives: the event process's, then the Rz neurons' own chain replaces theirs
    cells, vals, h_rows, h_cells, h_vals = _sojourns(fp, s0, s1, n_bits)
    err = vals < np.repeat(q32, np.diff(np.searchsorted(cells, np.arange(S + 1) * n_bits)))
    np.greater(err, active[cells], out=err)               # below q and inactive
    flip[cells] = err                                     # the first writes: events are distinct cells
    flip[h_cells[(h_vals < q32[h_rows]) & ~active[h_cells]]] = True
    rc = rz_cells[1][:S * len(fp.rz)]
    lat = _carry_rz(fp, score, S)
    err = np.less(lat, q32[:, None], out=work("rz_err", lat.shape, bool))
    np.greater(err, np.take(active, rc, out=work("rz_active", lat.shape, bool).reshape(-1)).reshape(lat.shape),
               out=err)                                # below q and inactive
    flip[rc] = err.reshape(-1)
    # misses likewise, the Rz chain only where the neuron is active (the only cells it decides)
    cells, _, _, h_cells, _ = _sojourns(miss, s0, s1, n_bits)
    flip[cells[active[cells]]] = True
    flip[h_cells[active[h_cells]]] = True
    rc = rz_cells[0][:S * len(miss.rz)]
    at = np.flatnonzero(active[rc])
    rows, cols = np.divmod(at, max(len(miss.rz), 1))
    flip[rc[at]] = _rz_latents_at(miss, score, S, rows, cols) >= np.float32(recall)
    st.step = s1
    return flip.reshape(S, n_bits)
