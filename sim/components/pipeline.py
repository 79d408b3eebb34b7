"""The decoder process of the DES: steps, and inside each step the layers, in simulated time.

Per layer l of step s (times from `PlanArrays`; reads through the FIFO `FlashDevice`):

    1. streamed attention weights (memory.stream_non_ffn, or mmap misses): read, wait
    2. attention + predictor compute
    3. demand reads of the FFN's missing neurons: planned by the reader, issued, wait (stall)
    4. wait for this layer's prefetch if it has not landed yet (a late prefetch: stall)
    5. lookahead: issue the prefetch of (s, l+1) (and (s, 0) at step start)
    6. memory management (move rows in the cache matrix), then the FFN compute
    7. delta: issue the prefetch of (s+1, l), into the rows the cache update freed
  then the lm_head (after its streamed weights, if any).

Events: one SimPy timeout per wait and one per run of consecutive compute phases (attention,
memory management and FFN of a layer merge when nothing waits between them), so a layer costs
one to three events. Compute phases on unified-memory devices are stretched by the flash DMA
scheduled during them (`sim.components.compute.stretch`). On a host whose CPU both computes and
submits the reads (`plan.host_cpu`, from the profile's `flash.host_cpu_s_per_read` > 0), every
compute phase is also stretched by the CPU the reads in flight take (`FlashDevice.cpu_segments_after`),
and prefetch batches take longer by their own CPU time (added to the step's io_s). A compiled
loop takes the kernel constants; a Python decoder loop on a profile with the three host-CPU probes instead takes them at the seconds per
torch call of the phase that runs (`HostCpu.at`): the attention's compute without contention over
the attention's calls, the memory management and FFN's over the FFN step's, and for a batch's own
delay and the lm_head the whole layer's (a batch spans both phases; the lm_head's calls are not
counted).

Same-time rule: the decoder is the only process that submits reads, in non-decreasing issue time;
the budget process (when a timeline is given) runs at its own times and only changes the budget
the next planned layer sees. SimPy orders same-time events FIFO by insertion; the budget process is
started first, so a change at time t applies to a layer starting at t.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import simpy

from sim.components.compute import stretch
from sim.components.flash import FlashDevice
from sim.policies.base import IssuePoint
from sim.records import MemorySample, Recorder, TokenRecord
from sim.step_plans import PlanArrays


class Cell(NamedTuple):
    """The plan of one (step, layer) as the decoder reads it: seconds, bytes, read counts."""

    stream_s: float        # streamed attention weights (memory.stream_non_ffn, or mmap misses)
    stream_bytes: float
    stream_reads: float
    dem_s: float           # demand reads of the FFN's missing neurons
    dem_bytes: float
    dem_reads: float
    pf_s: float            # the prefetch whose target is this (step, layer)
    pf_bytes: float
    pf_reads: float
    mgmt_mem_s: float      # memory management (rows moved in the cache matrix): DRAM-bound part
    mgmt_ovh_s: float      # ... and its fixed overhead
    ffn_flop_s: float      # the FFN: FLOP-bound, DRAM-bound, gather and overhead parts
    ffn_mem_s: float
    ffn_gather_s: float
    ffn_ovh_s: float


class StepTiming(NamedTuple):
    """When one step ran and where its time went (seconds, simulated clock)."""

    t_start_s: float
    t_end_s: float
    compute_s: float
    stall_s: float
    mem_mgmt_s: float
    ffn_compute_s: float


@dataclass
class _StepSums:
    """Per-step sums the layers add to, in the order the decoder meets them."""

    stall_s: float = 0.0
    compute_s: float = 0.0
    mem_mgmt_s: float = 0.0
    ffn_compute_s: float = 0.0


class Decoder:
    """Runs the steps of a plan on a FlashDevice; writes TokenRecords into a Recorder.

    `issue` is the prefetcher's `IssuePoint` (sim/policies/base.py): when the plan's prefetch reads
    of a (step, layer) are submitted."""

    def __init__(self, env: simpy.Environment, plan: PlanArrays, flash: FlashDevice, issue: IssuePoint,
                 unified: bool, recorder: Recorder, plan_cell: Callable[[int, int], None] | None = None,
                 finish_step: Callable[[int], None] | None = None):
        self.env, self.p, self.flash, self.issue = env, plan, flash, IssuePoint(issue)
        self.unified, self.rec = unified, recorder
        self.plan_cell, self.finish_step = plan_cell, finish_step
        self.host = plan.host_cpu                       # sim.components.compute.HostCpu or None
        flash.enable_host_cpu(self.host)
        self.delta = self.issue is IssuePoint.PREVIOUS_STEP
        self.lookahead = self.issue is IssuePoint.PREVIOUS_LAYER
        self.pf_end = [0.0] * plan.L    # completion time of the prefetch each layer consumes next
        # a Python decoder loop's seconds per torch call (0: a compiled one): the last layer's, and
        # in its attention and FFN-step phases (HostCpu.at places the interference by them)
        self.lop = self.lop_a = self.lop_f = 0.0
        self.times: list[StepTiming] = []

    def _cells(self, s: int) -> list[Cell]:
        p = self.p
        return list(map(Cell._make, zip(*(p.sl[f][s].tolist() for f in Cell._fields))))

    def run(self) -> Generator[Any, Any, None]:
        for s in range(self.p.S):
            yield from self._step(s)
        extra = self.flash.host_cpu_extra_s if self.host is not None else None
        self.rec.tokens.extend(build_records(self.p, self.times, extra))

    def _step(self, s: int) -> Generator[Any, Any, None]:
        env, p = self.env, self.p
        L = p.L
        planned = self.plan_cell is None
        cells = self._cells(s) if planned else None
        nxt = self._cells(s + 1) if self.delta and s + 1 < p.S and planned else None
        t_start = env.now
        sums = _StepSums()
        af, am, ao = float(p.attn.flop_s[s]), float(p.attn.mem_s[s]), float(p.attn.ovh_s[s])
        a_warm = (af if af > am else am) + ao     # one layer's attention without contention
        if self.lookahead and p.pf_s[s, 0] > 0:   # (seconds per call: the previous layer's)
            self.pf_end[0] = self.flash.submit(t_start, p.pf_s[s, 0], p.pf_bytes[s, 0], p.pf_reads[s, 0], "prefetch",
                                               s, 0, a_warm, self.lop)
        for layer in range(L):
            if cells is None:
                self.plan_cell(s, layer)  # type: ignore[misc]
                row = self._cells(s)
            else:
                row = cells
            c_next = row[layer + 1] if layer + 1 < L else None
            yield from self._layer(s, layer, row[layer], c_next, nxt, planned, (af, am, ao, a_warm), sums)
        if self.finish_step is not None:
            self.finish_step(s)
        yield from self._head(s, sums)
        self.times.append(StepTiming(t_start, env.now, sums.compute_s, sums.stall_s, sums.mem_mgmt_s,
                                     sums.ffn_compute_s))
        self.rec.memory.append(MemorySample(t_start, int(p.dram_bytes[s]), int(p.budget_bytes[s])))

    def _layer(self, s: int, layer: int, c: Cell, c_next: Cell | None, nxt: list[Cell] | None, planned: bool,
               attn: tuple[float, float, float, float], sums: _StepSums) -> Generator[Any, Any, None]:
        """Steps 1-7 of the module doc for layer `layer` of step `s`."""
        ov = self._loop_rates(c, attn[3])
        # 1. streamed attention weights, 2. attention (+ predictor)
        now, d_attn = yield from self._attention(s, layer, c, attn, sums)
        # 3. demand reads and 4. a late prefetch make the layer wait
        t_ffn, pending = yield from self._wait_for_reads(s, layer, c, now, d_attn, sums)
        # 5. lookahead prefetch at the FFN start. With a shared host CPU a prefetch's reads
        # wait for the compute they overlap, at most one layer's (this FFN and the next
        # attention): the decoder issues one batch per layer, and the batches in the device's
        # queue share its compute, so a step's batches together can wait at most for the
        # step's compute (delta), and a lookahead batch is needed after one layer anyway.
        if self.lookahead and c_next is not None and c_next.pf_s > 0:
            self.pf_end[layer + 1] = self.flash.submit(t_ffn, c_next.pf_s, c_next.pf_bytes, c_next.pf_reads,
                                                       "prefetch", s, layer + 1, ov, self.lop)
        # 6. memory management, then the FFN
        d_mg, d_ffn = self._ffn_phases(c, t_ffn)
        t_f = t_ffn + d_mg
        iv = self.rec.interval if self.rec.intervals is not None else None
        if d_mg > 0:
            sums.mem_mgmt_s += d_mg
            if iv:
                iv("memory", f"cache rows L{layer}", s, layer, t_ffn, t_ffn + d_mg)
        sums.compute_s += d_ffn
        sums.ffn_compute_s += d_ffn
        if iv:
            iv("compute", f"FFN L{layer}", s, layer, t_f, t_f + d_ffn)
        # 7. delta: issue (s + 1, l) at the layer's end
        if self.delta:
            self._issue_delta(s, layer, t_f + d_ffn, nxt, planned, ov)
        yield self.env.timeout(pending + d_mg + d_ffn)

    def _loop_rates(self, c: Cell, a_tot: float) -> float:
        """The layer's compute without contention (what a prefetch overlaps; 0 without a shared host
        CPU); on a Python decoder loop, also sets its seconds per torch call over the layer and over
        its attention and FFN-step phases."""
        if self.host is None:
            return 0.0
        ffn_warm = c.ffn_flop_s if c.ffn_flop_s > c.ffn_mem_s else c.ffn_mem_s
        ov = c.mgmt_mem_s + c.mgmt_ovh_s + c.ffn_gather_s + ffn_warm + c.ffn_ovh_s + a_tot
        p = self.p
        if p.loop_ops:
            self.lop = ov / p.loop_ops
            self.lop_a = a_tot / p.loop_attention_ops
            self.lop_f = (ov - a_tot) / (p.loop_ops - p.loop_attention_ops)
        return ov

    def _attention(self, s: int, layer: int, c: Cell, attn: tuple[float, float, float, float],
                   sums: _StepSums) -> Generator[Any, Any, tuple[float, float]]:
        """Wait for the layer's streamed weights, then time its attention (+ predictor), stretched by
        the flash DMA and the reads' CPU under way; returns (its start, its duration)."""
        env, flash = self.env, self.flash
        iv = self.rec.interval if self.rec.intervals is not None else None
        af, am, ao, a_tot = attn
        now = env.now
        if c.stream_s > 0:
            end = flash.submit(now, c.stream_s, c.stream_bytes, c.stream_reads, "stream", s, layer)
            yield env.timeout(end - now)
            sums.stall_s += end - now
            if iv:
                iv("stall", "wait: streamed weights", s, layer, now, end)
            now = end
        if self.unified and flash.free_at_s > now:
            m = stretch(now, am, flash.segments_after(now))
            d_attn = (af if af > m else m) + ao
        else:
            d_attn = a_tot
        if self.host is not None and flash.free_at_s > now:
            d_attn = stretch(now, d_attn, flash.cpu_segments_after(now, self.lop_a))
        sums.compute_s += d_attn
        if iv:
            iv("compute", f"attention L{layer}", s, layer, now, now + d_attn)
        return now, d_attn

    def _wait_for_reads(self, s: int, layer: int, c: Cell, now: float, d_attn: float,
                        sums: _StepSums) -> Generator[Any, Any, tuple[float, float]]:
        """Issue the demand reads at the attention's end and wait for them and for this layer's
        prefetch; returns (the FFN's start, the attention time still to elapse in simulated time)."""
        t_ffn = now + d_attn
        wait_until = t_ffn
        if c.dem_s > 0:
            wait_until = self.flash.submit(t_ffn, c.dem_s, c.dem_bytes, c.dem_reads, "demand", s, layer)
        pe = self.pf_end[layer]
        if pe > wait_until:
            wait_until = pe
        self.pf_end[layer] = 0.0
        if wait_until <= t_ffn:
            return t_ffn, d_attn
        yield self.env.timeout(wait_until - now)
        sums.stall_s += wait_until - t_ffn
        if self.rec.intervals is not None:
            self.rec.interval("stall", f"wait: flash L{layer}", s, layer, t_ffn, wait_until)
        return wait_until, 0.0

    def _issue_delta(self, s: int, layer: int, t_end: float, nxt: list[Cell] | None, planned: bool,
                     ov: float) -> None:
        """Issue the prefetch of (s + 1, layer) at the layer's end. Its reads land in cache rows that
        the drop of this step's computed-but-not-kept neurons frees, after the FFN has used them (a
        cache at its share deletes before it inserts), so its CPU cost falls on the next layers'
        compute, not on this layer's."""
        p, submit = self.p, self.flash.submit
        if nxt is not None:
            n_pf = nxt[layer]
            if n_pf.pf_s > 0:
                self.pf_end[layer] = submit(t_end, n_pf.pf_s, n_pf.pf_bytes, n_pf.pf_reads, "prefetch", s + 1,
                                            layer, ov, self.lop)
        elif not planned and s + 1 < p.S and p.pf_s[s + 1, layer] > 0:
            self.pf_end[layer] = submit(t_end, p.pf_s[s + 1, layer], p.pf_bytes[s + 1, layer],
                                        p.pf_reads[s + 1, layer], "prefetch", s + 1, layer, ov, self.lop)

    def _ffn_phases(self, c: Cell, t_ffn: float) -> tuple[float, float]:
        """(memory management, FFN) durations from `t_ffn`, stretched by the flash DMA (unified
        memory) and by the reads' CPU (a shared host CPU) scheduled during them."""
        flash = self.flash
        busy = self.unified and flash.free_at_s > t_ffn
        d_mg = 0.0
        if c.mgmt_mem_s > 0 or c.mgmt_ovh_s > 0:
            d_mg = (stretch(t_ffn, c.mgmt_mem_s, flash.segments_after(t_ffn)) if busy else c.mgmt_mem_s) + c.mgmt_ovh_s
        t_f = t_ffn + d_mg
        ff_f = c.ffn_flop_s
        if busy:
            sg = flash.segments_after(t_f)
            g = stretch(t_f, c.ffn_gather_s, sg) if c.ffn_gather_s > 0 else 0.0
            m = stretch(t_f + g, c.ffn_mem_s, sg)
            d_ffn = g + (ff_f if ff_f > m else m) + c.ffn_ovh_s
        else:
            d_ffn = c.ffn_gather_s + (ff_f if ff_f > c.ffn_mem_s else c.ffn_mem_s) + c.ffn_ovh_s
        if self.host is not None and flash.free_at_s > t_ffn and d_mg + d_ffn > 0:
            # both are CPU work: stretch them as one block (the prefetch issued just before
            # would otherwise land wholly on the short row copy) and keep their proportions
            f = stretch(t_ffn, d_mg + d_ffn, flash.cpu_segments_after(t_ffn, self.lop_f)) / (d_mg + d_ffn)
            d_mg, d_ffn = d_mg * f, d_ffn * f
        return d_mg, d_ffn

    def _head(self, s: int, sums: _StepSums) -> Generator[Any, Any, None]:
        """The lm_head of step `s`, after its streamed weights (if any)."""
        env, p, flash = self.env, self.p, self.flash
        iv = self.rec.interval if self.rec.intervals is not None else None
        L = p.L
        t = p.head_read_s[s]
        if t > 0:
            now = env.now
            end = flash.submit(now, t, p.head_read_bytes[s], p.head_reads[s], "stream", s, L)
            yield env.timeout(end - now)
            sums.stall_s += end - now
            if iv:
                iv("stall", "wait: streamed lm_head", s, L, now, end)
        now = env.now
        hf, hm, ho = float(p.head.flop_s[s]), float(p.head.mem_s[s]), float(p.head.ovh_s[s])
        if self.unified and flash.free_at_s > now:
            hm = stretch(now, hm, flash.segments_after(now))
        d = (hf if hf > hm else hm) + ho
        if self.host is not None and flash.free_at_s > now:
            d = stretch(now, d, flash.cpu_segments_after(now, self.lop))
        sums.compute_s += d
        if iv:
            iv("compute", "lm_head", s, L, now, now + d)
        yield env.timeout(d)


def build_records(p: PlanArrays, times: list[StepTiming],
                  extra_io_s: dict[int, float] | None = None) -> list[TokenRecord]:
    """TokenRecords of steps 0..len(times)-1 from the plan and each step's `StepTiming`;
    `extra_io_s` {step: seconds} adds service time the DES gave reads beyond the plan's (host CPU)."""
    n = len(times)
    sl = {f: p.sl[f][:n].sum(axis=1) for f in ("stream_s", "dem_s", "pf_s", "stream_bytes", "dem_bytes",
                                             "pf_bytes", "stream_reads", "dem_reads", "pf_reads",
                                             "computed", "hits")}
    io = (sl["stream_s"] + sl["dem_s"] + sl["pf_s"] + p.head_read_s[:n]).tolist()
    if extra_io_s:
        io = [t + extra_io_s.get(s, 0.0) for s, t in enumerate(io)]
    stream_b = (sl["stream_bytes"] + p.head_read_bytes[:n]).astype(np.int64).tolist()
    dem_b = sl["dem_bytes"].astype(np.int64).tolist()
    pf_b = sl["pf_bytes"].astype(np.int64).tolist()
    reads = (sl["stream_reads"] + sl["dem_reads"] + sl["pf_reads"] + p.head_reads[:n]).astype(np.int64).tolist()
    md, rd = p.mass_den[:n], p.rec_den[:n]
    mass = np.where(md > 0, p.mass_num[:n] / np.where(md > 0, md, 1), 1.0).tolist()
    rec = np.where(rd > 0, p.rec_num[:n] / np.where(rd > 0, rd, 1), 1.0).tolist()
    ints = {k: np.asarray(v[:n]).astype(np.int64).tolist() for k, v in (
        ("n_tokens", p.n_tokens), ("dram", p.dram_bytes), ("cache", p.cache_bytes), ("kv", p.kv_bytes),
        ("budget", p.budget_bytes), ("computed", sl["computed"]), ("hits", sl["hits"]))}
    phase = p.phase[:n].tolist()
    out = []
    for s, st in enumerate(times):
        t0, t1 = st.t_start_s, st.t_end_s
        out.append(TokenRecord(
            token=s, phase="prefill" if phase[s] == 0 else "decode", n_tokens=ints["n_tokens"][s],
            t_start_s=t0, t_end_s=t1, latency_s=t1 - t0, io_s=io[s], compute_s=st.compute_s,
            ffn_compute_s=st.ffn_compute_s, stall_s=st.stall_s, mem_mgmt_s=st.mem_mgmt_s,
            bytes_read=stream_b[s] + dem_b[s] + pf_b[s], demand_bytes=dem_b[s],
            prefetch_bytes=pf_b[s], stream_bytes=stream_b[s], reads_issued=reads[s],
            resident_bytes=ints["dram"][s], cache_bytes=ints["cache"][s], kv_bytes=ints["kv"][s],
            budget_bytes=ints["budget"][s], computed=ints["computed"][s], hits=ints["hits"][s],
            activation_mass_kept=mass[s], recall=rec[s]))
    return out
