"""The neuron cache shared by the neuron-granular residency policies: window(k), LRU, streaming.

One cache per layer holds the *dynamic* neurons (the static set of hybrid/dense/selective is apart).
With C_s the dynamic computed set of step s, H_s the prefetcher's prediction of C_s (empty without
prefetch) and W_s = C_{s-k+1} | ... | C_s the window (k = None: every step so far; k = 0: none):

    R_s  = W_{s-1} | H_s          resident when step s reaches the layer (prefetched H_s included)
    D_s  = C_s \\ R_s              demand reads (before the FFN)
    X_s  = R_s | C_s              resident after the demand reads
    R_s+1 = W_s | H_{s+1}         kept for the next step; P_s+1 = R_s+1 \\ X_s is prefetched now
    evicted = |X_s \\ R_s+1|,  inserted = |D_s| + |P_s+1|,  peak = max(|X_s|, |R_s+1 | C_s|)

Order inside a step (also the memory model): demand reads land (X_s); at the FFN start the
neurons neither kept nor computed are evicted and the next step's prefetch is issued; the
computed-but-not-kept ones (k = 0: streaming) are dropped when the FFN ends.

These formulas have no recursion, so a whole range is a handful of OR/AND-NOT passes over packed
rows (`_vectorised`). When a step's peak exceeds the layer's capacity share the cache must choose
what to drop, which depends on recency: `_sequential` replays the range step by step with
least-recently-used eviction (delete-then-insert: evict before the demand reads land; what is kept
is trimmed by priority: old window members first, then prefetches, then predicted neurons already
present). With capacity to spare both give identical results (tested). k = None under a capacity
is exactly an LRU cache of that capacity.
"""

from __future__ import annotations

import numpy as np

from sim import bitsets
from sim.policies.base import CacheSteps, CapacityError

NEVER = np.iinfo(np.int64).min // 4


class NeuronCache:
    """Per-layer window/LRU cache state and its two equivalent algorithms."""

    def __init__(self, k: int | None, n_neurons: int):
        if k is not None and k < 0:
            raise ValueError(f"k must be >= 0 or None, got {k}")
        self.k, self.N, self.W = k, n_neurons, bitsets.n_words(n_neurons)
        self.layers: dict[int, dict] = {}

    # ---- state ------------------------------------------------------------------------------
    def _state(self, layer: int, start: int) -> dict:
        st = self.layers.get(layer)
        if st is None:
            st = {"next": start, "hist": np.zeros((0, self.W), bitsets.WORD),
                  "acc": np.zeros(self.W, bitsets.WORD), "res": np.zeros(self.W, bitsets.WORD),
                  "hint": np.zeros(self.W, bitsets.WORD),
                  "last_use": np.full(self.N, NEVER, np.int64) if self.k is None else None}
            self.layers[layer] = st
        if st["next"] != start:
            raise ValueError(f"layer {layer}: steps must be advanced in order; expected step "
                             f"{st['next']}, got {start}")
        return st

    def _last_use(self, st: dict) -> np.ndarray:
        """Recency of every neuron (reconstructed from the window history for finite k)."""
        if st["last_use"] is not None:
            return st["last_use"].copy()
        lu = np.full(self.N, NEVER, np.int64)
        h = st["hist"]
        first = st["next"] - len(h)
        for j in range(len(h)):
            lu[bitsets.unpack(h[j], self.N)] = first + j
        return lu

    # ---- entry point ------------------------------------------------------------------------------
    def advance(self, layer: int, start: int, C: np.ndarray, H: np.ndarray | None,
                cap: np.ndarray) -> CacheSteps:
        st = self._state(layer, start)
        cap = np.asarray(cap, np.int64)
        if self.k == 0:
            # Streaming keeps nothing across steps (only prefetches for the next one), so the
            # per-layer share does not apply: one layer streams at a time, and the planner's DRAM
            # check (fixed + KV + the layer being streamed) bounds it.
            cap = np.full_like(cap, np.iinfo(np.int64).max // 4)
        if len(cap) < len(C) + 1:          # no share given for the next step: assume it is unchanged
            cap = np.concatenate([cap, cap[-1:]])
        out = self._vectorised(st, C, H, cap)
        if out is None:
            out = self._sequential(layer, st, start, C, H, cap)
        return out

    def shrink(self, cap: int | np.ndarray) -> np.ndarray:
        """Evict least-recently-used neurons until every layer holds at most `cap` (one int for every
        layer, or int [L] per layer: sim/policies/cache_shares.py)."""
        evicted = np.zeros(max(self.layers, default=-1) + 1, np.int64)
        caps = np.asarray(cap, np.int64)
        for layer, st in self.layers.items():
            res = bitsets.unpack(st["res"], self.N)
            over = int(res.sum()) - int(caps if caps.ndim == 0 else caps[layer])
            if over <= 0:
                continue
            lu = self._last_use(st)
            cand = np.flatnonzero(res)
            order = np.lexsort((cand, lu[cand]))
            res[cand[order[:over]]] = False
            st["res"] = bitsets.pack(res)
            evicted[layer] = over
        return evicted

    # ---- the two algorithms -----------------------------------------------------------------------
    def _window(self, st: dict, C: np.ndarray) -> np.ndarray:
        if self.k is None:
            return bitsets.cumulative_union(C, st["acc"])
        return bitsets.window_union(C, st["hist"], self.k)

    def _commit_history(self, st: dict, C: np.ndarray, Wk: np.ndarray, start: int) -> None:
        S = len(C)
        if self.k is None:
            st["acc"] = Wk[-1].copy()
        elif self.k >= 1:
            st["hist"] = np.concatenate([st["hist"], C])[-self.k:].copy()
        st["next"] = start + S

    def _consistent(self, st: dict) -> bool:
        """True when the resident set is exactly window | hint (no capacity eviction still visible):
        the condition under which the closed-form (vectorised) recurrence holds."""
        if self.k is None:
            w = st["acc"]
        elif self.k == 0 or len(st["hist"]) == 0:
            w = np.zeros(self.W, bitsets.WORD)
        else:
            w = np.bitwise_or.reduce(st["hist"], axis=0)
        return bool(np.array_equal(st["res"], w | st["hint"]))

    def _vectorised(self, st: dict, C: np.ndarray, H: np.ndarray | None, cap: np.ndarray) -> CacheSteps | None:
        S = len(C)
        if not self._consistent(st):
            return None
        Wk = self._window(st, C)
        Rn = Wk | H if H is not None else Wk
        Rm = np.empty_like(C)
        Rm[0] = st["res"]
        Rm[1:] = Rn[:-1]
        X = Rm | C
        n_X = bitsets.count(X)
        n_Rn = bitsets.count(Rn)
        # C is inside the window when k >= 1, so R_s+1 | C = R_s+1
        n_RnC = n_Rn if self.k is None or self.k >= 1 else bitsets.count(Rn | C)
        peak = np.maximum(n_X, n_RnC)
        if np.any(peak > cap[:S]) or np.any(n_Rn > cap[1:S + 1]):
            return None
        D = bitsets.andnot(C, Rm)
        P = bitsets.andnot(Rn, X)
        n_D, n_P = bitsets.count(D), bitsets.count(P)
        n_Rm = np.empty_like(n_Rn)
        n_Rm[0] = bitsets.count(st["res"])
        n_Rm[1:] = n_Rn[:-1]
        # identities (P is disjoint from X and R_s+1 is inside X | P): |C & R_s| = |C| - |D|,
        # |X \ R_s+1| = |X| - |R_s+1| + |P|
        out = CacheSteps(
            demand=D, prefetch=P, hits=bitsets.count(C) - n_D, before=n_Rm, after=n_Rn, peak=peak,
            inserted=n_D + n_P, evicted=n_X - n_Rn + n_P,
        )
        if st["last_use"] is not None:
            # each neuron's last computing row (-1: none): the max over rows of bit x (row + 1), in
            # the narrowest integer that holds S (a row-wise max over contiguous rows)
            dt = np.uint8 if S < 255 else np.uint16 if S < 65535 else np.int64
            Cb = bitsets.unpack(C, self.N).view(np.uint8).astype(dt, copy=False)
            last = (Cb * np.arange(1, S + 1, dtype=dt)[:, None]).max(axis=0).astype(np.int64) - 1
            used = last >= 0
            st["last_use"][used] = st["next"] + last[used]
        st["res"] = Rn[-1].copy()
        st["hint"] = H[-1].copy() if H is not None else np.zeros(self.W, bitsets.WORD)
        self._commit_history(st, C, Wk, st["next"])
        return out

    def _sequential(self, layer: int, st: dict, start: int, C: np.ndarray, H: np.ndarray | None,
                    cap: np.ndarray) -> CacheSteps:
        S, N = len(C), self.N
        if len(cap) < S + 1:
            cap = np.concatenate([cap, cap[-1:]])
        cnt = np.count_nonzero
        Cb = bitsets.unpack(C, N)
        Hb = bitsets.unpack(H, N) if H is not None else None
        res = bitsets.unpack(st["res"], N)
        lu = self._last_use(st)
        D = np.zeros((S, N), bool)
        P = np.zeros((S, N), bool)
        cols = {f: np.zeros(S, np.int64) for f in ("hits", "before", "after", "peak", "inserted", "evicted")}
        idx = np.arange(N, dtype=np.int64)
        windowed = self.k is None or self.k >= 1
        for i in range(S):
            s = start + i
            c = Cb[i]
            limit = int(cap[i])
            n_c = cnt(c)
            if n_c > limit:
                raise CapacityError(layer, s, n_c, limit)
            n_res = cnt(res)
            cols["before"][i] = n_res
            x = res | c
            n_x = cnt(x)
            ev = 0
            # Recency as both call patterns know it: a finite window remembers its last k steps
            # only (older uses count as never), so ranges and single steps choose alike.
            horizon = NEVER if self.k is None else s - self.k
            if n_x > limit:  # delete-then-insert: make room before the demand reads land
                cand = np.flatnonzero(res & ~c)
                res[cand[_smallest(_recency_key(_recent(lu[cand], horizon), cand), n_x - limit)]] = False
                ev = n_x - limit
                x = res | c
                n_x = limit
            d = c & ~res
            D[i] = d
            n_d = cnt(d)
            cols["hits"][i] = n_c - n_d
            lu[c] = s
            keep = x & (lu > NEVER) if self.k is None else x & (lu >= s - self.k + 1)
            h = Hb[i] if Hb is not None else None
            if h is not None:
                keep |= h
            # what is kept must fit this step with the computed set (A) and the next step's share (B)
            n_keep = cnt(keep)
            n_keep_c = n_keep if windowed else cnt(keep | c)
            need = max(n_keep_c - limit, n_keep - int(cap[i + 1]))
            if need > 0:
                cand = np.flatnonzero(keep)
                hinted = h[cand] if h is not None else np.zeros(len(cand), bool)
                # drop first: 0 old window members, least recent first; 1 prefetches (highest index
                # first); 2 predicted neurons already present; 3 neurons computed this step.
                klass = np.where(c[cand], 3, np.where(~hinted, 0, np.where(~x[cand], 1, 2)))
                rec = np.where(klass == 1, -idx[cand], _recent(lu[cand], horizon))
                keep[cand[_smallest(_recency_key(rec, cand, klass), need)]] = False
                n_keep -= need
                n_keep_c = n_keep if windowed else cnt(keep | c)
            p = keep & ~x
            P[i] = p
            n_p = cnt(p)
            cols["inserted"][i] = n_d + n_p
            cols["evicted"][i] = ev + n_x - (n_keep - n_p)       # |X \ keep| (keep \ X is P)
            cols["after"][i] = n_keep
            cols["peak"][i] = max(n_x, n_keep_c)
            res = keep
        st["res"] = bitsets.pack(res)
        st["hint"] = H[-1].copy() if H is not None else np.zeros(self.W, bitsets.WORD)
        if st["last_use"] is not None:
            st["last_use"] = lu
        Wk = self._window(st, C) if self.k is None else None
        self._commit_history(st, C, Wk if Wk is not None else C, start)
        return CacheSteps(demand=bitsets.pack(D), prefetch=bitsets.pack(P), **cols)


def _recency_key(rec: np.ndarray, neuron: np.ndarray, klass: np.ndarray | None = None) -> np.ndarray:
    """One int64 sort key ordering by (klass, rec, neuron): rec is a step (NEVER -> -1) or a
    negative neuron index (prefetches); neuron < 2**20."""
    r = np.maximum(rec, -(1 << 20) - 1) + (1 << 20) + 1          # >= 0, < 2**40 for realistic runs
    key = (r << 20) | neuron
    if klass is not None:
        key |= klass.astype(np.int64) << 61
    return key


def _recent(lu: np.ndarray, horizon: int) -> np.ndarray:
    """Last uses older than the horizon are forgotten (NEVER)."""
    return np.where(lu >= horizon, lu, NEVER)


def _smallest(key: np.ndarray, n: int) -> np.ndarray:
    """Positions of the n smallest keys (all when n >= len)."""
    if n >= len(key):
        return np.arange(len(key))
    return np.argpartition(key, n - 1)[:n]


class CachedResidency:
    """Mixin for residency policies built on `NeuronCache` (naive, hybrid, window, dense, selective).

    Subclasses define `window_k()` (None = unbounded) and optionally `static_mask`/`allowed`."""

    def window_k(self) -> int | None:
        return 0

    def reset(self) -> None:  # type: ignore[override]
        assert self.ctx is not None  # type: ignore[attr-defined]
        self.state = {"cache": NeuronCache(self.window_k(), self.ctx.n_neurons)}  # type: ignore[attr-defined]

    def advance(self, layer, steps, computed, next_hint, cap_neurons):  # type: ignore[no-untyped-def]
        return self.state["cache"].advance(layer, steps.start, computed, next_hint, cap_neurons)  # type: ignore[attr-defined]

    def kept(self, layer: int) -> np.ndarray:
        """words [W]: the layer's resident dynamic set after the last advanced step (Residency.kept)."""
        cache: NeuronCache = self.state["cache"]  # type: ignore[attr-defined]
        st = cache.layers.get(layer)
        return st["res"] if st is not None else np.zeros(cache.W, bitsets.WORD)

    def dynamic_bytes(self, neuron_bytes: int | None = None) -> int:
        """Bytes the caches hold now: resident neurons x `neuron_bytes`, the DRAM one cached neuron
        takes (the layout's `dram_bytes_per_neuron`, i.e. the memory model's `neuron_bytes`: padded
        rows with an aligned layout); None: the packed bundle `ffn_neuron_bytes`."""
        cache = self.state["cache"]  # type: ignore[attr-defined]
        n = sum(int(bitsets.count(st["res"])) for st in cache.layers.values())
        nb = self.ctx.spec.ffn_neuron_bytes if neuron_bytes is None else int(neuron_bytes)  # type: ignore[attr-defined]
        return n * nb

    def on_budget_change(self, cap_neurons: int | np.ndarray) -> np.ndarray:
        ev = self.state["cache"].shrink(cap_neurons)  # type: ignore[attr-defined]
        out = np.zeros(self.ctx.n_layers, np.int64)  # type: ignore[attr-defined]
        out[: len(ev)] = ev
        return out
