"""The residency walk: which routed experts each token finds in the expert cache, per MoE layer.

Set algebra over a routing trace `experts[T, M, K]` (expert ids per token, MoE layer and rank). The
walk visits steps s = t * M + m in decode order; at each step the router's K experts are tested
against the cache (a boolean array over all M * E keys: one NumPy gather per step), the policy
sees the keys used, misses it admits are inserted and, when the scope's pool is full, victims the
policy picks are evicted. Hits per token and layer come out as arrays over the whole trace.

Speculative prefetch (`prefetch[T, M, P]`, expert ids predicted for step (t, m), -1 padded): the
prediction is made during step (t, m - 1) (the next layer's gate applied to the current hidden
state), and the predicted experts that are not resident are read then into a staging buffer of P
slots. At step (t, m) a missed expert found in the staging buffer is a prefetch hit: its bytes
were read one layer early. Staging does not evict cached experts (wrong guesses cost bandwidth
and the staging memory, not residency).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from devices.errors import FlashsimError
from sim.moe.base import CacheContext, ExpertCache, Scope


@dataclass(frozen=True)
class Residency:
    """Per token, MoE layer (and rank): the walk's outcome."""

    routed: np.ndarray          # int32 [T, M, K]: experts used (the trace's, or rerouted)
    hit: np.ndarray             # bool [T, M, K]: found in the cache
    prefetch_hit: np.ndarray    # bool [T, M, K]: found in the staging buffer (read one layer early)
    prefetch_reads: np.ndarray  # int32 [T, M]: experts the prefetch for this step read
    evictions: np.ndarray       # int32 [T, M]
    replaced_mass: np.ndarray   # float64 [T, M]: router-weight mass rerouted away (cache-aware routing)
    resident_peak: int          # most experts cached at once (all layers)
    capacity: int
    scope: Scope

    @property
    def miss(self) -> np.ndarray:
        return ~(self.hit | self.prefetch_hit)

    @property
    def hit_rate(self) -> float:
        return float(self.hit.mean()) if self.hit.size else 0.0

    def layer_counts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """[T, M] counts of cache hits, prefetch hits and demand misses."""
        return self.hit.sum(axis=2), self.prefetch_hit.sum(axis=2), self.miss.sum(axis=2)


def check_routing(experts: np.ndarray, n_experts: int) -> np.ndarray:
    """`experts` as int64 [T, M, K], ids in range and distinct per row; FlashsimError otherwise."""
    e = np.asarray(experts)
    if e.ndim != 3 or 0 in e.shape:
        raise FlashsimError(f"routing: experts must be a non-empty [tokens, moe_layers, top_k] array, got shape {e.shape}")
    if not np.issubdtype(e.dtype, np.integer):
        raise FlashsimError(f"routing: experts must be integer ids, got {e.dtype}")
    if e.min() < 0 or e.max() >= n_experts:
        raise FlashsimError(f"routing: expert ids must be in [0, {n_experts}), got [{e.min()}, {e.max()}]")
    s = np.sort(e, axis=2)
    if (s[..., 1:] == s[..., :-1]).any():
        raise FlashsimError("routing: an expert appears twice in one token's top-k for one layer")
    return e.astype(np.int64)


def walk(experts: np.ndarray, n_experts: int, policy: ExpertCache, capacity: int, scope: Scope = "layer",
         *, weights: np.ndarray | None = None, prefetch: np.ndarray | None = None,
         batched: bool = True) -> Residency:
    """Run `policy` over the trace with `capacity` slots (per layer or in all, by `scope`). Per-layer
    caches of vectorised policies walk a token's layers together (sim/moe/residency_layers.py; the
    same result, `batched=False` forces the step-by-step walk)."""
    e = check_routing(experts, n_experts)
    T, M, K = e.shape
    if capacity < 0:
        raise FlashsimError(f"expert cache capacity must be >= 0 slots, got {capacity}")
    if policy.forced_scope and policy.forced_scope != scope:
        capacity = capacity * M if policy.forced_scope == "global" else capacity // M
        scope = policy.forced_scope
    E = n_experts
    keys_all = (e + (np.arange(M) * E)[None, :, None]).reshape(T * M, K)
    policy.bind(CacheContext(M, E, capacity, scope, keys_all))
    w = np.asarray(weights, np.float64) if weights is not None else np.ones((T, M, K)) / K
    resident = np.zeros(M * E, bool)
    count = np.zeros(M, np.int64)                     # cached experts per layer
    routed = np.empty((T, M, K), np.int32)
    hit = np.zeros((T, M, K), bool)
    pf_hit = np.zeros((T, M, K), bool)
    pf_reads = np.zeros((T, M), np.int32)
    evict = np.zeros((T, M), np.int32)
    mass = np.zeros((T, M))
    layer_of = np.repeat(np.arange(M), E)
    init = np.asarray(policy.initial(), np.int64)
    resident[init] = True
    np.add.at(count, layer_of[init], 1)
    if (count > capacity).any() if scope == "layer" else count.sum() > capacity:
        raise AssertionError(f"{policy.name}: its initial set exceeds the capacity of {capacity}")
    peak = int(count.sum())
    if batched and scope == "layer" and policy.vectorised and not policy.reroutes:
        from sim.moe.residency_layers import walk_layers

        peak = walk_layers(keys_all, T, M, E, policy, capacity, resident, count, prefetch, hit, pf_hit,
                           pf_reads, evict)
        return Residency(e.astype(np.int32), hit, pf_hit, pf_reads, evict, mass, peak, capacity, scope)
    for t in range(T):
        for m in range(M):
            s = t * M + m
            keys = keys_all[s]
            if policy.reroutes:
                keys, mass[t, m] = policy.reroute(s, keys, w[t, m], resident)
            routed[t, m] = keys - m * E
            h = resident[keys]
            hit[t, m] = h
            if prefetch is not None:
                p = prefetch[t, m]
                p = np.unique(p[p >= 0]) + m * E
                staged = p[~resident[p]]
                pf_reads[t, m] = len(staged)
                pf_hit[t, m] = ~h & np.isin(keys, staged)
            policy.touch(s, keys)
            missed = keys[~h]
            if not len(missed):
                continue
            if scope == "layer":
                lo, hi, cap_now = m * E, (m + 1) * E, capacity
            else:
                lo, hi, cap_now = 0, M * E, capacity
            pool = np.flatnonzero(resident[lo:hi]) + lo
            ins, v = policy.choose(s, missed, pool, keys, cap_now - len(pool))
            if len(v):
                if not resident[v].all() or ((v < lo) | (v >= hi)).any():
                    raise AssertionError(f"{policy.name}: evicted keys outside its pool")
                resident[v] = False
                np.subtract.at(count, layer_of[v], 1)
                evict[t, m] = len(v)
            if len(ins):
                resident[ins] = True
                np.add.at(count, layer_of[ins], 1)
                peak = max(peak, int(count.sum()))
            if (count[m] > capacity) if scope == "layer" else (count.sum() > capacity):
                raise AssertionError(f"{policy.name}: {int(count.sum())} experts cached over capacity {capacity}")
    return Residency(routed, hit, pf_hit, pf_reads, evict, mass, peak, capacity, scope)
