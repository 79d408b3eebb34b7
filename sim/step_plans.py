"""Step plans (`StepPlanner`, `PlanArrays`): from policy decisions (sets) to the numbers timing needs,
per step and layer.

This is the "what the trace decides" half of the simulator. For every (step, layer) it turns the
`PolicyStack`'s sets into: read batches (chunk-size counts through the layout, then service times
from the read curve), compute phase costs, memory-management bytes, cache sizes and the quality
proxy; per step it adds the lm_head, streamed tensors and the DRAM accounting. Nothing here
depends on simulated time, so the DES (`sim.components.pipeline`) and the analytic fast path
(`sim.fastpath`) consume the same `PlanArrays`.

Two ways to fill them: `plan_all` (layer by layer over all steps: vectorised; used when the budget
is fixed) and `plan_cell` (one step of one layer, called by the DES when a budget timeline can
change the cache share between layers).

Block pruning (`dropped`, bool [2L] in sim/blocks.py order): a dropped FFN layer is never planned
(no reads, no cache, no FFN compute, no predictor; its quality counts every neuron as not computed);
a dropped MHA layer streams no attention weights and computes no attention. The decoder times one
attention phase per step for every layer, so `PlanArrays.attn` holds the per-layer MEAN over the
step's layers of each layer's own phase (attention if its MHA is kept, plus the predictor if its FFN
is kept): L x its total is exactly the step's attention time (see `_pruned_attention`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from devices.errors import BudgetError
from devices.model_spec import ModelSpec
from devices.schema import DeviceProfile
from devices.units import format_bytes
from sim import bitsets
from sim.components.compute import ComputeModel, HostCpu, Phase
from sim.components.flash import ReadCost, region_time_s
from sim.components.memory import MemoryModel
from sim.decisions import PAGES, DecisionMemo, LayerOutcome, QualityMemo
from sim.policies.base import CapacityError
from sim.policies.stack import LayerPlan, PolicyStack
from sim.quality_proxy import layer_quality
from sim.workload import TraceView

# Steps planned per call: the policies' carried state makes chunks equivalent to one long range,
# and a chunk's packed sets (steps x words x 8 B, ~350 KB for a 7B layer) stay in the CPU caches.
PLAN_CHUNK_STEPS = 256

SL_FIELDS = ("stream_s", "stream_bytes", "stream_reads", "dem_s", "dem_bytes", "dem_reads", "pf_s", "pf_bytes",
             "pf_reads", "ffn_flop_s", "ffn_mem_s", "ffn_gather_s", "ffn_ovh_s", "mgmt_mem_s", "mgmt_ovh_s",
             "computed", "needed", "correct", "hits", "before", "after", "peak")
S_FIELDS = ("head_read_s", "head_read_bytes", "head_reads", "mass_num", "mass_den", "rec_num", "rec_den",
            "cache_bytes", "dram_bytes", "budget_bytes")


@dataclass
class PlanArrays:
    """Per (step, layer) and per step numbers; see SL_FIELDS / S_FIELDS. Seconds, bytes, counts."""

    S: int
    L: int
    sl: dict[str, np.ndarray] = field(default_factory=dict)
    s: dict[str, np.ndarray] = field(default_factory=dict)
    attn: Phase | None = None        # [S] (identical for every layer)
    head: Phase | None = None        # [S]
    kv_bytes: np.ndarray | None = None
    fixed_bytes: int = 0
    phase: np.ndarray | None = None
    n_tokens: np.ndarray | None = None
    planned_steps: int = 0
    host_cpu: HostCpu | None = None  # reads' CPU cost on a host that computes on the same cores
    loop_ops: int = 0                # torch calls per layer of a Python decoder loop (host_cpu.at places it)
    loop_attention_ops: int = 0      # ... of them in the attention phase (the rest: the FFN step)

    def __getattr__(self, name: str) -> np.ndarray:
        d = self.__dict__
        if name in d.get("sl", {}):
            return d["sl"][name]
        if name in d.get("s", {}):
            return d["s"][name]
        raise AttributeError(name)

    def ffn_phase(self) -> Phase:
        return Phase(self.ffn_flop_s, self.ffn_mem_s, self.ffn_gather_s, self.ffn_ovh_s)

    def mgmt_total_s(self) -> np.ndarray:
        return self.mgmt_mem_s + self.mgmt_ovh_s


class StepPlanner:
    """Fills PlanArrays for one run from its bound PolicyStack."""

    def __init__(self, stack: PolicyStack, view: TraceView, spec: ModelSpec, profile: DeviceProfile,
                 memory: MemoryModel, compute: ComputeModel, in_flight: int, stream_non_ffn: bool,
                 quality_memo: QualityMemo | None = None, dropped: np.ndarray | None = None,
                 memo: DecisionMemo | None = None):
        self.stack, self.view, self.spec, self.profile = stack, view, spec, profile
        self.memo = memo   # this run's decisions: recorded by plan_all, or replayed when complete
        self.dropped = np.zeros(2 * spec.n_layers, bool) if dropped is None else np.asarray(dropped, bool)
        if self.dropped.shape != (2 * spec.n_layers,):
            raise ValueError(f"dropped must have shape ({2 * spec.n_layers},), got {self.dropped.shape}")
        self.mha_kept = ~self.dropped[0::2]
        self.ffn_kept = ~self.dropped[1::2]
        self.memory, self.compute = memory, compute
        self.steps = view.steps
        S, L = self.steps.n, spec.n_layers
        self.S, self.L = S, L
        layout = stack.layout
        self.read_cost = ReadCost(profile.flash.curve, layout.chunk_sizes(), in_flight, profile.flash.batch_overhead_at)
        # each staged read's copy out of the reader's staging buffer (0 unless the profile prices it)
        self.staged_s_per_read = profile.flash.staged_s_per_read if layout.staged_reads() else 0.0
        self.segment_s = profile.flash.segment_s if layout.segmented_reads() else 0.0
        self.in_flight = in_flight
        self.stream_non_ffn = stream_non_ffn
        self.manages_cache = stack.residency.manages_cache
        self.insert_copy = stack.residency.copies_on_insert()
        # (layer, start, stop) -> quality sums; shared by runs whose computed sets are identical
        self.quality_memo = quality_memo
        a = PlanArrays(S, L)
        a.sl = {f: np.zeros((S, L)) for f in SL_FIELDS}
        a.s = {f: np.zeros(S) for f in S_FIELDS}
        decode = self.steps.phase == 1
        pred = stack.predictor
        args = (self.steps.n_tokens, self.steps.attn_ctx_sum, self.steps.kv_tokens, decode)
        a.attn = compute.attention(*args, pred.flops_per_token_per_layer(), pred.weight_bytes_per_layer())
        if self.dropped.any():
            a.attn = _pruned_attention(a.attn, compute.attention(*args), self.mha_kept, self.ffn_kept)
        a.head = compute.head(self.steps.batch, self.steps.n_tokens)
        # bytes a layer's attention (and predictor) streams from DRAM per step (sim/energy.py's traffic)
        self.attn_bytes = compute.attention_bytes(*args[1:]) + pred.weight_bytes_per_layer()
        a.kv_bytes = memory.kv_bytes
        a.fixed_bytes = memory.fixed_bytes
        a.phase, a.n_tokens = self.steps.phase, self.steps.n_tokens
        a.host_cpu = HostCpu.of(profile, compute.python_loop)
        a.loop_ops, a.loop_attention_ops = compute.loop_ops_per_layer, compute.loop_attention_ops
        self.arr = a
        self._stream_rows(a)

    # ---- streamed non-FFN tensors -------------------------------------------------------------
    def _stream_rows(self, a: PlanArrays) -> None:
        if not self.stream_non_ffn or self.stack.residency.page_granular:
            return
        spec, curve, chunk = self.spec, self.profile.flash.curve, self.stack.layout.max_chunk_bytes()
        attn_bytes = spec.attn_bytes_per_layer
        t, n = region_time_s(curve, attn_bytes, chunk, self.in_flight)
        kept = self.mha_kept                    # a dropped MHA layer streams no attention weights
        a.stream_s[:, kept] = t
        a.stream_bytes[:, kept] = attn_bytes
        a.stream_reads[:, kept] = n
        head_bytes = spec.lm_head_bytes if not spec.tied_embeddings else spec.embedding_bytes
        th, nh = region_time_s(curve, head_bytes, chunk, self.in_flight)
        # The embedding lookup reads one row per token (random rows: one read each).
        row = int(np.ceil(spec.d_model * spec.dtype_bytes))
        n_tok = self.steps.n_tokens.astype(np.float64)
        q = np.minimum(n_tok, self.in_flight)
        row_bw = np.array([curve.bytes_per_s(row, int(x)) for x in q])
        a.head_read_s[:] = th + n_tok * row / row_bw
        a.head_read_bytes[:] = head_bytes + n_tok * row
        a.head_reads[:] = nh + n_tok

    # ---- filling ------------------------------------------------------------------------------
    def plan_all(self, budget_bytes: int) -> PlanArrays:
        a = self.arr
        replay = self.memo is not None and self.memo.complete
        if self.stack.residency.page_granular:
            self._plan_pages(0, self.S, budget_bytes)
        else:
            cap = None if replay else self.memory.layer_caps(budget_bytes, 0, self.S, self.L)   # [S + 1, L]
            priced: list[tuple[int, int, int, LayerOutcome]] = []
            for layer in range(self.L):
                for a0 in range(0, self.S, PLAN_CHUNK_STEPS):
                    b0 = min(self.S, a0 + PLAN_CHUNK_STEPS)
                    if not self.ffn_kept[layer]:
                        self._fill_dropped(layer, a0, b0)
                        continue
                    if replay:
                        out = self.memo.outcomes[(layer, a0, b0)]  # type: ignore[union-attr]
                    else:
                        out = self._fill_layer(layer, a0, b0, cap[a0:b0 + 1, layer])  # type: ignore[index]
                    self._record(layer, a0, b0, out)
                    priced.append((layer, a0, b0, out))
            self._price_times(priced)
        self.finish_steps(0, self.S, budget_bytes)
        if self.memo is not None:
            self.memo.complete = True
        return a

    def plan_cell(self, step: int, layer: int, budget_bytes: int) -> None:
        if self.stack.residency.page_granular:
            if layer == 0:
                self._plan_pages(step, step + 1, budget_bytes)
            return
        if not self.ffn_kept[layer]:
            self._fill_dropped(layer, step, step + 1)
            return
        cap = self.memory.layer_caps(budget_bytes, step, step + 1, self.L)[:, layer]
        self._price(layer, step, step + 1, self._fill_layer(layer, step, step + 1, cap))

    def _fill_layer(self, layer: int, a0: int, b0: int, cap: np.ndarray) -> LayerOutcome:
        """Ask the policies for one layer's sets over steps [a0, b0) and count them (recorded in the
        run's decision memo)."""
        try:
            lp = self.stack.plan(layer, a0, b0, cap)
        except CapacityError as e:
            nb = self.memory.neuron_bytes
            short = (e.need - e.cap) * nb * self.memory.n_layers
            raise BudgetError(
                f"DRAM budget too small at step {e.step}: layer {e.layer} computes {e.need} neurons "
                f"({format_bytes(e.need * nb)}) but its share of the cache holds {e.cap} "
                f"({format_bytes(e.cap * nb)}); the caches need about {format_bytes(short)} ({short:,} bytes) "
                "more over all layers; raise --dram-budget or use a sparser policy") from None
        out = self._outcome(layer, a0, b0, lp)
        if self.memo is not None and not self.memo.complete:
            self.memo.outcomes[(layer, a0, b0)] = out
        return out

    def _outcome(self, layer: int, a0: int, b0: int, lp: LayerPlan) -> LayerOutcome:
        """The counts pricing needs from one layer's sets (no time, no device number)."""
        layout = self.stack.layout
        n_comp = bitsets.count(lp.computed)
        n_need = bitsets.count(lp.needed)
        n_corr = bitsets.count(lp.computed & lp.needed)
        c = lp.cache
        moved = None
        if self.manages_cache:
            moved = rows_moved(c.evicted, c.peak) + (c.inserted if self.insert_copy else 0)
        key = (layer, a0, b0)
        def quality() -> tuple:
            return layer_quality(self.view, layer, a0, b0, lp.computed, lp.needed, n_comp, n_corr, n_need)
        q = quality() if self.quality_memo is None else self.quality_memo.get_or_compute(key, lp.computed, quality)
        return LayerOutcome(
            dem_counts=layout.read_counts(layer, lp.demand),
            pf_counts=layout.read_counts(layer, lp.prefetch_next) if lp.prefetch_next.any() else None,
            computed=n_comp, needed=n_need, correct=n_corr, hits=lp.hits, before=c.before, after=c.after,
            peak=c.peak, moved=moved, quality=q)

    def _price(self, layer: int, a0: int, b0: int, o: LayerOutcome) -> None:
        """Counts, quality and times of one layer's outcome on this run's device."""
        self._record(layer, a0, b0, o)
        self._price_times([(layer, a0, b0, o)])

    def _record(self, layer: int, a0: int, b0: int, o: LayerOutcome) -> None:
        """One layer's set sizes, cache sizes and quality sums (added to the steps' in layer order)."""
        a, rows = self.arr, slice(a0, b0)
        a.computed[rows, layer] = o.computed
        a.needed[rows, layer] = o.needed
        a.correct[rows, layer] = o.correct
        a.hits[rows, layer] = o.hits
        a.before[rows, layer] = o.before
        a.after[rows, layer] = o.after
        a.peak[rows, layer] = o.peak
        mn, md, rn, rd = o.quality
        a.mass_num[rows] += mn
        a.mass_den[rows] += md
        a.rec_num[rows] += rn
        a.rec_den[rows] += rd

    def _price_times(self, items: list[tuple[int, int, int, LayerOutcome]]) -> None:
        """Read, FFN and memory-management times of layer outcomes (layer, a0, b0, outcome) on this
        run's device, all layers of a step range at once: every price is elementwise per (step,
        layer), so the numbers are those of one layer at a time."""
        groups: dict[tuple[int, int], list[tuple[int, LayerOutcome]]] = {}
        for layer, a0, b0, o in items:
            groups.setdefault((a0, b0), []).append((layer, o))
        a, rc = self.arr, self.read_cost
        for (a0, b0), group in groups.items():
            rows = slice(a0, b0)
            layers = np.array([layer for layer, _ in group])
            dem = np.stack([o.dem_counts for _, o in group])          # [layers, steps, chunk sizes]
            n_dem = dem.sum(axis=-1)
            a.dem_s[rows, layers] = self._reads_s(dem, n_dem).T
            a.dem_bytes[rows, layers] = rc.bytes(dem).T
            a.dem_reads[rows, layers] = n_dem.T
            with_pf = [(layer, o.pf_counts) for layer, o in group if o.pf_counts is not None]
            if with_pf:
                pc = np.stack([c for _, c in with_pf])
                n_pf = pc.sum(axis=-1)
                tgt = np.arange(a0, b0) + 1                           # prefetched for the next step
                ok = tgt < self.S
                cells = np.ix_(tgt[ok], np.array([layer for layer, _ in with_pf]))
                a.pf_s[cells] = self._reads_s(pc, n_pf).T[ok]
                a.pf_bytes[cells] = rc.bytes(pc).T[ok]
                a.pf_reads[cells] = n_pf.T[ok]
            n_comp = np.stack([o.computed for _, o in group]).T            # [steps, layers]
            ffn = self.compute.ffn(self.steps.n_tokens[rows], n_comp, self.stack.residency.gathers_at(n_comp))
            a.ffn_flop_s[rows, layers] = ffn.flop_s
            a.ffn_mem_s[rows, layers] = ffn.mem_s
            a.ffn_gather_s[rows, layers] = ffn.gather_s
            a.ffn_ovh_s[rows, layers] = ffn.ovh_s
            moved = [(layer, o.moved) for layer, o in group if o.moved is not None]
            if moved:
                mg = self.compute.memory_management(np.stack([m for _, m in moved]).T)
                cols = np.array([layer for layer, _ in moved])
                a.mgmt_mem_s[rows, cols] = mg.mem_s
                a.mgmt_ovh_s[rows, cols] = mg.ovh_s

    def _reads_s(self, counts: np.ndarray, n_reads: np.ndarray) -> np.ndarray:
        """Service time of each batch of reads (`counts`: reads per chunk size, [steps, sizes]): the
        read table's, plus each staged read's copy, plus the extra destination segments of
        segmented reads (Layout.segmented_reads: a read of j + 1 units, column j, has j extra)."""
        t = self.read_cost.time_s(counts) + self.staged_s_per_read * n_reads
        if self.segment_s > 0:
            t = t + self.segment_s * (counts @ np.arange(counts.shape[-1], dtype=np.float64))
        return t

    def _fill_dropped(self, layer: int, a0: int, b0: int) -> None:
        """A dropped FFN layer: nothing read, cached or computed. The trace's active set still counts in
        the quality proxy's denominators (every neuron of the layer is missing)."""
        a = self.arr
        rows = slice(a0, b0)
        needed = self.view.needed(layer, a0, b0)
        n_need = bitsets.count(needed)
        a.needed[rows, layer] = n_need
        zero = np.zeros(b0 - a0, np.int64)
        mn, md, rn, rd = layer_quality(self.view, layer, a0, b0, np.zeros_like(needed), needed, zero, zero, n_need)
        a.mass_num[rows] += mn
        a.mass_den[rows] += md
        a.rec_num[rows] += rn
        a.rec_den[rows] += rd

    def _plan_pages(self, a0: int, b0: int, budget_bytes: int) -> None:
        """Page-granular residency (mmap): the policy reports misses per tensor group."""
        a = self.arr
        res = self.stack.residency
        key = (PAGES, a0, b0)
        if self.memo is not None and self.memo.complete:
            pages, quality = self.memo.outcomes[key]  # type: ignore[misc]
        else:
            pages = res.advance_pages(a0, b0, self.memory.cache_bytes(budget_bytes, a0, b0))
            quality = [self._dense_quality(layer, a0, b0) for layer in range(self.L)]
            if self.memo is not None:
                self.memo.outcomes[key] = (pages, quality)
        rows = slice(a0, b0)
        for part, (t_f, b_f, r_f) in (("attn", ("stream_s", "stream_bytes", "stream_reads")),
                                      ("ffn", ("dem_s", "dem_bytes", "dem_reads"))):
            misses = pages[part]                     # [S, L] read-ahead windows missed
            t, nbytes = res.miss_cost(misses, self.profile.flash.curve)
            a.sl[t_f][rows] = t
            a.sl[b_f][rows] = nbytes
            a.sl[r_f][rows] = misses
        t, nbytes = res.miss_cost(pages["head"], self.profile.flash.curve)
        a.head_read_s[rows] = t
        a.head_read_bytes[rows] = nbytes
        a.head_reads[rows] = pages["head"]
        a.computed[rows] = self.spec.d_ff
        for layer, (n_need, (mn, md, rn, rd)) in enumerate(quality):
            a.needed[rows, layer] = n_need
            a.correct[rows, layer] = n_need
            a.mass_num[rows] += mn
            a.mass_den[rows] += md
            a.rec_num[rows] += rn
            a.rec_den[rows] += rd
        a.hits[rows] = pages["ffn_hit_neurons"]
        ffn = self.compute.ffn(self.steps.n_tokens[rows], a.computed[rows], gathers=False)  # the mapped dense weights
        a.ffn_flop_s[rows], a.ffn_mem_s[rows] = ffn.flop_s, ffn.mem_s
        a.ffn_gather_s[rows], a.ffn_ovh_s[rows] = ffn.gather_s, ffn.ovh_s
        a.s["cache_bytes"][rows] = pages["cached_bytes"]

    def _dense_quality(self, layer: int, a0: int, b0: int) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """(needed counts, quality sums) of a layer that computes every neuron (the page path)."""
        needed = self.view.needed(layer, a0, b0)
        n_need = bitsets.count(needed)
        key = (layer, a0, b0)
        full = np.ascontiguousarray(np.broadcast_to(bitsets.full(self.spec.d_ff), needed.shape))
        def quality() -> tuple:
            return layer_quality(self.view, layer, a0, b0, full, needed, None, n_need, n_need)
        # a dense run's, when one ran
        q = quality() if self.quality_memo is None else self.quality_memo.get_or_compute(key, full, quality)
        return n_need, q

    def finish_steps(self, a0: int, b0: int, budget_bytes: int | np.ndarray) -> None:
        """DRAM accounting of steps [a0, b0) once all their layers are planned; checks the budget."""
        a = self.arr
        rows = slice(a0, b0)
        if not self.stack.residency.page_granular:
            nb = self.memory.neuron_bytes  # DRAM per cached neuron (padded rows with an aligned layout)
            base = np.maximum(a.before[rows], a.after[rows])
            excess = (a.peak[rows] - base).max(axis=1)
            a.s["cache_bytes"][rows] = (base.sum(axis=1) + excess) * nb
        a.s["budget_bytes"][rows] = budget_bytes
        a.s["dram_bytes"][rows] = a.fixed_bytes + a.kv_bytes[rows] + a.s["cache_bytes"][rows]
        over = a.s["dram_bytes"][rows] - a.s["budget_bytes"][rows]
        if np.any(over > 0):
            i = int(np.argmax(over > 0))
            s = a0 + i
            raise BudgetError(
                f"DRAM budget {format_bytes(a.s['budget_bytes'][s])} exceeded at step {s}: weights, KV cache and "
                f"the layer being streamed need {format_bytes(a.s['dram_bytes'][s])}, {int(over[i]):,} bytes more; "
                "raise --dram-budget or use a policy that keeps less resident")
        a.planned_steps = max(a.planned_steps, b0)


def rows_moved(evicted: np.ndarray, occupied: np.ndarray) -> np.ndarray:
    """Expected rows a deletion copies in the cache matrix (LLM in a flash's delete: the last rows
    move into the holes). Deleting d of n occupied rows moves only the rows that fill holes below
    the new end n - d: with the deleted rows spread uniformly over the occupied ones, d (n - d) / n
    of them. d = n (a window of 0 dropping everything) moves nothing; d << n moves ~d. `occupied`:
    the step's peak occupancy (the rows the deletions see at most)."""
    d = np.asarray(evicted, np.float64)
    n = np.maximum(np.asarray(occupied, np.float64), d)
    return np.where(n > 0, d * (n - d) / np.where(n > 0, n, 1.0), 0.0)


def _pruned_attention(full: Phase, bare: Phase, mha_kept: np.ndarray, ffn_kept: np.ndarray) -> Phase:
    """The per-layer mean attention phase [S] of a pruned model.

    `full` is one layer's attention plus its predictor, `bare` the attention alone (ComputeModel is
    linear in both, so `full - bare` is the predictor alone). Layer l costs
    mha_kept[l] * bare + ffn_kept[l] * predictor (no predictor runs for a dropped FFN). The returned
    phase's components are the means over layers; where layers differ in which of FLOPs or bytes
    bound them, the binding component is raised so that L x total_s() equals the sum of the layers'
    own totals exactly (the decoder and the fast path charge L x the mean per step)."""
    L = len(mha_kept)
    pred = Phase(full.flop_s - bare.flop_s, full.mem_s - bare.mem_s, full.gather_s - bare.gather_s,
                 full.ovh_s - bare.ovh_s)
    comps = {}
    total = np.zeros_like(np.asarray(full.flop_s, np.float64))
    for m, f in ((True, True), (True, False), (False, True)):
        n = int(np.sum((mha_kept == m) & (ffn_kept == f)))
        if n == 0:
            continue
        ph = Phase(*(m * getattr(bare, c) + f * getattr(pred, c) for c in ("flop_s", "mem_s", "gather_s", "ovh_s")))
        total = total + n * ph.total_s()
        for c in ("flop_s", "mem_s", "gather_s", "ovh_s"):
            comps[c] = comps.get(c, 0.0) + n * getattr(ph, c)
    z = np.zeros_like(total)
    flop, mem, gather, ovh = (np.asarray(comps.get(c, z), np.float64) / L for c in ("flop_s", "mem_s", "gather_s", "ovh_s"))
    bound = total / L - gather - ovh                      # the mean of each layer's max(flop, mem)
    flop_bound = flop >= mem
    flop = np.where(flop_bound, np.maximum(flop, bound), flop)
    mem = np.where(flop_bound, mem, np.maximum(mem, bound))
    return Phase(flop, mem, gather, ovh)
