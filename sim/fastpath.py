"""Analytic fast path: the timing of a plan without SimPy, for policies without timing feedback.

Without prefetch every read is a demand read the decoder waits for, and nothing else uses flash,
so flash and compute never overlap: a step's latency is exactly the sum of its phases,

    latency_s = sum over layers (stream wait + attention + demand wait + memory mgmt + FFN)
                + lm_head wait + lm_head

and DMA contention never applies (no transfer runs during compute). This is what the DES computes
event by event for such policies; the registry-wide test checks they agree within 1 %.

Declined (with the reason) when the run has timing feedback: a prefetcher (its reads overlap
compute and may land late: the stall depends on the flash queue) or a budget timeline (changes
arrive at simulated times, so what is resident depends on timing).
"""

from __future__ import annotations

import numpy as np

from sim.components.pipeline import StepTiming, build_records
from sim.records import MemorySample, Recorder
from sim.step_plans import PlanArrays


def decline_reason(timing_slots: list[str], policy_names: dict[str, str], has_timeline: bool) -> str | None:
    """Why the fast path cannot run this configuration (None: it can)."""
    if timing_slots:
        slot = timing_slots[0]
        return (f"{slot} policy {policy_names[slot]!r} has timing feedback (its reads overlap compute and can "
                "arrive late), which only the discrete-event simulation models")
    if has_timeline:
        return "a budget timeline changes the cache at simulated times, which only the discrete-event simulation models"
    return None


def run_fast(p: PlanArrays, recorder: Recorder) -> None:
    """Fill `recorder` with the records the DES would produce for a plan without overlap."""
    if np.any(p.pf_s > 0):
        raise ValueError("the fast path cannot time prefetch reads")
    L = p.L
    attn = p.attn.total_s() * L
    ffn = p.ffn_phase().total_s().sum(axis=1)
    mgmt = p.mgmt_total_s().sum(axis=1)
    head = p.head.total_s()
    stall = p.stream_s.sum(axis=1) + p.dem_s.sum(axis=1) + p.head_read_s
    comp = attn + ffn + head
    latency = comp + mgmt + stall
    t_end = np.cumsum(latency)
    t_start = t_end - latency
    times = list(map(StepTiming._make, zip(t_start.tolist(), t_end.tolist(), comp.tolist(), stall.tolist(),
                                            mgmt.tolist(), ffn.tolist())))
    recorder.tokens.extend(build_records(p, times))
    recorder.memory.extend(MemorySample(t, int(d), int(b)) for t, d, b in
                           zip(t_start.tolist(), p.dram_bytes.tolist(), p.budget_bytes.tolist()))
