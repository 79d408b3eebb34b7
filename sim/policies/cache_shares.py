"""Per-layer shares of the neuron cache: how the DRAM left for caches is split between layers.

A windowing cache (LLM in a flash) preallocates one matrix per layer. Layers differ in how many
neurons a token activates and in how often a neuron comes back, so the same rows save different
flash bytes in different layers. `memory.cache_split` (a run's memory setting, since it splits the
memory budget; it acts on residencies that keep a per-layer cache across steps, i.e. `window`: the
others stream their dynamic neurons and keep nothing) chooses the split:

    equal            floor(free / (layers x neuron_bytes)) rows each (the memory model's own split)
    by_bytes_needed  rows in proportion to the layer's mean active neurons per step (the flash bytes it
                     needs per token without a cache: active fraction x row bytes; rows are the same
                     size in every layer, so the bytes are proportional to the neuron counts)
    greedy_marginal  rows given in quanta, each round to the layer whose hit curve gains the most hits
                     per row added (flash bytes saved per byte of cache: a hit saves one row read, a
                     row of cache costs one row of DRAM)

Model of a layer's hits (greedy_marginal): the cache keeps the most recently used neurons that fit
(window k: only those used in the last k steps; k = inf is exactly an LRU). A neuron computed at step
s and last computed at step p is then a hit with c rows when s - p <= k and the neurons computed in
steps p .. s-1 number d = |C_p | ... | C_{s-1}| <= c (they are all at least as recent, so it is among
the c most recent: Mattson's stack distance at step granularity; ties inside step p are counted as
misses, so the curve is a slight under-estimate). The curve hits(c) = #{d <= c} comes from the
trace's active sets (`TraceView.needed`, what an oracle predictor computes), one pass per layer:
for each step p a cumulative OR of the following steps' sets, popcounted, cut once it passes the
largest share any layer can get. Prefetched neurons are not modelled.

Every layer gets at least the largest set it computes in one step (`floor`): a windowed cache must
hold the step's computed neurons, so a share below that fails the run; no layer gets more than its
neuron count until every layer has it. The curves are a model (step granularity, no ties, greedy
is not optimal on non-concave curves), so the greedy split and the equal split are both run through
the policy's own cache (`sim.policies.cache.NeuronCache`, window and LRU eviction, no prefetch) with
the shares each gives at every step of the run, on the same sets, and the one with more hits is
kept: greedy never reads more than equal on the sets it was computed from (tested).

The split is computed once per run at the smallest cache the run has at its static budget (the
largest KV cache, `ref_rows`) and kept as integer rows w_l. A step with T_s free rows gives layer l
floor(T_s x w_l / ref) below the reference, and above it w_l plus the extra rows in proportion to
the layer's room below its neuron count (`CacheShares.split`): the shares sum to at most T_s at every
step, and a budget timeline or a growing KV cache moves all layers together. Equal shares are not
weights: they stay on the memory model's own formula, bit for bit. The simulator's planner and the real backend's per-layer matrices
(real.runtime.backend) read the same `CacheShares` through `MemoryModel.layer_caps`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sim import bitsets
from sim.policies.base import CapacityError

SPLITS = ("equal", "by_bytes_needed", "greedy_marginal")
GREEDY_ROUNDS = 1024   # the greedy hands out the rows above the floors in about this many quanta
STACK_CHUNK_STEPS = 32  # steps OR-ed per block when scanning stack distances (early cut per block)


@dataclass(frozen=True)
class CacheShares:
    """Per-layer rows `weights` (0: no cache there) for `ref_rows` free rows, and how other totals split."""

    mode: str
    weights: np.ndarray      # int64 [L]: each layer's rows when `ref_rows` rows are free
    ref_rows: int            # the total rows the weights were computed for
    floors: np.ndarray       # int64 [L]: largest per-step computed set of each layer
    n_neurons: int

    def split(self, total_rows: np.ndarray) -> np.ndarray:
        """int64 [..., L]: each layer's rows for each total in `total_rows` (sum <= total). Below the
        reference every layer shrinks in proportion; above it the extra rows go to the layers with room
        below their neuron count, in proportion to that room (a row past N holds nothing), and only what
        no layer has room for is spread in proportion to the weights."""
        t = np.maximum(np.asarray(total_rows, np.int64), 0)[..., None]
        w = self.weights.astype(np.int64)
        wsum, ref = max(int(w.sum()), 1), max(self.ref_rows, 1)
        down = (t * w) // ref
        room = np.where(w > 0, np.maximum(self.n_neurons - w, 0), 0)
        rsum = int(room.sum())
        extra = np.maximum(t - self.ref_rows, 0)
        fill = np.minimum(extra, rsum)
        up = w + ((fill * room) // max(rsum, 1)) + ((extra - fill) * w) // wsum
        return np.where(t < self.ref_rows, down, up)

    @property
    def rows_at_ref(self) -> np.ndarray:
        return self.split(np.int64(self.ref_rows))

    def describe(self) -> dict:
        return {"mode": self.mode, "reference_rows": int(self.ref_rows),
                "rows_per_layer": self.rows_at_ref.tolist()}


def equal_rows(total_rows: int, kept: np.ndarray) -> np.ndarray:
    """The equal split of `total_rows` over the kept layers (the memory model's formula)."""
    kept = np.asarray(kept, bool)
    return np.where(kept, max(int(total_rows), 0) // max(int(kept.sum()), 1), 0).astype(np.int64)


def layer_stats(sets: np.ndarray, n_neurons: int) -> tuple[float, int]:
    """(mean, max) active neurons per step of one layer's packed sets [S, W]."""
    n = bitsets.count(sets)
    return (float(n.mean()) if len(n) else 0.0, int(n.max()) if len(n) else 0)


def hit_curve(sets: np.ndarray, n_neurons: int, k: int | None, max_rows: int | None = None) -> np.ndarray:
    """int64 [N + 1]: modelled hits over the steps of `sets` (packed [S, W]) with c = 0..N cache rows
    (module docstring). `k`: the window (None: unbounded, an LRU); `max_rows`: distances above it are
    not resolved (counted as misses at every c <= max_rows; the curve is exact up to it)."""
    N = n_neurons
    S = len(sets)
    cap = N if max_rows is None else min(N, int(max_rows))
    hist = np.zeros(N + 2, np.int64)           # hist[d]: reuses at stack distance d (N + 1: unresolved)
    if S < 2 or (k is not None and k < 1):
        return np.zeros(N + 1, np.int64)
    Cb = bitsets.unpack(sets, N)
    nxt = np.full(N, S, np.int64)               # next step each neuron is computed, scanning backwards
    next_use = np.empty((S, N), np.int64)
    for s in range(S - 1, -1, -1):
        next_use[s] = nxt
        nxt[Cb[s]] = s
    horizon = S if k is None else int(k)
    for p in range(S - 1):
        ids = np.flatnonzero(Cb[p])
        gap = next_use[p, ids] - p              # >= 1; S - p: never again
        ok = gap <= min(horizon, S - 1 - p)
        if not ok.any():
            continue
        gap = gap[ok]
        need = int(gap.max())                   # distances needed: unions of steps p .. p + gap - 1
        u = np.empty(need, np.int64)
        acc = np.zeros(sets.shape[1], bitsets.WORD)
        done = 0
        while done < need:
            blk = sets[p + done: p + min(need, done + STACK_CHUNK_STEPS)]
            run = np.bitwise_or.accumulate(np.vstack([acc[None], blk]), axis=0)[1:]
            u[done: done + len(blk)] = bitsets.count(run)
            acc = run[-1]
            done += len(blk)
            if u[done - 1] > cap:               # every later distance is larger still
                u[done:] = N + 1
                break
        d = np.minimum(u[gap - 1], N + 1)
        hist += np.bincount(d, minlength=N + 2)
    return np.cumsum(hist[: N + 1])


def cache_hits(sets: np.ndarray, n_neurons: int, k: int | None, rows: int | np.ndarray) -> int:
    """Hits of the policy's own cache (`sim.policies.cache.NeuronCache`: window k, LRU eviction under
    the cap) over `sets` with a share of `rows` (one for every step, or int [S + 1] per step); -1 when
    a step's set does not fit."""
    from sim.policies.cache import NeuronCache

    S = len(sets)
    cap = np.broadcast_to(np.asarray(rows, np.int64), (S + 1,)).copy()
    try:
        out = NeuronCache(k, n_neurons).advance(0, 0, sets, None, cap)
    except CapacityError:
        return -1
    return int(out.hits.sum())


def saved(curves: np.ndarray, rows: np.ndarray) -> int:
    """Modelled hits (row reads saved) of a split: sum over layers of curve_l(rows_l)."""
    N = curves.shape[1] - 1
    r = np.clip(np.asarray(rows, np.int64), 0, N)
    return int(curves[np.arange(len(r)), r].sum())


def proportional_rows(weights: np.ndarray, floors: np.ndarray, ceil: int, total_rows: int) -> np.ndarray:
    """Rows in proportion to `weights`, clipped into [floor, ceil] per layer (clipped layers are fixed
    and the rest re-split), remainders by largest fraction (ties: lowest layer)."""
    w = np.asarray(weights, np.float64)
    lo = np.minimum(np.asarray(floors, np.int64), ceil)
    L = len(w)
    fixed = np.zeros(L, bool)
    val = np.zeros(L)
    for _ in range(L + 1):
        free = total_rows - val[fixed].sum()
        wsum = w[~fixed].sum()
        val[~fixed] = free * w[~fixed] / wsum if wsum > 0 else free / max(int((~fixed).sum()), 1)
        # floors first: raising a layer to its floor leaves less for the others, which may undo an
        # overshoot of the ceiling; capping at the ceiling only gives the others more
        low, high = (~fixed) & (val < lo), (~fixed) & (val > ceil)
        if low.any():
            val[low] = lo[low]
            fixed |= low
        elif high.any():
            val[high] = ceil
            fixed |= high
        else:
            break
    rows = np.floor(val).astype(np.int64)
    rest = int(total_rows - rows.sum())
    if rest > 0:
        frac = val - rows
        room = [int(i) for i in np.lexsort((np.arange(L), -frac)) if rows[i] < ceil]
        for i in room[:rest]:
            rows[i] += 1
        rest = int(total_rows - rows.sum())
        # rows still left when every layer is fixed (some at their floors, the others at the ceiling):
        # to the layers with room, in the same order, so that none is left while a layer has room
        for i in room:
            add = min(rest, ceil - int(rows[i]))
            rows[i] += add
            rest -= add
    return rows


def greedy_rows(curves: np.ndarray, floors: np.ndarray, total_rows: int) -> np.ndarray:
    """Floors first, then rows in quanta: each round gives the layer and the extension (a multiple of
    the quantum, up to the rows left) with the most hits gained per row added (ties: lowest layer,
    then shortest extension). Looking past the next quantum lets a step-shaped curve (reuse only
    once a whole working set fits) compete. Rows no layer gains from are spread over the layers in
    proportion to their room below the neuron count."""
    L, N = curves.shape[0], curves.shape[1] - 1
    rows = np.minimum(np.asarray(floors, np.int64), N)
    left = int(total_rows - rows.sum())
    if left <= 0:
        return rows
    q = max(1, -(-left // GREEDY_ROUNDS))
    idx = np.arange(L)
    while left > 0:
        ext = np.arange(q, min(left, N) + q, q)                      # extensions tried, rows
        ext = np.minimum(ext, left)
        to = np.minimum(rows[:, None] + ext[None, :], N)             # [L, E]
        added = to - rows[:, None]
        gain = (curves[idx[:, None], to] - curves[idx, rows][:, None]) / np.maximum(added, 1)
        gain = np.where(added > 0, gain, 0.0)
        best = int(np.argmax(gain))                                  # row-major: lowest layer, shortest
        layer, j = divmod(best, gain.shape[1])
        if gain[layer, j] <= 0:
            break
        rows[layer] += int(added[layer, j])
        left -= int(added[layer, j])
    if left > 0:
        room = N - rows
        if room.sum() > 0:
            rows += proportional_rows(room, np.zeros(L, np.int64), N, min(left, int(room.sum())))
    return rows


def compute_shares(mode: str, needed: Callable[[int], np.ndarray], kept: np.ndarray, n_neurons: int,
                   k: int | None, total_rows: int, step_rows: np.ndarray | None = None) -> CacheShares | None:
    """The split of `total_rows` cache rows for `mode` (None for equal: the memory model's formula).

    needed(layer) -> packed active sets [S, W] of that layer over the run; kept: bool [L] layers that
    hold a cache (a dropped FFN layer gets 0); k: the window (None: unbounded); step_rows: int [S + 1]
    free rows at each step (and the next), as the run will have them (default: `total_rows` throughout),
    on which greedy is checked against equal."""
    if mode not in SPLITS:
        raise ValueError(f"cache_split must be one of {', '.join(SPLITS)}, got {mode!r}")
    if mode == "equal":
        return None
    kept = np.asarray(kept, bool)
    L, N = len(kept), n_neurons
    total_rows = max(int(total_rows), 0)
    mean = np.zeros(L)
    floors = np.zeros(L, np.int64)
    for layer in np.flatnonzero(kept):
        mean[layer], floors[layer] = layer_stats(needed(int(layer)), N)
    if mode == "by_bytes_needed":
        rows = proportional_rows(mean, floors, N, total_rows)
    else:
        curves = np.zeros((L, N + 1), np.int64)
        cut = min(N, total_rows)
        for layer in np.flatnonzero(kept):
            curves[layer] = hit_curve(needed(int(layer)), N, k, cut)
        rows = greedy_rows(curves, floors, total_rows)
        eq = equal_rows(total_rows, kept)
        if np.all(eq[kept] >= floors[kept]) and not np.array_equal(rows, eq):
            # the curves are a model: the two splits are run on the policy's own cache with the shares
            # each gives at every step, and the one with more hits is kept (equal on a tie)
            t = np.full(1, total_rows, np.int64) if step_rows is None else np.asarray(step_rows, np.int64)
            g = CacheShares(mode, rows, total_rows, floors, N).split(t)           # [S + 1, L]
            e = np.repeat(t[:, None] // max(int(kept.sum()), 1), L, axis=1)
            hits = [sum(cache_hits(needed(int(layer)), N, k, c[:, layer] if len(c) > 1 else int(c[0, layer]))
                        for layer in np.flatnonzero(kept)) for c in (g, e)]
            if hits[1] >= hits[0]:
                rows = eq
    rows = np.where(kept, rows, 0).astype(np.int64)
    # an infeasible budget (floors over the total) keeps the floors as the reference split
    return CacheShares(mode, rows, max(total_rows, int(rows.sum())) if rows.sum() else 0, floors, N)
