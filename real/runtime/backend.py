"""The real backend's executor: one token at a time, the simulator's PolicyStack decides, real reads
and real sparse compute carry it out (sizes in bytes, times in seconds, wall clock).

`RealExecutor` is built from the same `sim.engine.build(...)` Simulation the simulator would run
(same trace view, same policy objects, same memory model and budget) and executes, for every step s
and layer l, the plan `stack.plan(l, s, s + 1, cap)` (ranges of length 1, policy state carried):

1. wait for the prefetch of (s, l) issued one step earlier (background thread; waiting = stall);
2. delete from the layer's `real.runtime.cache_matrices.LayerCache` what the policy keeps neither for the next step
   nor computes now, and what the plan evicted to make room although it prefetches it back (rows
   moved: memory management);
3. read the demand set (`BundleReader`, direct I/O, coalesced) into rows appended to the cache;
4. compute the sparse FFN on the computed rows (`real.runtime.sparse_ffn.SparseFFN`: gathered out of
   the cache, or in place where the residency keeps them contiguous; CPU or CUDA);
5. drop computed-but-not-kept neurons, then issue the prefetch of the neurons the policy keeps for
   step s + 1 that are not resident (its own reader, one background thread, overlapping the
   remaining layers' compute).

Before the first token the executor settles the run (real/runtime/executor_plan.py): the layout's
alignment from the store (`store_config`), every step's plan as bitset arrays (`plan_steps`: the
policy's bookkeeping is the simulator's planning, not work the device does, so it stays out of the
records; `plan_s` says how long it took) and each layer's cache rows (`cache_rows`). Block pruning
(`prune.blocks`) is refused: the executor plans and runs every layer (block pruning on the real
model: real/studies/pruning.py).

Every step yields one `sim.records.TokenRecord` in the simulator's schema; `executed` keeps the
computed set of every step and layer so the run can be written as a trace (`real.runtime.run_outputs`)
and replayed exactly.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from devices.errors import FlashsimError
from devices.schema import DeviceProfile
from real.runtime.cache_matrices import layer_caches
from real.runtime.executor_plan import (
    cache_rows,
    check_executable,
    check_threads,
    plan_steps,
    store_config,
)
from real.runtime.sparse_ffn import TORCH_DTYPES, SparseFFN
from sim import bitsets
from sim.config import RunConfig
from sim.records import TokenRecord
from traces.format import Trace


@dataclass
class StepTimes:
    """What one step did (accumulated over its layers)."""

    io_s: float = 0.0
    compute_s: float = 0.0
    stall_s: float = 0.0
    mem_mgmt_s: float = 0.0
    demand_bytes: int = 0
    prefetch_bytes: int = 0
    reads_issued: int = 0
    computed: int = 0
    hits: int = 0
    peak_cache_bytes: int = 0


@dataclass
class RealRun:
    """The outcome of a real run."""

    tokens: list[TokenRecord]
    executed: np.ndarray                  # words [L, S, W]: computed set of each layer and step
    config: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    plan_s: float = 0.0                   # policy bookkeeping, done before the run (not in the records)
    outputs: list[Any] = field(default_factory=list)
    view: Any = None                      # the sim TraceView the run was planned from
    ffn_s: list[float] = field(default_factory=list)   # per step: FFN-side time (stall + mem mgmt + FFN compute)


class RealExecutor:
    """Executes a built Simulation's plans on a weight store. Call `begin_step`, `ffn` per layer,
    `end_step`; or `run_shape` (shape mode: random activations) from `real.runtime.shape_mode`."""

    def __init__(self, store: Any, trace: Trace, profile: DeviceProfile, config: RunConfig,
                 device: str = "cpu", threads: int | None = None):
        import torch

        from real.io.reader import BundleReader
        from real.runtime.device import choose_device
        from sim.engine import build

        self.torch = torch
        if config.prune.blocks.strip():
            raise FlashsimError(f"prune.blocks={config.prune.blocks!r}: the real backend plans and runs every layer; "
                                "drop it here (block pruning on the real model is measured by real/studies/pruning.py)")
        self.thread_note = check_threads(threads, profile)
        config, self.layout_note = store_config(config, store)
        self.store, self.spec = store, store.spec
        if (trace.n_layers, trace.n_neurons) != (self.spec.n_layers, self.spec.d_ff):
            raise FlashsimError(f"trace {trace.path} is {trace.n_layers} layers x {trace.n_neurons} neurons but the "
                                f"store {store.path} holds {self.spec.name} ({self.spec.n_layers} x {self.spec.d_ff}); "
                                "use a trace of the store's model")
        self.sim = build(trace, self.spec, profile, config)
        stack = self.sim.stack
        check_executable(stack, self.spec)
        self.n_steps = self.sim.steps.n
        # every step's plan before any file, thread or buffer is opened: a budget too small raises here
        plans = plan_steps(self.sim, self.spec.n_layers, self.n_steps, self.spec.d_ff)
        self.executed, self._survive, self._keep = plans.executed, plans.survive, plans.keep
        self._quality_sums, self.plan_total_s = plans.quality_sums, plans.plan_s
        self.dev = choose_device(device)
        self.tdev = self.dev.torch_device()
        self.tdtype = getattr(torch, TORCH_DTYPES[store.dtype])
        bundled = stack.layout.bundled()
        layout = "bundled" if bundled else "unbundled"
        if layout not in store.layouts:
            raise FlashsimError(f"store {store.path} has no {layout} layout (it has {', '.join(store.layouts)}); "
                                f"convert with --layout both to run bundling.bundled={str(bundled).lower()}")
        self.in_flight = int(config.flash.in_flight or profile.flash.max_in_flight)
        # the layout's coalescing limit, so real reads are cut into the chunks the simulator counts
        # (the reader merges nothing under a limit of 1 byte)
        max_chunk = stack.layout.max_coalesced_bytes() or 1
        # intra-op compute threads (None: leave PyTorch's setting), set once every check above has
        # passed (close() restores them). On a host whose cores are shared with other work, 1 avoids
        # the per-op barrier waiting for a descheduled worker thread (measured here: a sparse FFN
        # layer 0.59 ms with 1 thread, 16-24 ms median with 2).
        self._threads_before = torch.get_num_threads()
        if threads is None:
            threads = profile.compute.threads   # the count the profile's compute rates were measured with
        if threads is not None:
            torch.set_num_threads(threads)
        self.reader = BundleReader(store, layout=layout, in_flight=self.in_flight, max_chunk_bytes=max_chunk)
        self.pf_reader = BundleReader(store, layout=layout, in_flight=self.in_flight, max_chunk_bytes=max_chunk)
        self.pf_pool = ThreadPoolExecutor(1, thread_name_prefix="flashsim-prefetch")
        self.pending: dict[int, Future] = {}
        self.share_rows, rows = cache_rows(self.sim, self.spec.n_layers, self.n_steps, self.spec.d_ff)
        self.caches = layer_caches(rows, self.spec.d_ff, store.bundle_bytes, self.reader.dest_row_bytes)
        self.sparse = SparseFFN(torch, self.dev, self.tdtype, self.spec, store.segment_bytes, len(store.segments),
                                arena=self.caches[0]._buf.array if self.caches else None)
        self.records: list[TokenRecord] = []
        self.times = StepTimes()
        self.step = -1
        self.t_clock = 0.0
        self.ffn_s: list[float] = []
        self._preload_static()

    # ---- setup ------------------------------------------------------------------------------------
    def _preload_static(self) -> None:
        # The static neurons live in the cache rows but the simulator counts them in its fixed term;
        # records subtract them from the cache so they are counted once (as the simulator does).
        self._static_bytes = 0
        for layer, cache in enumerate(self.caches):
            ids = bitsets.unpack(self.sim.stack.static_mask(layer), self.spec.d_ff)
            ids = np.flatnonzero(ids)
            if len(ids):
                a, b = cache.append(ids)
                self.reader.read(layer, ids, cache.rows[a:b])
                self._static_bytes += len(ids) * cache.row_stride_bytes

    # ---- per step -----------------------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        if step != self.step + 1 or step >= self.n_steps:
            raise ValueError(f"steps run in order within [0, {self.n_steps}): got {step} after {self.step}")
        self.step, self.times = step, StepTimes()
        self.t_step0 = time.perf_counter()

    def ffn(self, layer: int, x: Any) -> Any:
        """The sparse FFN of `layer` at the current step on hidden vector(s) x [t, d] (torch)."""
        s, T = self.step, self.times
        cache = self.caches[layer]
        N = self.spec.d_ff
        # 1. the prefetch issued one step ago
        fut = self.pending.pop(layer, None)
        if fut is not None:
            w0 = time.perf_counter()
            st = fut.result()
            T.stall_s += time.perf_counter() - w0
            T.io_s += st.seconds
            T.prefetch_bytes += st.bytes_read
            T.reads_issued += st.reads_issued
        # 2. evict what is neither kept nor computed, and what the plan evicted to make room for the
        #    demand reads although the next step keeps it (a cache at its share deletes before it
        #    inserts; the plan then prefetches those neurons back, so they are read again)
        m0 = time.perf_counter()
        comp_ids = np.flatnonzero(bitsets.unpack(self.executed[layer, s], N))
        keep_mask = bitsets.unpack(self._keep[layer, s], N)
        cache.keep_only(bitsets.unpack(self._survive[layer, s], N))
        m1 = time.perf_counter()
        T.mem_mgmt_s += m1 - m0
        # 3. demand reads
        miss = cache.missing(comp_ids)
        if len(miss):
            a, b = cache.append(miss)
            st = self.reader.read(layer, miss, cache.rows[a:b])
            T.io_s += st.seconds
            T.demand_bytes += st.bytes_read
            T.reads_issued += st.reads_issued
        d1 = time.perf_counter()
        T.stall_s += d1 - m1
        T.hits += len(comp_ids) - len(miss)
        T.computed += len(comp_ids)
        T.peak_cache_bytes = max(T.peak_cache_bytes, self._cache_bytes())
        # 4. sparse compute on the gathered rows; in place where the residency keeps its computed
        #    rows contiguous (Residency.gathers_at) and they are: rows [0, k) in neuron order
        c0 = time.perf_counter()
        y = self.sparse.compute(cache, comp_ids, x, in_place=self._in_place(cache, comp_ids))
        c1 = time.perf_counter()
        T.compute_s += c1 - c0
        # 5. drop computed-not-kept, prefetch what the next step keeps and is not resident
        cache.keep_only(keep_mask)
        fetch = cache.missing(np.flatnonzero(keep_mask))
        m2 = time.perf_counter()
        T.mem_mgmt_s += m2 - c1
        if len(fetch) and s + 1 < self.n_steps:
            a, b = cache.append(fetch)
            self.pending[layer] = self.pf_pool.submit(self.pf_reader.read, layer, fetch, cache.rows[a:b])
        return y

    def end_step(self, n_tokens: int = 1) -> TokenRecord:
        T, s, sim = self.times, self.step, self.sim
        latency = time.perf_counter() - self.t_step0
        mass_num, mass_den, rec_num, rec_den = self._quality_sums[s].tolist()
        kv = int(sim.memory.kv_bytes[s])
        cache_b = max(T.peak_cache_bytes, self._cache_bytes())
        rec = TokenRecord(
            token=s, phase="decode" if sim.steps.phase[s] else "prefill", n_tokens=n_tokens,
            t_start_s=self.t_clock, t_end_s=self.t_clock + latency, latency_s=latency, io_s=T.io_s,
            compute_s=latency - T.stall_s - T.mem_mgmt_s, ffn_compute_s=T.compute_s, stall_s=T.stall_s,
            mem_mgmt_s=T.mem_mgmt_s,
            bytes_read=T.demand_bytes + T.prefetch_bytes, demand_bytes=T.demand_bytes,
            prefetch_bytes=T.prefetch_bytes, stream_bytes=0, reads_issued=T.reads_issued,
            resident_bytes=sim.memory.fixed_bytes + kv + cache_b, cache_bytes=cache_b, kv_bytes=kv,
            budget_bytes=int(sim.budget_bytes), computed=T.computed, hits=T.hits,
            activation_mass_kept=mass_num / mass_den if mass_den > 0 else 1.0,
            recall=rec_num / rec_den if rec_den > 0 else 1.0)
        self.t_clock += latency
        self.records.append(rec)
        self.ffn_s.append(T.compute_s + T.stall_s + T.mem_mgmt_s)
        return rec

    def finish(self, outputs: list[Any] | None = None) -> RealRun:
        for fut in self.pending.values():
            fut.result()
        self.pending.clear()
        self.close()
        cfg = self.sim.resolved_config(engine="real")
        cfg.update({"reader": self.reader.describe(), "device_kind": self.dev.kind,
                    "compute_threads": self.torch.get_num_threads(),
                    "cache_row_bytes": self.reader.dest_row_bytes, "store": str(self.store.path)})
        notes = list(self.sim.notes)
        if self.layout_note:
            notes.append(self.layout_note)
        if self.thread_note:
            notes.append(self.thread_note)
        if not self.reader.direct_io:
            notes.append(f"direct I/O unavailable ({self.reader.fallback_reason}): buffered reads with page-cache eviction")
        notes.append(f"policy bookkeeping {self.plan_total_s:.4f} s, planned before the run (not in the records)")
        return RealRun(self.records, self.executed, cfg, notes, self.plan_total_s, outputs or [], self.sim.view, self.ffn_s)

    def close(self) -> None:
        self.torch.set_num_threads(self._threads_before)
        self.pf_pool.shutdown(wait=True)
        self.sparse.close()
        self.reader.close()
        self.pf_reader.close()

    # ---- helpers ------------------------------------------------------------------------------------
    def _cache_bytes(self) -> int:
        """DRAM of the neuron caches' dynamic rows (the static neurons are in the fixed term)."""
        return sum(c.resident_bytes for c in self.caches) - self._static_bytes

    def _in_place(self, cache: Any, comp_ids: np.ndarray) -> bool:
        """True where the simulator prices this step's FFN on contiguous rows (the residency's
        `gathers_at`: naive's rows read in neuron order, dense's whole FFN) and the cache holds them
        so: the computed neurons in slots [0, k), in neuron order."""
        k = len(comp_ids)
        if k == 0 or bool(self.sim.stack.residency.gathers_at(np.array([k]))[0]):
            return False
        return bool(np.array_equal(cache.slot_of[comp_ids], np.arange(k)))
