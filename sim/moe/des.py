"""The MoE decode as a discrete-event simulation (SimPy): one event per layer and per read batch.

The same model as sim/moe/timing.py's `fast_path`: the flash is a one-slot resource serving read
batches in the order they are issued (a batch's service time is the read curve's time for its
requests at their depth), and the decoder is one process walking tokens and layers. Demand and
prefetch batches are separate processes requesting the flash, so a prefetch issued behind a demand
batch waits for it, and a demand batch of the next layer waits for an earlier prefetch.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np
import simpy

from sim.moe.timing import LayerCosts, Timeline


def _read(env: simpy.Environment, flash: simpy.Resource, dur: float, io: list[float]) -> Generator[Any, Any, None]:
    with flash.request() as req:
        yield req
        io[0] += dur
        yield env.timeout(dur)


def run_des(costs: LayerCosts, hits: np.ndarray, pf_hits: np.ndarray, misses: np.ndarray,
            pf_reads: np.ndarray, page_faults: bool) -> Timeline:
    """Simulate the decode of every token of the [T, M] counts; the timeline per token."""
    env = simpy.Environment()
    flash = simpy.Resource(env, capacity=1)
    T, M = hits.shape
    start, end, io, stall = (np.zeros(T) for _ in range(4))
    batch, e = costs.read_batch_s, costs.expert_s

    def decoder() -> Generator[Any, Any, None]:
        for t in range(T):
            start[t] = env.now
            acc = [0.0]
            pf_event: dict[int, Any] = {}
            for l_, m in enumerate(costs.moe_index):
                yield env.timeout(costs.pre_s[l_])
                if m < 0:
                    continue
                yield env.timeout(costs.router_s[l_])
                nm = int(misses[t, m])
                if page_faults:
                    dur = nm * costs.fault_s
                    acc[0] += dur
                    stall[t] += dur
                    yield env.timeout(dur + (hits[t, m] + nm) * e + costs.shared_s[l_])
                    continue
                demand = env.process(_read(env, flash, batch[nm], acc)) if nm else None
                if m + 1 < M and pf_reads[t, m + 1]:
                    pf_event[m + 1] = env.process(_read(env, flash, batch[int(pf_reads[t, m + 1])], acc))
                if pf_hits[t, m] and m in pf_event and not pf_event[m].processed:
                    t0 = env.now
                    yield pf_event[m]
                    stall[t] += env.now - t0
                yield env.timeout((hits[t, m] + pf_hits[t, m]) * e + costs.shared_s[l_])
                if demand is not None and not demand.processed:
                    t0 = env.now
                    yield demand
                    stall[t] += env.now - t0
                yield env.timeout(nm * e)
            yield env.timeout(costs.head_s)
            end[t] = env.now
            io[t] = acc[0]

    env.process(decoder())
    env.run()
    return Timeline(start, end, io, stall)
