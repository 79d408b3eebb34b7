"""Energy per token of a simulated run: joules by component from the run's own traffic and times.

Inputs (all from the run, none tuned): per step, the flash busy time (`TokenRecord.io_s`: the
service time of the step's read batches), the bytes read from flash, the compute-busy time
(`compute_s + mem_mgmt_s`), the step's duration (`latency_s`); from the plan, the FLOPs (each
phase's `flop_s` x the FLOP rate it was priced at, so exactly the FLOPs the timing model counted)
and the DRAM bytes moved (`step_traffic`). The device's numbers come from its profile's `energy:`
section (devices/section_energy.py), each with a source.

Per decode step s (decode tokens: batch x decode steps), in joules:
    flash[s]   = (flash_read_active_w - flash_idle_w) * io_s[s]
    dram[s]    = dram_j_per_byte * (dram_bytes[s] + bytes_read[s])   # flash DMA writes into DRAM
    compute[s] = compute_j_per_flop * flops[s] + compute_busy_w * (compute_s[s] + mem_mgmt_s[s])
    static[s]  = (static_w + flash_idle_w) * latency_s[s]
joules_per_token = sum over decode steps of all four / decode tokens.

DRAM bytes of a step (`step_traffic`): every kept layer's attention weights, norms and KV cache
(ComputeModel.attention_bytes) and its predictor; each layer's FFN bytes as the compute model
streams them (ComputeModel.ffn_bytes: the computed rows, and with a gather its copy and the
transposed down rows); the lm_head and final norm; the cache's row moves (2 x bytes moved,
recovered from the memory-management time of the plan). KV-cache writes (one token's K and V per
layer) are left out: under 0.1% of the bytes of any bundled model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from devices.section_energy import EnergySpec
from sim.metric_names import ENERGY_MJ_PER_TOKEN, JOULES_PER_TOKEN
from sim.records import TokenRecord

COMPONENTS = ("flash", "dram", "compute", "static")


@dataclass(frozen=True)
class StepTraffic:
    """Per step [S]: FLOPs computed and DRAM bytes moved by the compute (flash DMA apart)."""

    flops: np.ndarray
    dram_bytes: np.ndarray


def step_traffic(planner: Any, plan: Any) -> StepTraffic:
    """FLOPs and DRAM bytes of every step of a planned run (`sim.step_plans.StepPlanner`, its PlanArrays)."""
    c = planner.compute
    s = c.spec
    L = plan.L
    rate = c.flops_per_s
    flops = (L * np.asarray(plan.attn.flop_s, np.float64) + plan.ffn_flop_s.sum(axis=1)
             + np.asarray(plan.head.flop_s, np.float64)) * rate
    n_mha = float(np.sum(planner.mha_kept))
    attn = np.asarray(planner.attn_bytes, np.float64) * n_mha
    computed = plan.computed
    gathers = False if planner.stack.residency.page_granular else planner.stack.residency.gathers_at(computed)
    ffn = np.asarray(c.ffn_bytes(computed, gathers), np.float64).sum(axis=1)
    head_bytes = s.lm_head_bytes if not s.tied_embeddings else s.embedding_bytes
    head = head_bytes + s.final_norm_bytes + planner.steps.n_tokens.astype(np.float64) * s.d_model * s.dtype_bytes
    return StepTraffic(flops=flops, dram_bytes=attn + ffn + head + _moved_bytes(c, plan))


def _moved_bytes(c: Any, plan: Any) -> np.ndarray:
    """DRAM bytes of the cache's row moves per step: the plan prices m moved rows at
    m x 2 x bundle bytes / gather rate seconds; each move reads and writes the bundle."""
    per_row_bytes = 2.0 * c.spec.ffn_neuron_bytes
    per_row_s = per_row_bytes / c.gather_bytes_per_s
    if per_row_s <= 0:
        return np.zeros(plan.S)
    return plan.mgmt_mem_s.sum(axis=1) / per_row_s * per_row_bytes


def energy_summary(tokens: Sequence[TokenRecord], traffic: StepTraffic | None, spec: EnergySpec | None,
                   batch: int) -> dict[str, Any]:
    """The summary's energy keys for the decode steps of a run: `joules_per_token`,
    `energy_mj_per_token` {flash, dram, compute, static}, `energy_inputs_per_token` (what the joules
    were computed from) and `energy_source_kinds` ({number: kind}). All None without an energy
    section in the profile or without the plan's traffic."""
    if spec is None or traffic is None:
        return empty_energy()
    dec = [r for r in tokens if r.phase == "decode"]
    n = len(dec) * batch
    if n == 0:
        return empty_energy()
    idx = np.array([r.token for r in dec], np.int64)
    io_s = np.array([r.io_s for r in dec])
    busy_s = np.array([r.compute_s + r.mem_mgmt_s for r in dec])
    lat_s = np.array([r.latency_s for r in dec])
    flash_bytes = np.array([r.bytes_read for r in dec], np.float64)
    flops = traffic.flops[idx]
    dram_bytes = traffic.dram_bytes[idx] + flash_bytes
    v = spec.value
    joules = {
        "flash": (v("flash_read_active_w") - v("flash_idle_w")) * io_s.sum(),
        "dram": v("dram_j_per_byte") * dram_bytes.sum(),
        "compute": v("compute_j_per_flop") * flops.sum() + v("compute_busy_w") * busy_s.sum(),
        "static": (v("static_w") + v("flash_idle_w")) * lat_s.sum(),
    }
    return {
        JOULES_PER_TOKEN: float(sum(joules.values()) / n),
        ENERGY_MJ_PER_TOKEN: {k: float(1e3 * joules[k] / n) for k in COMPONENTS},
        "energy_inputs_per_token": {
            "flash_busy_s": float(io_s.sum() / n), "flash_bytes": float(flash_bytes.sum() / n),
            "dram_bytes": float(dram_bytes.sum() / n), "flops": float(flops.sum() / n),
            "compute_busy_s": float(busy_s.sum() / n), "token_s": float(lat_s.sum() / n)},
        "energy_source_kinds": spec.kinds(),
    }


def empty_energy() -> dict[str, Any]:
    """The energy keys of a run whose device has no energy numbers."""
    return {JOULES_PER_TOKEN: None, ENERGY_MJ_PER_TOKEN: None, "energy_inputs_per_token": None,
            "energy_source_kinds": None}
