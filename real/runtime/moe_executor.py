"""The expert cache on real storage: the simulator's expert-cache policy objects (sim/moe) deciding, an
expert store on disk, the direct-I/O reader fetching, the CPU computing (times in seconds).

One `step(t, m, experts, weights, x)` is one token's pass through one MoE layer, in the order the
simulator's timeline assumes (sim/moe/timing.py):

1. the policy sees the router's K experts exactly as in the residency walk (sim/moe/residency.py
   `walk`: reroute, hit test against the resident set, `touch`, then `choose` the insertions and
   evictions), so a real run and a simulated run of the same trace make the same cache decisions
   (a test checks hit for hit);
2. the missed experts are read together, one read per expert (each one aligned unit of the expert
   store), each by its own BundleReader on a pool of `threads` threads, straight into a page-aligned
   slot: a cache slot when the policy admits it, else a staging slot;
3. while they are read, the cached experts are computed; then the missed ones, as they arrive;
4. the output is the weighted sum of the K experts' SwiGLU outputs (down(silu(gate x) * up x)).

Slots are rows of one AlignedBuffer (capacity + K staging rows of the store's 4 KiB stride); an
expert's matrices are torch views of its slot in the store dtype (no copy, no decode). Offline
policies (belady, pinned) need the whole routing in advance: shape mode passes it; model mode, where
the router decides as the model runs, refuses them. The page-cache baseline is not executed here
(its reads are page faults of an mmap, not the reader's).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from devices.errors import FlashsimError
from real.io.buffers import AlignedBuffer
from real.io.reader import BundleReader
from real.weights.expert_store import ExpertStore
from sim.moe.base import CacheContext, ExpertCache, Scope

OFFLINE_POLICIES = ("belady", "pinned")
TORCH_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


@dataclass
class StepStats:
    hits: int
    misses: int
    read_s: float               # wall time from issuing the reads to the last one landing (the cached
                                # experts are computed meanwhile, so this is at least their compute)
    wall_s: float               # the whole step
    bytes_read: int
    evictions: int
    replaced_mass: float = 0.0
    compute_s: float = 0.0      # wall time in the experts' GEMVs (cached ones while the reads run, then the missed)


@dataclass
class ExecutorTotals:
    steps: list[StepStats] = field(default_factory=list)


class ExpertExecutor:
    """Runs MoE layers against an expert store through an expert-cache policy (module docstring)."""

    def __init__(self, store: ExpertStore, policy: ExpertCache, capacity: int, scope: Scope = "layer", *,
                 routing: np.ndarray | None = None, n_tokens: int = 0, threads: int = 4,
                 direct: bool | None = None):
        m = store.manifest
        self.store, self.policy = store, policy
        self.M, self.E, self.K = store.n_layers, m.n_experts, m.top_k
        if policy.forced_scope and policy.forced_scope != scope:
            capacity = capacity * self.M if policy.forced_scope == "global" else capacity // self.M
            scope = policy.forced_scope
        if policy.page_faults and not self.page_faults:
            raise FlashsimError(f"expert cache {policy.name!r}: the page-cache baseline reads by page faults of an "
                                "mmap: run it with PageCacheExecutor (real/runtime/moe_page_cache.py)")
        if routing is None and policy.name in OFFLINE_POLICIES:
            raise FlashsimError(f"expert cache {policy.name!r} needs the whole routing in advance: use shape mode "
                                "(--trace), or an online policy (lru, lfu, least_stale, cache_aware) in model mode")
        if capacity < 0:
            raise FlashsimError(f"expert cache capacity must be >= 0 slots, got {capacity}")
        self.capacity, self.scope = capacity, scope
        slots = min(capacity * self.M if scope == "layer" else capacity, self.M * self.E)
        # online runs know the step count, not the keys: -1 rows (LFU scales its tie-break by the count)
        keys = np.full((n_tokens * self.M, self.K), -1, np.int64) if routing is None else \
            (np.asarray(routing, np.int64) + (np.arange(self.M) * self.E)[None, :, None]).reshape(-1, self.K)
        policy.bind(CacheContext(self.M, self.E, capacity, scope, keys))
        self.stride = m.stride_bytes
        # cache rows + K spare rows (an in-use expert that Belady drops after the step keeps its row
        # until the step's compute is done) + K staging rows (missed experts the policy does not admit)
        self.n_slots = slots + 2 * self.K
        self.rows = self._slot_rows(self.n_slots)
        self.free = list(range(slots + self.K - 1, -1, -1))
        self.staging = list(range(slots + self.K, slots + 2 * self.K))
        self.slot_of = np.full(self.M * self.E, -1, np.int64)
        self.resident = np.zeros(self.M * self.E, bool)
        self.count = np.zeros(self.M, np.int64)
        self.layer_of = np.repeat(np.arange(self.M), self.E)
        self._views: list[tuple[Any, Any, Any] | None] = [None] * self.n_slots
        self._readers = [BundleReader(store, in_flight=1, direct=direct) for _ in range(max(1, threads))]
        self._free_readers = list(range(len(self._readers)))
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=len(self._readers), thread_name_prefix="flashsim-expert")
        init = np.asarray(policy.initial(), np.int64)
        if len(init):
            # the policy's initial set is resident before the first step (the simulator's walk starts
            # with it cached): wait for its reads, so no step computes on a slot still being filled
            # or queues its reads behind them
            futs, _ = self._load(init, [self._take_slot() for _ in init])
            for f in futs:
                f.result()
            self.resident[init] = True
            np.add.at(self.count, self.layer_of[init], 1)
        self.totals = ExecutorTotals()

    page_faults = False       # True in the subclass that serves misses by page faults of an mmap

    def _slot_rows(self, n: int) -> np.ndarray | None:
        """The page-aligned slot memory: n rows of one expert stride each."""
        self._buf = AlignedBuffer(n * self.stride)
        return self._buf.view2d(n, self.stride)

    def _drop(self, keys: np.ndarray) -> None:
        """Called with the experts the policy evicted (the reader-based cache just reuses their rows)."""

    @property
    def tdtype(self) -> Any:
        """The torch dtype of the store (torch is imported only when experts are computed)."""
        import torch

        return getattr(torch, TORCH_DTYPES[self.store.dtype])

    @property
    def direct_io(self) -> bool:
        return all(r.direct_io for r in self._readers)

    # ---- slots and reads ---------------------------------------------------------------------------
    def _take_slot(self) -> int:
        if not self.free:
            raise AssertionError(f"{self.policy.name}: more experts cached than slots")
        return self.free.pop()

    def _read_one(self, key: int, slot: int) -> int:
        with self._lock:
            ri = self._free_readers.pop()
        try:
            m, e = divmod(int(key), self.E)
            st = self._readers[ri].read(m, np.array([e]), self.rows[slot:slot + 1])
            return st.bytes_read
        finally:
            with self._lock:
                self._free_readers.append(ri)

    def _load(self, keys: np.ndarray, slots: list[int]) -> tuple[list[Any], float]:
        t0 = time.perf_counter()
        futs = [self._pool.submit(self._read_one, int(k), s) for k, s in zip(keys, slots)]
        for k, s in zip(keys, slots):
            self.slot_of[k] = s
        return futs, t0

    def _views_of(self, slot: int) -> tuple[Any, Any, Any]:
        v = self._views[slot]
        if v is None:
            import torch

            m = self.store.manifest
            d, F, eb = m.d_model, m.d_expert_ff, m.expert_bytes
            raw = torch.from_numpy(self.rows[slot, :eb]).view(self.tdtype)
            v = (raw[: F * d].view(F, d), raw[F * d: 2 * F * d].view(F, d), raw[2 * F * d:].view(d, F))
            self._views[slot] = v
        return v

    def expert_out(self, slot: int, x: Any) -> Any:
        """down(silu(gate x) * up x) for x [n, d] (torch, the store dtype)."""
        import torch

        g, u, dn = self._views_of(slot)
        f = torch.nn.functional
        return f.linear(f.silu(f.linear(x, g)) * f.linear(x, u), dn)

    # ---- one step -----------------------------------------------------------------------------------
    def step(self, t: int, m: int, experts: np.ndarray, weights: np.ndarray, x: Any | None) -> tuple[Any, StepStats]:
        """One token (x [1, d] torch, or None in shape mode with compute skipped) through MoE layer m."""
        t_start = time.perf_counter()
        E, M = self.E, self.M
        s = t * M + m
        keys = np.asarray(experts, np.int64) + m * E
        mass = 0.0
        if self.policy.reroutes:
            keys, mass = self.policy.reroute(s, keys, np.asarray(weights, np.float64), self.resident)
        h = self.resident[keys]
        self.policy.touch(s, keys)
        missed = keys[~h]
        n_evict = 0
        staged: list[int] = []
        later: list[int] = []
        futs: list[Any] = []
        t_read0 = time.perf_counter()
        if len(missed):
            lo, hi = (m * E, (m + 1) * E) if self.scope == "layer" else (0, M * E)
            pool = np.flatnonzero(self.resident[lo:hi]) + lo
            ins, v = self.policy.choose(s, missed, pool, keys, self.capacity - len(pool))
            if len(v):
                if not self.resident[v].all():
                    raise AssertionError(f"{self.policy.name}: evicted an expert that is not resident")
                self.resident[v] = False
                np.subtract.at(self.count, self.layer_of[v], 1)
                self._drop(v[~np.isin(v, keys)])
                in_use = np.isin(v, keys)
                later = [int(k) for k in v[in_use]]          # used by this step: freed after its compute
                self.free.extend(int(x_) for x_ in self.slot_of[v[~in_use]])
                self.slot_of[v[~in_use]] = -1
                n_evict = len(v)
            slots = []
            for k in missed:
                if k in ins:
                    slots.append(self._take_slot())
                else:
                    slots.append(self.staging[len(staged)])
                    staged.append(int(k))
            futs, t_read0 = self._load(missed, slots)
            self.resident[ins] = True
            np.add.at(self.count, self.layer_of[ins], 1)
            if (self.count[m] > self.capacity) if self.scope == "layer" else (self.count.sum() > self.capacity):
                raise AssertionError(f"{self.policy.name}: over capacity {self.capacity}")
        y = None
        w = np.asarray(weights, np.float32)
        compute_s = 0.0
        if x is not None:
            import torch

            y = torch.zeros_like(x)
            t_c = time.perf_counter()
            for j in np.flatnonzero(h):                # cached experts while the reads run
                y += float(w[j]) * self.expert_out(int(self.slot_of[keys[j]]), x)
            compute_s += time.perf_counter() - t_c
        nbytes = sum(f.result() for f in futs)
        t_read1 = time.perf_counter()
        if x is not None:
            for j in np.flatnonzero(~h):
                y += float(w[j]) * self.expert_out(int(self.slot_of[keys[j]]), x)
            compute_s += time.perf_counter() - t_read1
        for k in staged:                                # staged experts leave with the step
            self.slot_of[k] = -1
        for k in later:
            self.free.append(int(self.slot_of[k]))
            self.slot_of[k] = -1
        self._drop(np.array(later + staged, np.int64))
        st = StepStats(int(h.sum()), int(len(missed)), t_read1 - t_read0 if len(missed) else 0.0,
                       time.perf_counter() - t_start, int(nbytes), n_evict, mass, compute_s)
        self.totals.steps.append(st)
        return y, st

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for r in self._readers:
            r.close()
        self._views = [None] * self.n_slots    # the slot memory goes with the last view of it

    def __enter__(self) -> ExpertExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
