"""MoE runs on the real backend: shape mode (a routing trace drives an expert store of any size) and its
scoring against the simulator (times in seconds).

Shape mode executes only what the routing decides: per token and MoE layer, the policy's cache
decisions, the expert reads and the expert compute (real/runtime/moe_executor.py) on a fixed input
vector in the store dtype; attention, router and shared experts are not run. The simulator is scored
on the same part: `simulated_latency_s` prices the same trace, policy and capacity with the MoE
timeline (sim/moe/timing.py `fast_path`) on a device profile, with the non-expert costs (attention,
router and its read-back, shared experts, lm_head) set to zero, so both sides count expert reads and
expert compute only.

Scoring follows the dense validation (real/validation/): the simulator's relative error on the mean
decode-token latency is reported beside the real run's own repeat spread ((max - min) / median of the
repeats' means), the floor below which an error cannot be told from noise on this machine.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import numpy as np

from devices.errors import FlashsimError
from devices.moe_spec import MoESpec
from real.weights.expert_store import ExpertStore
from sim.moe.base import build_cache

STORE_DTYPE_TO_SIM = {"fp32": "fp32", "fp16": "fp16", "bf16": "bf16"}


def store_spec(store: ExpertStore) -> MoESpec:
    """The MoESpec of a store's expert shape (attention fields minimal: shape mode does not run them)."""
    m = store.manifest
    M = len(m.moe_layers)
    return MoESpec(name=m.model, family="mixtral", n_layers=M, moe_layers=tuple(range(M)), n_experts=m.n_experts,
                   top_k=m.top_k, d_model=m.d_model, d_expert_ff=m.d_expert_ff, n_heads=1, n_kv_heads=1,
                   head_dim=1, layer_kinds=("full",) * M, vocab_size=1, dtype=STORE_DTYPE_TO_SIM[m.dtype],
                   source="expert store shape")


def run_shape(store: ExpertStore, experts: np.ndarray, weights: np.ndarray, *, policy: str, params: dict | None,
              capacity: int, scope: str = "layer", threads: int = 4, direct: bool | None = None,
              compute: bool = True, seed: int = 0) -> dict[str, Any]:
    """One shape-mode run over experts [T, M, K]: per-token wall latency, read time, hits and bytes.
    compute=False reads without computing (no torch): the cache and I/O path alone."""
    from real.runtime.moe_page_cache import executor_for

    e = np.asarray(experts, np.int64)
    T, M, K = e.shape
    man = store.manifest
    if (M, K) != (store.n_layers, man.top_k) or e.max() >= man.n_experts:
        raise FlashsimError(f"routing trace [{T}, {M}, {K}] with ids up to {e.max()} does not fit the expert store "
                            f"({store.n_layers} MoE layers x {man.n_experts} experts, top-{man.top_k})")
    cache = build_cache(policy, params)
    x = None
    with executor_for(store, cache, capacity, scope, routing=e, threads=threads, direct=direct) as ex:
        if compute:
            import torch

            gen = torch.Generator().manual_seed(seed)
            x = (torch.randn(1, man.d_model, generator=gen) / np.sqrt(man.d_model)).to(ex.tdtype)
        lat, read, hits, nbytes, comp = (np.zeros(T) for _ in range(5))
        for t in range(T):
            t0 = time.perf_counter()
            for m in range(M):
                _, st = ex.step(t, m, e[t, m], weights[t, m], x)
                read[t] += st.read_s
                hits[t] += st.hits
                nbytes[t] += st.bytes_read
                comp[t] += st.compute_s
            lat[t] = time.perf_counter() - t0
        direct_io = ex.direct_io
    return {"latency_s": lat, "read_s": read, "compute_s": comp, "hits": hits, "bytes_read": nbytes,
            "direct_io": direct_io, "hit_rate": float(hits.sum() / (T * M * K))}


def simulated_latency_s(store: ExpertStore, experts: np.ndarray, profile: Any, *, policy: str, params: dict | None,
                        capacity: int, scope: str = "layer", compute: bool = True,
                        threads: int | None = 4) -> tuple[np.ndarray, float]:
    """(per-token latency [T], hit rate) the simulator predicts for the expert part of the same run
    (compute=False: the reads alone, as `run_shape(compute=False)` executes them)."""
    sim = simulated_shape(store, experts, profile, policy=policy, params=params, capacity=capacity, scope=scope,
                          compute=compute, threads=threads)
    return sim["latency_s"], sim["hit_rate"]


def simulated_shape(store: ExpertStore, experts: np.ndarray, profile: Any, *, policy: str, params: dict | None,
                    capacity: int, scope: str = "layer", compute: bool = True,
                    threads: int | None = 4) -> dict[str, Any]:
    """The simulator's per-token records [T] of the expert part of a shape-mode run: latency_s, io_s
    (the flash's busy time: the read batches), read_s (the reads in flight as the executor counts
    them, `run_shape`'s read_s), compute_s (the experts' compute), bytes_read (the
    missed experts at the store's stride), and the hit rate. `threads`: the executor's reader threads,
    each reading one whole expert per call (sim.moe.timing.ReadEngine; None: the profile's engine)."""
    from devices.achievable import at_bound
    from sim.moe.residency import walk
    from sim.moe.timing import ReadEngine, fast_path, layer_costs

    spec = store_spec(store)
    prof = at_bound(profile, "achievable") if profile.bound == "raw" else profile
    cache = build_cache(policy, params)
    res = walk(np.asarray(experts, np.int64), spec.n_experts, cache, capacity, scope)
    hits, pf, misses = res.layer_counts()
    costs = layer_costs(spec, prof, spec.dtype, 0, max_batch=2 * spec.top_k,
                        engine=None if threads is None else ReadEngine(threads))
    L = spec.n_layers
    costs = replace(costs, pre_s=np.zeros(L), router_s=np.zeros(L), shared_s=np.zeros(L), head_s=0.0,
                    expert_s=costs.expert_s if compute else 0.0)
    tl = fast_path(costs, hits, pf, misses, res.prefetch_reads, cache.page_faults)
    used = (hits + pf + misses).sum(axis=1)
    # reads in flight, as the executor's read_s counts them: from issuing a layer's batch to its last
    # read landing, or to the end of the cached experts' compute run meanwhile if that is later
    window = np.where(misses > 0, np.maximum(costs.read_batch_s[misses], (hits + pf) * costs.expert_s), 0.0)
    return {"latency_s": tl.latency_s, "io_s": tl.io_s, "read_s": window.sum(axis=1), "compute_s": used * costs.expert_s,
            "bytes_read": (misses.sum(axis=1) + res.prefetch_reads.sum(axis=1)) * float(store.manifest.stride_bytes),
            "hit_rate": res.hit_rate}


def simulated_model_latency_s(folder: str, store: ExpertStore, experts: np.ndarray, profile: Any, *, policy: str,
                              params: dict | None, capacity: int, scope: str = "layer") -> tuple[np.ndarray, float]:
    """(per-token latency [T], hit rate) the simulator predicts for the whole model of `folder` (its
    MoESpec from config.json: attention, router, experts, head) on the routing the model chose, at the
    mean context of the run (T / 2 tokens)."""
    from devices.moe_spec import load_moe_model
    from sim.moe.run import MoERunConfig, simulate

    spec = load_moe_model(folder)
    e = np.asarray(experts, np.int64)
    cfg = MoERunConfig(policy=policy, params=dict(params or {}), capacity=capacity, scope=scope,  # type: ignore[arg-type]
                       dtype=STORE_DTYPE_TO_SIM[store.dtype], context_tokens=max(1, e.shape[0] // 2))
    run = simulate(spec, profile, e, cfg)
    return run.timeline.latency_s, run.residency.hit_rate


def score(real_runs: list[dict[str, Any]], sim_latency_s: np.ndarray, warmup: int = 1) -> dict[str, Any]:
    """Simulator error on the mean token latency beside the real repeat spread (tokens after `warmup`)."""
    means = np.array([r["latency_s"][warmup:].mean() for r in real_runs])
    real = float(np.median(means))
    sim = float(np.asarray(sim_latency_s)[warmup:].mean())
    spread = float((means.max() - means.min()) / real) if len(means) > 1 else None
    err = (sim - real) / real
    return {"real_ms_per_token": real * 1e3, "sim_ms_per_token": sim * 1e3, "error": err,
            "repeat_spread": spread, "repeats": len(means),
            "within_spread": None if spread is None else abs(err) <= spread,
            "real_ms_per_token_repeats": [float(m) * 1e3 for m in means],
            "real_read_ms_per_token": float(np.median([r["read_s"][warmup:].mean() for r in real_runs])) * 1e3,
            "gb_per_s_read": float(np.median([r["bytes_read"][warmup:].sum() / max(r["read_s"][warmup:].sum(), 1e-12)
                                              for r in real_runs])) / 1e9}
