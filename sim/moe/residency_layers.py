"""The residency walk vectorised over MoE layers, for per-layer caches (scope "layer").

Per-layer caches never interact: layer m's cache changes only at layer m's steps. So the M steps of one
token are independent and are processed together, as [M, K] and [M, E] arrays: the hit test is one
gather, the victims of every layer come from one stable argsort of the [M, E] keep-priorities (lowest
first, ties by expert id, exactly the sequential walk's order), and the first `room + evicted` misses
of each layer (router order) are inserted. Policies opt in with `vectorised = True` and the batched
hooks `touch_many(steps, keys)` / `score_many(steps, keys)`; results equal the sequential walk's (a test).
"""

from __future__ import annotations

import numpy as np

from sim.moe.base import ExpertCache


def walk_layers(keys_all: np.ndarray, T: int, M: int, E: int, policy: ExpertCache, capacity: int,
                resident: np.ndarray, count: np.ndarray, prefetch: np.ndarray | None,
                hit: np.ndarray, pf_hit: np.ndarray, pf_reads: np.ndarray, evict: np.ndarray) -> int:
    """Fill hit / pf_hit / pf_reads / evict in place, token by token; returns the peak resident count."""
    K = keys_all.shape[1]
    rows = np.arange(M)
    off = (rows * E)[:, None]
    all_keys = np.arange(M * E).reshape(M, E)
    res = resident.reshape(M, E)                      # a view: updates land in `resident`
    peak = int(count.sum())
    admits = policy.admits_any
    for t in range(T):
        steps = t * M + rows
        keys = keys_all[steps]                        # [M, K]
        h = resident[keys]
        hit[t] = h
        if prefetch is not None:
            p = np.sort(prefetch[t], axis=1)
            valid = (p >= 0) & np.r_['1', np.ones((M, 1), bool), p[:, 1:] != p[:, :-1]]
            pk = np.where(valid, p + off, 0)
            staged = valid & ~resident[pk]
            pf_reads[t] = staged.sum(axis=1)
            st = np.where(staged, pk, -1)
            pf_hit[t] = ~h & (keys[:, :, None] == st[:, None, :]).any(axis=2)
        policy.touch_many(steps, keys)
        if not admits:
            continue
        miss = ~h
        n_miss = miss.sum(axis=1)
        room = capacity - count
        need = n_miss - room
        n_ev = np.zeros(M, np.int64)
        if (need > 0).any():
            used = np.zeros((M, E), bool)
            used[np.repeat(rows, K), (keys - off).ravel()] = True
            cand = res & ~used
            sc = np.where(cand, policy.score_many(steps, all_keys), np.inf)
            order = np.argsort(sc, axis=1, kind="stable")
            n_ev = np.clip(np.minimum(need, cand.sum(axis=1)), 0, None)
            out = np.zeros((M, E), bool)
            np.put_along_axis(out, order, np.arange(E)[None, :] < n_ev[:, None], axis=1)
            res[out] = False
            count -= n_ev
            evict[t] = n_ev
        allowed = np.maximum(room, 0) + n_ev
        ins = miss & (np.cumsum(miss, axis=1) <= allowed[:, None])
        resident[keys[ins]] = True
        count += ins.sum(axis=1)
        if (count > capacity).any():
            raise AssertionError(f"{policy.name}: a layer holds more than {capacity} experts")
        peak = max(peak, int(count.sum()))
    return peak
