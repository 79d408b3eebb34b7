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
4. compute the sparse FFN: gather the computed rows (gate | up | down) out of the cache, SwiGLU
   (or the model's activation) on them only. Where the residency's rows are contiguous
   (`Residency.gathers_at` False: naive's rows read in neuron order, dense's whole FFN) and the
   cache holds them so, on the cache's own rows without a gather, the down GEMV on the row layout
   (a SmolLM2 naive run keeping every neuron: FFN 139.6 -> 35.4 ms per token, logits 1.07e-4 from
   HF's, greedy tokens identical; the gathering path's transposed copy keeps <= 1e-4);
5. drop computed-but-not-kept neurons, then issue the prefetch of the neurons the policy keeps for
   step s + 1 that are not resident (its own reader, one background thread, overlapping the
   remaining layers' compute).

The store decides the flash layout's alignment: `store_config` sets `bundling.align_bytes` from the
manifest (4096 for a padded store, 0 for packed), so the simulator built here, and any replay of the
run, count the padded strides the reads really move. Block pruning (`prune.blocks`) is refused: the
executor plans and runs every layer (block pruning on the real model: real/studies/pruning.py).

The policy's own bookkeeping (set algebra in Python) is NOT part of the run: it is the simulator's
planning, not work the device does. The plans depend only on the trace, the budget and the
policies (never on a timing), so the executor makes every step's plan when it is built, step by
step as above, before the first token (`plan_s`: how long that took). Planning inside the timed
loop and subtracting its time is not the same: a prefetch in flight runs on through the
subtracted time, so its reads would get free time and their CPU work would land outside the
records (measured: a shape-mode delta run planned 4.5 ms per token inline against 2.0 ms without
prefetch, the difference being the prefetch thread's work).
Every step yields one
`sim.records.TokenRecord` in the simulator's schema; `executed` keeps the computed set of every
step and layer so the run can be written as a trace (`real.runtime.run_outputs`) and replayed exactly.
"""

from __future__ import annotations

import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from devices.errors import FlashsimError
from devices.schema import DeviceProfile
from real.runtime.cache_matrices import GATHER_ROW_PAD_BYTES, TransposeScratch, gather_rows
from sim import bitsets
from sim.config import RunConfig
from sim.policies.base import CapacityError
from sim.records import TokenRecord
from traces.format import Trace

TORCH_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


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
        if stack.residency.page_granular:
            raise FlashsimError(f"residency {stack.residency.name!r} is the mmap baseline: run `flashsim real mmap`")
        if stack.precision.name != "native":
            raise FlashsimError(f"precision {stack.precision.name!r}: the real backend computes the store's own dtype")
        self.n_steps = self.sim.steps.n
        self.executed = np.zeros((self.spec.n_layers, self.n_steps, bitsets.n_words(self.spec.d_ff)), bitsets.WORD)
        self._plan_all()     # before any file, thread or buffer is opened: a budget too small raises here
        self.dev = choose_device(device)
        self.tdev = self.dev.torch_device()
        self.tdtype = getattr(torch, TORCH_DTYPES[store.dtype])
        bundled = bool(getattr(stack.layout.params, "bundled", True))
        layout = "bundled" if bundled else "unbundled"
        if layout not in store.layouts:
            raise FlashsimError(f"store {store.path} has no {layout} layout (it has {', '.join(store.layouts)}); "
                                f"convert with --layout both to run bundling.bundled={str(bundled).lower()}")
        self.in_flight = int(config.flash.in_flight or profile.flash.max_in_flight)
        # the layout's coalescing limit, so real reads are cut into the chunks the simulator counts
        lp = stack.layout.params
        max_chunk = int(getattr(lp, "max_chunk_bytes", 1 << 20)) if getattr(lp, "coalesce", True) else 1
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
        self.caches = self._make_caches()
        from real.runtime.device import pin_host_buffer

        # on CUDA the cache rows are page-locked in place, so in-place FFNs copy them asynchronously
        self._arena_pin = pin_host_buffer(self.caches[0]._buf.array, self.dev) if self.caches else None
        self.seg_bytes = store.segment_bytes
        self.n_seg = len(store.segments)
        self.records: list[TokenRecord] = []
        from real.runtime.device import HostScratch

        self._gather = HostScratch(self.dev)   # the gathered rows (pinned on CUDA)
        self._down_t = TransposeScratch(self.torch, self.tdev)   # the down rows, transposed
        self.times = StepTimes()
        self.step = -1
        self.t_clock = 0.0
        self.ffn_s: list[float] = []
        self._preload_static()

    # ---- setup ------------------------------------------------------------------------------------
    def _plan_all(self) -> None:
        """Every (step, layer) plan, in the order the run executes them, before the run (module doc).

        Keeps per layer and step, as words: `executed` (the computed set), `_survive` (what the
        cache keeps before the demand reads: kept or computed, less what the plan prefetches back)
        and `_keep` (what it keeps after the FFN, static neurons included); per step the quality
        proxy's sums (3 x layers x steps x words of memory: 0.12 GiB for a 7B shape over 1000 steps).
        Raises RealCapacityError when a step does not fit the budget."""
        sim, L, N, S = self.sim, self.spec.n_layers, self.spec.d_ff, self.n_steps
        W = bitsets.n_words(N)
        self._survive = np.zeros((L, S, W), bitsets.WORD)
        self._keep = np.zeros((L, S, W), bitsets.WORD)
        self._quality_sums = np.zeros((S, 4))     # activation mass kept (num, den), recall (num, den)
        static = [sim.stack.static_mask(layer) for layer in range(L)]
        t0 = time.perf_counter()
        for s in range(S):
            cap = sim.memory.layer_caps(sim.budget_bytes, s, s + 1, L)   # [2, L]: the simulator's shares
            for layer in range(L):
                try:
                    plan = sim.stack.plan(layer, s, s + 1, cap[:, layer])
                except CapacityError as e:
                    raise RealCapacityError(e.layer, e.step, e.need, e.cap) from None
                computed = plan.computed[0]
                keep = self._kept(layer) | static[layer]
                self.executed[layer, s] = computed
                self._keep[layer, s] = keep
                self._survive[layer, s] = (keep | computed) & ~plan.prefetch_next[0]
                self._quality_sums[s] += self._quality(layer, s, plan)
        self.plan_total_s = time.perf_counter() - t0

    def _make_caches(self) -> list[Any]:
        from real.runtime.cache_matrices import layer_caches

        sim, L, N = self.sim, self.spec.n_layers, self.spec.d_ff
        # each layer's share of the cache, the simulator's own (MemoryModel.layer_caps: equal, or the
        # run's memory.cache_split), at its largest over the run
        self.share_rows = sim.memory.layer_caps(sim.budget_bytes, 0, self.n_steps, L).max(axis=0)
        view = sim.view
        peak = max(int(bitsets.count(view.needed(layer, 0, self.n_steps)).max()) for layer in range(L))
        static = max(int(bitsets.count(self.sim.stack.static_mask(layer))) for layer in range(L))
        # the policy keeps at most its share of dynamic neurons across steps and computes at most `peak`
        # more (a recorded trace's predictor cannot compute more than the union it is given)
        rows = [int(min(N, int(c) + peak + static)) for c in self.share_rows]
        return layer_caches(rows, N, self.store.bundle_bytes, self.reader.dest_row_bytes)

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
        y = self._sparse_ffn(cache, comp_ids, x, in_place=self._in_place(cache, comp_ids))
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
        self._gather.close()
        from real.runtime.device import unpin_host_buffer

        unpin_host_buffer(self._arena_pin)
        self._arena_pin = None
        self.reader.close()
        self.pf_reader.close()

    # ---- helpers ------------------------------------------------------------------------------------
    def _kept(self, layer: int) -> np.ndarray:
        """words [W]: the dynamic set the residency keeps after this step (prefetch included)."""
        st = self.sim.stack.residency.state.get("cache")
        if st is None or layer not in st.layers:
            raise FlashsimError(f"residency {self.sim.stack.residency.name!r} keeps no neuron cache the real "
                                "backend can follow; use window, naive, hybrid, dense or selective")
        return st.layers[layer]["res"]

    def _cache_bytes(self) -> int:
        """DRAM of the neuron caches' dynamic rows (the static neurons are in the fixed term)."""
        return sum(c.resident_bytes for c in self.caches) - self._static_bytes

    def _quality(self, layer: int, step: int, plan: Any) -> np.ndarray:
        """The simulator's own quality proxy (sim.quality_proxy.layer_quality) on a step's sets: [mass kept
        num, den, recall num, den]."""
        from sim.quality_proxy import layer_quality

        mn, md, rn, rd = layer_quality(self.sim.view, layer, step, step + 1, plan.computed, plan.needed)
        return np.array([mn.sum(), md.sum(), rn.sum(), rd.sum()], dtype=np.float64)

    def _in_place(self, cache: Any, comp_ids: np.ndarray) -> bool:
        """True where the simulator prices this step's FFN on contiguous rows (the residency's
        `gathers_at`: naive's rows read in neuron order, dense's whole FFN) and the cache holds them
        so: the computed neurons in slots [0, k), in neuron order."""
        k = len(comp_ids)
        if k == 0 or bool(self.sim.stack.residency.gathers_at(np.array([k]))[0]):
            return False
        return bool(np.array_equal(cache.slot_of[comp_ids], np.arange(k)))

    def _sparse_ffn(self, cache: Any, comp_ids: np.ndarray, x: Any, in_place: bool = False) -> Any:
        torch = self.torch
        F = torch.nn.functional
        if len(comp_ids) == 0:
            return torch.zeros_like(x)
        k = len(comp_ids)
        if in_place:    # the cache's own rows [0, k): no gather, and the down GEMV on the row layout
            rows_t = torch.from_numpy(cache.rows[:k]).view(self.tdtype)
        else:
            # gather: whole cache rows into the preallocated scratch (real.runtime.cache_matrices.gather_rows), then
            # the segments are views of it. The scratch's rows are GATHER_ROW_PAD_BYTES wider than
            # the cache's: see real.runtime.cache_matrices.GATHER_ROW_PAD_BYTES
            scratch = self._gather.get(max(k, cache.capacity), cache.row_stride_bytes + GATHER_ROW_PAD_BYTES)
            rows_t = gather_rows(cache.rows, cache.slot_of[comp_ids], scratch, self.tdtype)
        es = rows_t.element_size()
        w = self.seg_bytes // es
        xs = x.to(self.tdtype)
        if self.dev.kind != "cpu":
            # one host-to-device copy of the whole [k, stride] block, from page-locked memory (the
            # pinned gather scratch, or the cache arena pinned in __init__), then the segments are
            # views on the device. A column slice of the host rows is not contiguous: `.to()` of it
            # first copies it into pageable memory on the CPU, and the transfer is then synchronous.
            rows_t = rows_t.to(self.tdev, non_blocking=True)
            xs = xs.to(self.tdev)
        segs = [rows_t[:, i * w:(i + 1) * w] for i in range(self.n_seg)]
        if self.spec.gated:
            gate, up, down = segs
            h = _act(torch, self.spec.ffn_kind, F.linear(xs, gate)) * F.linear(xs, up)
        else:
            up, down = segs
            h = _act(torch, self.spec.ffn_kind, F.linear(xs, up))
        # down: one contiguous [d, k] copy (from 8 MiB on a preallocated one: real.runtime.cache_matrices.TransposeScratch),
        # then the same GEMV kernel (F.linear) HF's dense down_proj uses; `h @ down` on the row
        # layout accumulates in another order (SmolLM2 logits then differ from HF by ~1.4e-4
        # instead of <= 1e-4). The copy is k*d elements. In place, the copy would read the cache's
        # 4 KiB-strided rows (the thrashing GATHER_ROW_PAD_BYTES avoids): the row layout instead
        if in_place:
            y = h @ down
        else:
            y = F.linear(h, self._down_t.transposed(down, k, w, es))
        y = y.to(x.dtype).to(x.device)
        if self.dev.kind == "cuda":
            # the step's compute time includes the GPU's, and the host may rewrite the cache rows
            # (reads, keep_only's moves) only after their asynchronous copy has finished
            torch.cuda.current_stream().synchronize()
        return y


class RealCapacityError(CapacityError, FlashsimError):
    """A step's computed set does not fit the layer's cache share, raised by `RealExecutor.ffn`.

    A `CapacityError` (model mode catches it and names its predictor) and a `FlashsimError` (shape
    mode lets it reach the CLI: one line, exit 2)."""

    def __init__(self, layer: int, step: int, need_neurons: int, cap_neurons: int):
        super().__init__(layer, step, need_neurons, cap_neurons)
        self.args = (f"DRAM budget too small at step {step}: layer {layer} computes {need_neurons} neurons but its "
                     f"share of the cache holds {cap_neurons}; raise --dram-budget or use a sparser policy or trace",)

    def __str__(self) -> str:
        return str(self.args[0])


def store_alignment_bytes(store: Any) -> int:
    """Bytes each unit occupies on flash is rounded up to: the store's `align_bytes` when its units are
    padded, 0 when packed (a packed store's reads are widened to 4 KiB per read instead, which the
    layout does not model)."""
    return int(store.manifest.align_bytes) if store.manifest.alignment == "padded" else 0


def store_config(config: RunConfig, store: Any) -> tuple[RunConfig, str | None]:
    """`config` with the bundling layout's `align_bytes` taken from the store's manifest, and a note
    when that replaced a different value the run asked for (None otherwise). The window's
    `insert_copy` is set false: the reader writes new neurons straight into the cache's rows (a
    packed store's staging copy is part of the read), so no insert copy is made."""
    if config.residency.name == "window" and getattr(config.residency.params, "insert_copy", False):
        config = config.with_overrides(["window.insert_copy=false"])
    if config.layout.name != "bundling":
        return config, None
    want = store_alignment_bytes(store)
    had = int(config.layout.params.align_bytes)
    if had == want:
        return config, None
    note = None
    if had != 0:
        note = (f"bundling.align_bytes={had} replaced by {want}: the store {store.path} is {store.manifest.alignment} "
                "and its layout is what the reads move")
    return config.with_overrides([f"bundling.align_bytes={want}"]), note


def check_threads(threads: int | None, profile: DeviceProfile) -> str | None:
    """Compute threads of a real run vs. the profile's measurement: FlashsimError for < 1; a loud
    warning (returned, and issued with `warnings.warn`) when they differ, since the simulator then
    times the compute with rates measured at another thread count."""
    if threads is not None and threads < 1:
        raise FlashsimError(f"--threads {threads}: must be >= 1")
    measured = profile.compute.threads
    if threads is None or measured is None or threads == measured:
        return None
    msg = (f"WARNING: the real run computes with {threads} thread(s) but profile {profile.name!r} measured its "
           f"compute rates with {measured}; simulated compute times will not match: re-run `flashsim bench "
           f"compute --threads {threads}` or run with --threads {measured}")
    warnings.warn(msg, stacklevel=3)
    return msg


def _act(torch: Any, kind: str, g: Any) -> Any:
    if kind in ("swiglu", "silu"):
        return torch.nn.functional.silu(g)
    if kind in ("geglu", "gelu"):
        return torch.nn.functional.gelu(g)
    return torch.relu(g)

