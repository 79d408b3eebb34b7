"""The cost of one MoE decode token on a device, layer by layer, and the analytic fast path.

Compute is memory-bound at batch 1: every weight byte a layer uses is streamed from DRAM at the
device's bandwidth x its GEMV efficiency for the dtype (devices/achievable.py folds in the
achievable numbers), plus a per-operation overhead. A routed expert is priced from the profile's
measured dense GEMV table of its dtype where it has one (`compute.dense_gemv`, the table the dense
simulator prices its projections with: one token, weights streamed from DRAM, dispatch and per-row
work included): gate and up are [d_expert_ff x d_model] GEMVs, down a [d_model x d_expert_ff] one,
plus the SiLU, the product and the weighted add as per-operation overheads. At batch 1 a GEMV
reaches a fraction of the copy bandwidth that depends on its shape (on this project's host a
1024 x 1024 fp32 GEMV takes ~0.3 ms against the 0.14 ms of its 4 MiB at the copy rate), which the
single stream rate cannot show. Per layer: the attention (its weights and the
KV cache of the context), and either a dense FFN or, in an MoE layer, the router, the host's
read-back of the router's choice (`moe.router_sync_s`: the GPU pipeline drains once per MoE layer,
sourced per device), the shared experts, and each routed expert used (hits and misses alike).

Flash: once the router's choice is known, the missed experts are read together, each one
contiguous unit; the block layer splits a large read into `SPLIT_BYTES` requests, so a batch of n
experts of b bytes is n * ceil(b / SPLIT_BYTES) requests kept in flight up to the engine's limit,
served at the device's read curve for that request size and depth. An engine that reads each
expert with one call per thread (`ReadEngine`: the real backend's executor, one `os.preadv` of the
whole expert on each of its reader threads) is priced as it issues them: n reads of the expert's
bytes with at most `threads` outstanding. The page-cache baseline instead
faults: each miss is b / page_fault_bytes synchronous faults of read-around size at depth 1, taken
by the compute thread itself (no overlap). On a discrete accelerator whose profile sets
`moe.host_copy_bytes_per_s` the read lands in host memory first and each expert is then copied over
the host link (the second hop, after the batch's SSD reads: a bounce buffer is filled before it is
copied), so a batch of n experts also takes n * b / host_copy_bytes_per_s (the link's datasheet rate
at the peak bound). A speculative prefetch for the next MoE layer is issued right after the demand
batch, behind it on the same flash queue.

Timeline (two resources, each serving in order): flash (read batches, FIFO) and compute. In an MoE
layer the compute runs the cached and prefetched experts while the demand batch is read, then the
missed ones. `fast_path` is this recurrence written out; sim/moe/des.py is the same model as SimPy
events, and the two agree (a test).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from devices.curves import read_time_s
from devices.moe_spec import MOE_DTYPE_BITS, MoESpec
from devices.schema import DeviceProfile

SPLIT_BYTES = 1 << 20          # largest request the block layer sends for one big read (max_sectors_kb class)
OPS_ATTENTION = 4              # q/k/v/o projections (a fused qkv still launches the score and output kernels)
OPS_EXPERT = 3                 # gate, up, down
OPS_EXPERT_ELEMENTWISE = 3     # silu(gate), its product with up, the weighted add into the output


@dataclass(frozen=True)
class ReadEngine:
    """How an engine issues expert reads: one read of the whole expert per call, `threads` calls
    outstanding at once (the real backend's executor: one BundleReader per thread)."""

    threads: int


@dataclass(frozen=True)
class LayerCosts:
    """Per-token costs by model layer, in seconds, and the read-batch price function's inputs."""

    pre_s: np.ndarray          # [L] attention (+ dense FFN in non-MoE layers), before the router
    router_s: np.ndarray       # [L] router GEMV + the read-back of its choice (0 in dense layers)
    shared_s: np.ndarray       # [L] shared experts (0 where none)
    expert_s: float            # one routed expert's compute
    head_s: float              # final norm + lm_head per token
    moe_index: np.ndarray      # [L] MoE layer m of each model layer, -1 for dense layers
    read_batch_s: np.ndarray   # [K + P + 1]: seconds to read n experts in one batch (n = index)
    fault_s: float             # page-cache baseline: seconds of faults per missed expert
    expert_bytes: int
    stream_bytes_per_token: float   # DRAM bytes the compute streams per token (expert bytes excluded)
    stream_bytes_per_s: float
    router_gemv_s: float = 0.0     # one MoE layer's router GEMV + launch (router_s less the read-back)


def _stream_rate(profile: DeviceProfile, dtype: str) -> float:
    eff = profile.compute.gemv_efficiency_for(dtype if dtype != "mxfp4" else "int4")
    return profile.memory.bandwidth_bytes_per_s * eff


def host_copy_rate(profile: DeviceProfile) -> float | None:
    """Bytes/s of the host-to-accelerator copy each read expert takes (None: reads land where the compute
    reads them): the achievable rate, or the link's datasheet rate on a profile folded to its peaks."""
    m = profile.moe
    if m is None or m.host_copy_bytes_per_s is None:
        return None
    return m.host_copy_link_bytes_per_s if profile.bound == "peak" else m.host_copy_bytes_per_s


def expert_compute_s(spec: MoESpec, profile: DeviceProfile, dtype: str) -> float:
    """One routed expert's compute for one token (module docstring): the measured dense GEMV table of
    `dtype` where the profile has one, else its bytes at the stream rate; each with the overheads."""
    ovh = profile.compute.op_overhead_s
    dg = profile.compute.dense_gemv
    table = dg.tables.get(dtype) if dg is not None else None
    if table is None:
        return spec.expert_bytes(dtype) / _stream_rate(profile, dtype) + ovh * OPS_EXPERT
    kt = table.table()
    d, F = spec.d_model, spec.d_expert_ff

    def gemv_s(out_features: int, in_features: int) -> float:
        return float(kt.seconds_at(in_features, np.array([out_features], np.float64))[0])

    return 2 * gemv_s(F, d) + gemv_s(d, F) + ovh * OPS_EXPERT_ELEMENTWISE


def layer_costs(spec: MoESpec, profile: DeviceProfile, dtype: str, context_tokens: int,
                max_batch: int, router_sync: bool = True, engine: ReadEngine | None = None) -> LayerCosts:
    """Costs of `spec` at weight `dtype` on a profile already folded to its bound. `router_sync`: the
    engine must learn the router's choice to issue reads (False when every expert is cached, or when
    the page cache serves the misses inside the compute: then the decode never waits on the host).
    `engine`: how the reads are issued (None: the block layer's split requests at the profile's depth)."""
    bits = MOE_DTYPE_BITS[dtype]
    rate = _stream_rate(profile, dtype)
    ovh = profile.compute.op_overhead_s
    L = spec.n_layers
    moe_index = np.full(L, -1, np.int64)
    moe_index[list(spec.moe_layers)] = np.arange(spec.n_moe_layers)
    kv_per_layer = np.array([spec._kv_elems_per_layer(k) * 2 for k in spec.layer_kinds], float)
    ctx = np.array([min(context_tokens, spec.sliding_window) if k == "sliding" and spec.sliding_window
                    else (context_tokens if k in ("full", "mla", "sliding") else 0) for k in spec.layer_kinds])
    attn_bytes = np.array([spec.attn_params(k) + 2 * spec.d_model for k in spec.layer_kinds], float) * bits / 8
    attn_bytes += kv_per_layer * ctx
    dense_bytes = np.where(moe_index < 0, spec.dense_ffn_params * bits / 8, 0.0)
    pre = (attn_bytes + dense_bytes) / rate + ovh * (OPS_ATTENTION + np.where(moe_index < 0, OPS_EXPERT, 0))
    sync = profile.moe.router_sync_s if profile.moe is not None and router_sync else 0.0
    router = np.where(moe_index >= 0, spec.router_params * bits / 8 / rate + ovh + sync, 0.0)
    shared = np.where(moe_index >= 0, spec.shared_params_per_layer * bits / 8 / rate
                      + ovh * OPS_EXPERT * spec.n_shared_experts, 0.0)
    eb = spec.expert_bytes(dtype)
    head_bytes = (spec.vocab_size * spec.d_model + spec.d_model) * bits / 8
    head = head_bytes / rate + ovh
    curve = profile.flash.curve
    qd = (profile.moe.expert_reads_in_flight if profile.moe is not None and profile.moe.expert_reads_in_flight
          else profile.flash.max_in_flight)
    per = math.ceil(eb / SPLIT_BYTES)
    chunk = eb / per
    hop_s = eb / copy if (copy := host_copy_rate(profile)) else 0.0       # second hop per expert (0: none)
    if engine is None:
        batch = np.array([read_time_s(curve, chunk, n * per, qd) + n * hop_s for n in range(max_batch + 1)])
    else:
        batch = np.array([read_time_s(curve, eb, n, engine.threads) + n * hop_s for n in range(max_batch + 1)])
    fb = profile.moe.page_fault_bytes if profile.moe is not None else 131072
    fault = math.ceil(eb / fb) * read_time_s(curve, fb, 1, 1) + hop_s
    stream = float(attn_bytes.sum() + dense_bytes.sum() + head_bytes
                   + spec.n_moe_layers * (spec.router_params + spec.shared_params_per_layer) * bits / 8)
    return LayerCosts(pre, router, shared, expert_compute_s(spec, profile, dtype), head, moe_index, batch, fault, eb,
                      stream, rate, spec.router_params * bits / 8 / rate + ovh)


@dataclass(frozen=True)
class Timeline:
    """Per token: start, end, flash busy seconds, and the compute's wait for reads."""

    start_s: np.ndarray
    end_s: np.ndarray
    io_s: np.ndarray
    stall_s: np.ndarray

    @property
    def latency_s(self) -> np.ndarray:
        return self.end_s - self.start_s


def fast_path(costs: LayerCosts, hits: np.ndarray, pf_hits: np.ndarray, misses: np.ndarray,
              pf_reads: np.ndarray, page_faults: bool) -> Timeline:
    """The timeline recurrence (module docstring) over [T, M] counts; no events."""
    T = hits.shape[0]
    start, end, io, stall = (np.zeros(T) for _ in range(4))
    c = f = 0.0
    M = hits.shape[1]
    batch, e = costs.read_batch_s, costs.expert_s
    for t in range(T):
        start[t] = c
        pf_done = np.zeros(M + 1)
        for l_, m in enumerate(costs.moe_index):
            c += costs.pre_s[l_]
            if m < 0:
                continue
            c += costs.router_s[l_]
            nm = int(misses[t, m])
            if page_faults:
                dur = nm * costs.fault_s
                io[t] += dur
                stall[t] += dur
                c += dur + (hits[t, m] + nm) * e + costs.shared_s[l_]
                f = c
                continue
            demand_done = c
            if nm:
                f = max(c, f) + batch[nm]
                io[t] += batch[nm]
                demand_done = f
            if m + 1 < M and pf_reads[t, m + 1]:
                f = max(c, f) + batch[int(pf_reads[t, m + 1])]
                io[t] += batch[int(pf_reads[t, m + 1])]
                pf_done[m + 1] = f
            if pf_hits[t, m] and pf_done[m] > c:
                stall[t] += pf_done[m] - c
                c = pf_done[m]
            c += (hits[t, m] + pf_hits[t, m]) * e + costs.shared_s[l_]
            if demand_done > c:
                stall[t] += demand_done - c
                c = demand_done
            c += nm * e
        c += costs.head_s
        end[t] = c
    return Timeline(start, end, io, stall)
