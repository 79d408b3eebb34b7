"""`flashsim validate`'s MoE mode: expert-cache configurations run in shape mode on an expert store,
scored against the simulator exactly like the dense modes (times in seconds, sizes in bytes).

The store: random experts of a fixed shape (real.weights.expert_store.write_expert_store), fp32,
written into the validation's temporary folder; the routing: a synthetic trace of the store's shape
(traces.routing_synth.generate, uniform popularity with local routing consistency), the same for
every configuration. A configuration (`MoEPoint`) is an expert-cache policy and its capacity in
experts per MoE layer. For each, in interleaved passes like the dense grid
(real.validation.validate_runs._passes), the real backend executes the routing
(real.runtime.moe_runs.run_shape: the policy's decisions, direct-I/O reads of whole experts on
`IO_THREADS` reader threads, the experts' SwiGLU on the CPU), and the simulator prices the same
routing, policy and capacity (real.runtime.moe_runs.simulated_shape: the MoE timeline with the
executor's reads). Per token both sides give latency_s, io_s (from issuing a layer's reads to the
last landing, the cached experts computed meanwhile: the simulated window is the longer of the read
batch and that compute), compute_s (the experts' GEMVs) and bytes_read; validate_score.compare
scores them, so the floor and the pass rule cover MoE rows as they cover dense ones.

Sizes: `MOE_SMALL` (4 or 8 MoE layers x 8 experts of 1.5 MiB: 48 or 96 MiB) is the default and
--quick store, which the host's page cache would hold but the direct reads bypass; `MOE_LARGE`
(32 x 8 experts of 12 MiB: 3 GiB, the Mixtral-class store of docs/run-real.md) misses any page
cache (`flashsim validate --moe-store large`). Nothing is fitted to these runs. MoE rows are scored
against the profile as given: they are not kept (--keep), drift-corrected or recalibrated, which
replay the dense simulator.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from real.validation.validate_score import compare

IO_THREADS = 4           # reader threads of the executor (`flashsim real run --io-threads` default)
TOP_K = 2
N_EXPERTS = 8


@dataclass(frozen=True)
class MoEStoreShape:
    name: str
    n_layers: int
    d_model: int
    d_expert_ff: int

    def expert_bytes(self) -> int:
        return 3 * self.d_model * self.d_expert_ff * 4     # fp32 gate, up, down


# 512 x 256 fp32 experts: 1.5 MiB, several 4 MiB block requests' worth of reads per token without
# making the quick grid slow; 1024 x 1024: 12 MiB experts, a 3 GiB store
MOE_SMALL = {True: MoEStoreShape("small", 4, 512, 256), False: MoEStoreShape("small", 8, 512, 256)}
MOE_LARGE = MoEStoreShape("large", 32, 1024, 1024)
MOE_STORES = ("small", "large")


@dataclass(frozen=True)
class MoEPoint:
    """One MoE configuration: an expert-cache policy and its capacity (experts per MoE layer)."""

    policy: str
    capacity: int

    @property
    def label(self) -> str:
        return f"{self.policy} x{self.capacity}/layer"


def moe_grid(quick: bool) -> list[MoEPoint]:
    """Quick: LRU at two capacities, LFU and Belady at one (4 points); full: LRU, LFU, Least-Stale
    and Belady at 2, 4 and 6 of the 8 experts of a layer (12)."""
    if quick:
        return [MoEPoint("lru", 2), MoEPoint("lru", 4), MoEPoint("lfu", 4), MoEPoint("belady", 4)]
    return [MoEPoint(p, c) for p in ("lru", "lfu", "least-stale", "belady") for c in (2, 4, 6)]


def store_shape(quick: bool, which: str = "small") -> MoEStoreShape:
    from devices.errors import FlashsimError

    if which not in MOE_STORES:
        raise FlashsimError(f"--moe-store {which!r}: give one of {', '.join(MOE_STORES)} (small: tens of MiB, "
                            "large: 3 GiB, past the page cache)")
    return MOE_SMALL[quick] if which == "small" else MOE_LARGE


def write_store(shape: MoEStoreShape, root: Path, seed: int) -> Any:
    from real.weights.expert_store import open_expert_store, random_experts, write_expert_store

    M = shape.n_layers
    return open_expert_store(write_expert_store(
        root / "store", model=f"validate-moe-{shape.name}", n_layers=M, moe_layers=list(range(M)),
        n_experts=N_EXPERTS, top_k=TOP_K, d_model=shape.d_model, d_expert_ff=shape.d_expert_ff, dtype="fp32",
        experts=random_experts(shape.d_model, shape.d_expert_ff, seed), source={"kind": "random", "seed": seed}))


def routing(shape: MoEStoreShape, n_tokens: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """experts [T, M, K], weights: uniform popularity, the synthesizer's local consistency."""
    from traces.routing_synth import SynthParams, generate

    pop = np.full((shape.n_layers, N_EXPERTS), 1 / N_EXPERTS)
    return generate(pop, TOP_K, n_tokens, SynthParams(1.0, 0.8, 0.3), seed=seed)


@dataclass(frozen=True)
class _Token:
    """One token's record in the shape validate_score.compare reads."""

    latency_s: float
    io_s: float
    compute_s: float
    bytes_read: float


def tokens_of(run: dict[str, Any]) -> list[_Token]:
    """Per-token records of a real run (run_shape) or its simulation (simulated_shape); io_s is the
    reads in flight as the executor counts them (`read_s`) on both sides."""
    return [_Token(*map(float, v)) for v in zip(run["latency_s"], run["read_s"], run["compute_s"], run["bytes_read"],
                                                strict=True)]


def moe_rows(profile: Any, grid: list[MoEPoint], shape: MoEStoreShape, n_tokens: int, seed: int, root: Path,
             threads: int | None, rows: list, progress: Any, n_total: int, repeats: int = 1,
             drift: Any = None) -> dict[str, Any]:
    """Every point of `grid` on a store of `shape`, `repeats` interleaved passes, scored; a row each
    appended to `rows`. threads: PyTorch's compute threads of the real runs."""
    import torch

    from real.runtime.moe_runs import run_shape, simulated_shape
    from real.runtime.torch_threads import torch_threads
    from real.validation.validate_runs import _passes

    store = write_store(shape, root, seed)
    ex, w = routing(shape, n_tokens, seed)
    points = [(gp, gp.capacity * shape.n_layers * store.manifest.stride_bytes, gp) for gp in grid]

    def run_one(gp: MoEPoint) -> dict[str, Any]:
        return run_shape(store, ex, w, policy=gp.policy, params=None, capacity=gp.capacity, threads=IO_THREADS,
                         seed=seed)

    with torch_threads(torch, threads):
        runs, _times = _passes(points, repeats, run_one, drift)
    for (gp, cache_bytes, _), (run, *more) in zip(points, runs, strict=True):
        sim = simulated_shape(store, ex, profile, policy=gp.policy, params=None, capacity=gp.capacity,
                              threads=IO_THREADS)
        metrics = compare(tokens_of(run), tokens_of(sim), [tokens_of(r) for r in more])
        rows.append({"mode": "moe", "config": f"moe: {gp.label} ({shape.name} store)", "policy": gp.policy,
                     "capacity": gp.capacity, "bundled": True, "prefetch": "none",
                     "budget_fraction": gp.capacity / N_EXPERTS, "budget_bytes": cache_bytes,
                     "hit_rate_real": run["hit_rate"], "hit_rate_sim": sim["hit_rate"], "metrics": metrics,
                     "direct_io": run["direct_io"]})
        if progress:
            progress(len(rows), n_total, rows[-1]["config"], metrics["latency_s"]["error"])
    return {"model": store.manifest.model, "store_bytes": store.total_bytes, "expert_bytes": store.manifest.expert_bytes,
            "io_threads": IO_THREADS, "store": shape.name}
