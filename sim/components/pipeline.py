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
counted); it also loses each overlapping prefetch's planning (`pf_plan_s`, which the batch's
service time includes).

Same-time rule: the decoder is the only process that submits reads, in non-decreasing issue time;
the budget process (when a timeline is given) runs at its own times and only changes the budget
the next planned layer sees. SimPy orders same-time events FIFO by insertion; the budget process is
started first, so a change at time t applies to a layer starting at t.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import numpy as np
import simpy

from sim.components.compute import stretch
from sim.components.flash import FlashDevice
from sim.records import MemorySample, Recorder, TokenRecord
from sim.step_plans import PlanArrays


class Decoder:
    """Runs the steps of a plan on a FlashDevice; writes TokenRecords into a Recorder."""

    # Per-(step, layer) plan columns the loop reads, in tuple order.
    CELL = ("stream_s", "stream_bytes", "stream_reads", "dem_s", "dem_bytes", "dem_reads", "pf_s", "pf_bytes",
            "pf_reads", "mgmt_mem_s", "mgmt_ovh_s", "ffn_flop_s", "ffn_mem_s", "ffn_gather_s", "ffn_ovh_s",
            "dem_plan_s", "pf_plan_s")

    def __init__(self, env: simpy.Environment, plan: PlanArrays, flash: FlashDevice, trigger: str,
                 unified: bool, recorder: Recorder, plan_cell: Callable[[int, int], None] | None = None,
                 finish_step: Callable[[int], None] | None = None):
        self.env, self.p, self.flash, self.trigger = env, plan, flash, trigger
        self.unified, self.rec = unified, recorder
        self.plan_cell, self.finish_step = plan_cell, finish_step
        self.host = getattr(plan, "host_cpu", None)     # sim.components.compute.HostCpu or None
        flash.enable_host_cpu(self.host)

    def _cells(self, s: int) -> list[tuple]:
        p = self.p
        return list(zip(*(p.sl[f][s].tolist() for f in self.CELL)))

    def run(self) -> Generator[Any, Any, None]:
        env, p, flash, rec = self.env, self.p, self.flash, self.rec
        L = p.L
        iv = rec.interval if rec.intervals is not None else None
        unified = self.unified
        segs = flash.segments_after
        host = self.host is not None
        csegs = flash.cpu_segments_after
        attn_f, attn_m, attn_o = p.attn.flop_s.tolist(), p.attn.mem_s.tolist(), p.attn.ovh_s.tolist()
        loop_ops = p.loop_ops                      # torch calls per layer of a Python loop (0: a compiled one)
        attn_ops = p.loop_attention_ops            # ... of them in the attention phase
        ffn_ops = loop_ops - attn_ops              # ... and in the FFN step
        lop = lop_a = lop_f = 0.0                  # its seconds per call: the layer's, the attention's, the FFN step's
        head_f, head_m, head_o = p.head.flop_s.tolist(), p.head.mem_s.tolist(), p.head.ovh_s.tolist()
        delta = self.trigger == "previous-step"
        lookahead = self.trigger == "previous-layer"
        pf_end = [0.0] * L          # completion time of the prefetch each layer consumes next
        timeout = env.timeout
        submit = flash.submit
        times: list[tuple[float, float, float, float, float, float]] = []
        for s in range(p.S):
            cells = self._cells(s) if self.plan_cell is None else None
            nxt = self._cells(s + 1) if delta and s + 1 < p.S and self.plan_cell is None else None
            t_start = env.now
            stall = comp = mgmt = ffn_c = 0.0
            af, am, ao = attn_f[s], attn_m[s], attn_o[s]
            a_warm = (af if af > am else am) + ao
            a_tot = a_warm
            if lookahead and p.pf_s[s, 0] > 0:   # (seconds per call: the previous layer's)
                pf_end[0] = submit(t_start, p.pf_s[s, 0], p.pf_bytes[s, 0], p.pf_reads[s, 0], "prefetch", s, 0,
                                   a_tot, lop, p.pf_plan_s[s, 0])
            for layer in range(L):
                if cells is None:
                    self.plan_cell(s, layer)  # type: ignore[misc]
                    row = self._cells(s)
                    c = row[layer]
                    c_next = row[layer + 1] if layer + 1 < L else None
                else:
                    c = cells[layer]
                    c_next = cells[layer + 1] if layer + 1 < L else None
                st, st_b, st_r, dm, dm_b, dm_r, _pf, _pfb, _pfr, mg_m, mg_o, ff_f, ff_m, ff_g, ff_o, dpl, _pfp = c
                now = env.now
                a_tot = a_warm
                # the layer's compute without contention: what a prefetch overlaps, and (over the
                # loop's torch calls) the Python loop's seconds per call, in the layer and in each phase
                ov = (mg_m + mg_o + ff_g + (ff_f if ff_f > ff_m else ff_m) + ff_o + a_tot) if host else 0.0
                if host and loop_ops:
                    lop = ov / loop_ops
                    lop_a = a_tot / attn_ops
                    lop_f = (ov - a_tot) / ffn_ops
                # 1. streamed attention weights
                if st > 0:
                    end = submit(now, st, st_b, st_r, "stream", s, layer)
                    yield timeout(end - now)
                    stall += end - now
                    if iv:
                        iv("stall", "wait: streamed weights", s, layer, now, end)
                    now = end
                # 2. attention (+ predictor)
                if unified and flash.free_at_s > now:
                    m = stretch(now, am, segs(now))
                    d_attn = (af if af > m else m) + ao
                else:
                    d_attn = a_tot
                if host and flash.free_at_s > now:
                    d_attn = stretch(now, d_attn, csegs(now, lop_a))
                t_ffn = now + d_attn
                comp += d_attn
                if iv:
                    iv("compute", f"attention L{layer}", s, layer, now, t_ffn)
                # 3. demand reads and 4. a late prefetch make the layer wait
                wait_until = t_ffn
                if dm > 0:   # the reader plans the batch (dpl), then issues it
                    wait_until = submit(t_ffn + dpl, dm, dm_b, dm_r, "demand", s, layer)
                pe = pf_end[layer]
                if pe > wait_until:
                    wait_until = pe
                pf_end[layer] = 0.0
                pending = d_attn
                if wait_until > t_ffn:
                    yield timeout(wait_until - now)
                    stall += wait_until - t_ffn
                    if iv:
                        iv("stall", f"wait: flash L{layer}", s, layer, t_ffn, wait_until)
                    t_ffn = wait_until
                    pending = 0.0
                # 5. lookahead prefetch at the FFN start. With a shared host CPU a prefetch's reads
                # wait for the compute they overlap, at most one layer's (this FFN and the next
                # attention): the decoder issues one batch per layer, and the batches in the device's
                # queue share its compute, so a step's batches together can wait at most for the
                # step's compute (delta), and a lookahead batch is needed after one layer anyway.
                if lookahead and c_next is not None and c_next[6] > 0:
                    pf_end[layer + 1] = submit(t_ffn, c_next[6], c_next[7], c_next[8], "prefetch", s, layer + 1, ov,
                                               lop, c_next[16])
                # 6. memory management, then the FFN
                busy = unified and flash.free_at_s > t_ffn
                d_mg = 0.0
                if mg_m > 0 or mg_o > 0:
                    d_mg = (stretch(t_ffn, mg_m, segs(t_ffn)) if busy else mg_m) + mg_o
                t_f = t_ffn + d_mg
                if busy:
                    sg = segs(t_f)
                    g = stretch(t_f, ff_g, sg) if ff_g > 0 else 0.0
                    m = stretch(t_f + g, ff_m, sg)
                    d_ffn = g + (ff_f if ff_f > m else m) + ff_o
                else:
                    d_ffn = ff_g + (ff_f if ff_f > ff_m else ff_m) + ff_o
                if host and flash.free_at_s > t_ffn and d_mg + d_ffn > 0:
                    # both are CPU work: stretch them as one block (the prefetch issued just before
                    # would otherwise land wholly on the short row copy) and keep their proportions
                    f = stretch(t_ffn, d_mg + d_ffn, csegs(t_ffn, lop_f)) / (d_mg + d_ffn)
                    d_mg, d_ffn = d_mg * f, d_ffn * f
                    t_f = t_ffn + d_mg
                if d_mg > 0:
                    mgmt += d_mg
                    if iv:
                        iv("memory", f"cache rows L{layer}", s, layer, t_ffn, t_ffn + d_mg)
                comp += d_ffn
                ffn_c += d_ffn
                if iv:
                    iv("compute", f"FFN L{layer}", s, layer, t_f, t_f + d_ffn)
                # 7. delta: issue (s + 1, l) at the layer's end. Its reads land in cache rows that the
                #    drop of this step's computed-but-not-kept neurons frees, after the FFN has used them
                #    (a cache at its share deletes before it inserts), so its CPU cost falls on the next
                #    layers' compute, not on this layer's.
                if delta:
                    t_end = t_f + d_ffn
                    if nxt is not None:
                        n_pf = nxt[layer]
                        if n_pf[6] > 0:
                            pf_end[layer] = submit(t_end, n_pf[6], n_pf[7], n_pf[8], "prefetch", s + 1, layer, ov,
                                                   lop, n_pf[16])
                    elif cells is None and s + 1 < p.S and p.pf_s[s + 1, layer] > 0:
                        pf_end[layer] = submit(t_end, p.pf_s[s + 1, layer], p.pf_bytes[s + 1, layer],
                                               p.pf_reads[s + 1, layer], "prefetch", s + 1, layer, ov, lop,
                                               p.pf_plan_s[s + 1, layer])
                yield timeout(pending + d_mg + d_ffn)
            # lm_head
            if self.finish_step is not None:
                self.finish_step(s)
            t = p.head_read_s[s]
            if t > 0:
                now = env.now
                end = submit(now, t, p.head_read_bytes[s], p.head_reads[s], "stream", s, L)
                yield timeout(end - now)
                stall += end - now
                if iv:
                    iv("stall", "wait: streamed lm_head", s, L, now, end)
            now = env.now
            hf, hm, ho = head_f[s], head_m[s], head_o[s]
            if unified and flash.free_at_s > now:
                hm = stretch(now, hm, segs(now))
            d = (hf if hf > hm else hm) + ho
            if host and flash.free_at_s > now:
                d = stretch(now, d, csegs(now, lop))
            comp += d
            if iv:
                iv("compute", "lm_head", s, L, now, now + d)
            yield timeout(d)
            times.append((t_start, env.now, comp, stall, mgmt, ffn_c))
            rec.memory.append(MemorySample(t_start, int(p.dram_bytes[s]), int(p.budget_bytes[s])))
        extra = flash.host_cpu_extra_s if self.host is not None else None
        rec.tokens.extend(build_records(p, times, extra))


def build_records(p: PlanArrays, times: list[tuple[float, float, float, float, float, float]],
                  extra_io_s: dict[int, float] | None = None) -> list[TokenRecord]:
    """TokenRecords of steps 0..len(times)-1 from the plan and (t_start, t_end, compute, stall, mgmt,
    FFN compute); `extra_io_s` {step: seconds} adds service time the DES gave reads beyond the
    plan's (host CPU)."""
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
    for s, (t0, t1, comp, stall, mgmt, ffn_c) in enumerate(times):
        out.append(TokenRecord(
            token=s, phase="prefill" if phase[s] == 0 else "decode", n_tokens=ints["n_tokens"][s],
            t_start_s=t0, t_end_s=t1, latency_s=t1 - t0, io_s=io[s], compute_s=comp, ffn_compute_s=ffn_c,
            stall_s=stall, mem_mgmt_s=mgmt, bytes_read=stream_b[s] + dem_b[s] + pf_b[s], demand_bytes=dem_b[s],
            prefetch_bytes=pf_b[s], stream_bytes=stream_b[s], reads_issued=reads[s],
            resident_bytes=ints["dram"][s], cache_bytes=ints["cache"][s], kv_bytes=ints["kv"][s],
            budget_bytes=ints["budget"][s], computed=ints["computed"][s], hits=ints["hits"][s],
            activation_mass_kept=mass[s], recall=rec[s]))
    return out
