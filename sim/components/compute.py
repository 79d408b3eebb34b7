"""Compute: the time of each compute phase, and its slowdown by flash DMA on unified memory.

A phase (attention, predictor, FFN, memory management, lm_head) costs

    t = gather_bytes / gather_bytes_per_s + max(FLOPs / flops_per_s, bytes / dram_bytes_per_s)
        + kernels * op_overhead_s

(device numbers from the profile; FLOP rate for the weights' dtype). Decode at batch 1 is
memory-bound, so the max() is nearly always the bytes term: the weights (and KV cache) the phase
touches, streamed from DRAM once. A sparse FFN first gathers the computed neurons' rows into a
dense buffer (environment.md measured this copy as two thirds of a sparse FFN on the CPU host).

Kernel counts come from the runtime (devices/runtime.py, `compute.runtime`): per layer, the
attention's kernels, the FFN's besides one GEMV per matrix (+ 1 gather when sparse), the predictor's,
the lm_head's per token and one batched row copy when cache rows move. Each pays one op cost: the
device's launch cost (`op_overhead_s`), or the runtime's host dispatch per op where that is slower
(an eager framework issuing ops one by one).

**The sparse FFN's measured kernels** (profiles with `compute.sparse_ffn`). A single rate per
kernel, measured at one size and dtype, does not carry to other widths and dtypes: GEMVs over the
gathered rows' strided views and the transposed down copy change speed with their size and dtype.
`flashsim bench compute` measures the backend's own kernels per dtype over a grid of widths and
computed neurons (devices/kernel_table.py interpolates); where the run's dtype has a table, a sparse
FFN costs its gather (scaled by the run's row bytes) + transposed copy as the gather term and
(matrices - 1) gate/up GEMVs + the down GEMV as the memory term (DMA contention still slows the
weights' streaming), with op_overhead_s only for the norm, activation and residual (the measured
calls include their own dispatch and per-row work).

**Dense GEMVs measured per shape** (profiles with `compute.dense_gemv`). A CPU that converts fp16 /
bf16 as it goes runs a GEMV at a speed that follows its shape, not one rate. `flashsim bench compute`
times F.linear per dtype over in_features x out_features with the weights streamed from DRAM; where
the run's dtype has a table, the attention's four projections, the lm_head and a dense FFN's
matrices cost the table's calls in the memory term (their dispatch and per-row work included, so no
gemv_row_s and no op_overhead_s for them), the rest of the phase's bytes at the DRAM rate.

**Unified-memory contention.** Flash DMA writes the bytes it reads into the same DRAM the compute
units stream weights from, so while a transfer runs at r bytes/s it takes r of the DRAM bandwidth
B and a memory-bound phase progresses at (B - r) / B of its full speed. `stretch` integrates that
over the scheduled transfers overlapping the phase. (The FLOP-bound part is not slowed; flash is
never slowed by compute: an SSD's 2-7 GB/s is far below any DRAM bandwidth, so the SSD, not DRAM,
limits the transfer.) Discrete-GPU hosts (unified: false) have no contention: reads land in host
RAM and cross PCIe.

**Host CPU shared by compute and I/O** (`HostCpu`, profiles with `flash.host_cpu_s_per_read` > 0).
On a CPU-only host the reads are submitted and completed by threads on the same cores (and, in
Python, under the same interpreter lock) as the compute. Two effects, each measured by `flashsim
bench flash` on the host it describes:
  * a read batch that runs while the compute runs needs CPU per read that the compute holds: its
    service time grows by n_reads x `read_delay_s_per_read` (default `host_cpu_s_per_read`; reads
    alone are timed by the read table, which bench flash measured with the same threads, so their
    CPU time is already inside it: nothing is added to a batch the decoder only waits for);
  * the compute running during a batch loses `compute_lost_s_per_read` per read (the CPU time of
    the read plus the thread/lock hand-offs it forces on the compute thread), plus
    `compute_lost_s_per_batch` per batch (waking and collecting the reader threads): over the
    batch's interval it progresses at 1 - (n_reads x lost + lost_batch) / duration of the full speed
    (floored at MIN_CPU_SHARE), integrated by the same `stretch` as the DMA contention. The
    batch's own delay likewise is n_reads x `read_delay_s_per_read` + `read_delay_s_per_batch`.

**A Python decoder loop** (compute.decoder=python, the real backend's). The loop takes the
interpreter lock back after every torch call, and each time a reader thread that woke meanwhile
may hold it: what a batch costs the loop follows how often it re-takes the lock, its seconds per
torch call. bench flash measures the four terms with three probes of very different rhythm (a
tiny transformers llama, a few us per call: the framework_* terms; a 1024-wide GEMV, tens of us:
the plain terms; a 4096-wide GEMV, about 1 ms: long_kernel_*) and counts each probe's calls. A
phase's seconds per call are its compute without contention over the loop's calls in that phase
(LOOP_ATTENTION_OPS in the attention, LOOP_FFN_OPS in the FFN step with the memory management);
`HostCpu.at` takes the terms linear in log(seconds per call) between the two probes around it, the
nearest probe's outside them. Per phase, not per layer: a batch costs the loop what the code it
overlaps loses, and a delta prefetch, issued at a layer's end, runs mostly during the next layer's
attention. A batch's own delay (`delay_s`) takes the layer's seconds per call: it spans both
phases. A profile without the three probes charges a Python loop the framework terms everywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from devices.kernel_table import KernelTable, table_row_bytes
from devices.model_spec import ModelSpec
from devices.runtime import DEFAULT_RUNTIME, Runtime, load_runtime
from devices.schema import SPARSE_FFN_KERNELS, DeviceProfile

# Torch calls per layer of the real backend's Python decoder loop (compute.decoder=python), counted
# with a TorchFunctionMode (tests/real/test_loop_ops.py counts them again): the FFN step
# (real/runtime/backend.py `RealExecutor.ffn`) 22; the attention, norms and residuals around it 22 in shape
# mode's stand-in (compute.framework=kernels) and 69 in a transformers llama layer with model mode's
# FFN module (hf: 68.6 on average, counted with transformers 5.24; a few calls run on some steps only).
# `HostCpu.at` places the loop by its seconds per call.
LOOP_FFN_OPS = 22
LOOP_ATTENTION_OPS = {"kernels": 22, "hf": 69}
# A DMA stream can never take the whole DRAM bandwidth from compute: floor the remaining share.
MIN_BANDWIDTH_SHARE = 0.05
# Reads in flight never starve the compute completely: the OS scheduler gives every runnable thread
# a time slice, so the compute keeps at least a small share of the CPU.
MIN_CPU_SHARE = 0.05


@dataclass(frozen=True)
class HostCpu:
    """CPU cost of reads on a host whose CPU also computes (seconds per read).

    A compiled loop takes the kernel constants; a Python loop without the profile's probes takes
    the framework ones (`of`); with the probes a Python loop's terms follow its seconds per torch
    call (`at`)."""

    cpu_s_per_read: float      # the reads' own CPU work (submission, completion, thread hand-off)
    lost_s_per_read: float     # compute time lost per read running concurrently
    delay_s_per_read: float    # extra service time per read of a batch that runs while the compute runs
    lost_s_per_batch: float = 0.0    # compute lost per batch (waking and collecting the reader threads)
    delay_s_per_batch: float = 0.0   # extra service time per batch while the compute runs
    # (seconds per torch call, lost per read, lost per batch, delay per read, delay per batch) of the
    # profile's three probes, by increasing seconds per call: a Python decoder loop's terms (`at`)
    probes: tuple[tuple[float, float, float, float, float], ...] = ()

    @classmethod
    def of(cls, profile: DeviceProfile, python_loop: bool = False) -> HostCpu | None:
        """The profile's host CPU model, or None when its reads cost the compute nothing.

        `python_loop` (run config `compute.decoder=python`): a Python layer loop drives the kernels.
        With the profile's three probes (`FlashSpec.probe_points`) its terms follow its seconds per
        torch call (`at`); without them the framework constants stand in for the kernel ones (where
        the profile has them), as for framework code."""
        f = profile.flash
        if not f.shares_host_cpu:
            return None
        probes = tuple(f.probe_points() or ()) if python_loop else ()
        k = f.host_cpu_terms("framework" if python_loop and not probes else "kernel")
        return cls(f.host_cpu_s_per_read, k[0], k[2], k[1], k[3], probes)

    def at(self, op_s: float) -> tuple[float, float, float, float]:
        """(lost per read, lost per batch, delay per read, delay per batch) of a Python loop that
        spends `op_s` seconds per torch call: linear in log(op_s) between the two probes around it,
        the nearest probe's outside them (module doc, "A Python decoder loop")."""
        i, j, w = self._between(op_s)
        lo, hi = self.probes[i][1:], self.probes[j][1:]
        return tuple(a + w * (b - a) for a, b in zip(lo, hi))  # type: ignore[return-value]

    def _between(self, op_s: float) -> tuple[int, int, float]:
        """(i, j, w): a loop at `op_s` seconds per torch call takes (1 - w) x probe i + w x probe j."""
        pts = self.probes
        if op_s <= pts[0][0]:
            return 0, 0, 0.0
        for j in range(1, len(pts)):
            if op_s < pts[j][0]:
                return j - 1, j, math.log(op_s / pts[j - 1][0]) / math.log(pts[j][0] / pts[j - 1][0])
        return len(pts) - 1, len(pts) - 1, 0.0

    def cost(self, nreads: float, op_s: float = 0.0) -> tuple[float, float]:
        """(compute lost, read delay) in seconds of one batch of `nreads` reads that runs while the
        compute runs: n x per read + per batch. `op_s`: a Python loop's seconds per torch call
        (with the probes it places the loop between them, `at`)."""
        if nreads <= 0:
            return 0.0, 0.0
        if op_s > 0 and self.probes:
            i, j, w = self._between(op_s)
            lost, delay = _batch_cost(self.probes[i], nreads)
            if w > 0:
                l1, d1 = _batch_cost(self.probes[j], nreads)
                lost, delay = lost + w * (l1 - lost), delay + w * (d1 - delay)
            return lost, delay
        return (nreads * self.lost_s_per_read + self.lost_s_per_batch,
                nreads * self.delay_s_per_read + self.delay_s_per_batch)

    def cpu_share(self, nreads: float, service_s: float, op_s: float = 0.0) -> float:
        """The share of full speed the compute keeps while a batch of `nreads` runs for service_s
        (seconds per torch call as in `cost`)."""
        if service_s <= 0:
            return 1.0
        k = self.cost(nreads, op_s)[0]
        share = 1.0 - k / service_s
        return share if share > MIN_CPU_SHARE else MIN_CPU_SHARE

    def delay_s(self, nreads: float, op_s: float = 0.0) -> float:
        """How much longer a batch of `nreads` takes while the compute runs (as in `cost`)."""
        return self.cost(nreads, op_s)[1]


def _batch_cost(probe: tuple[float, float, float, float, float], n: float) -> tuple[float, float]:
    """(compute lost, read delay) of a batch of n reads under one probe's terms (`HostCpu.probes`)."""
    _, lost_r, lost_b, delay_r, delay_b = probe
    return n * lost_r + lost_b, n * delay_r + delay_b


@dataclass(frozen=True)
class Phase:
    """Costs of a compute phase in seconds at full DRAM bandwidth (arrays or floats)."""

    flop_s: np.ndarray
    mem_s: np.ndarray
    gather_s: np.ndarray
    ovh_s: np.ndarray

    def total_s(self) -> np.ndarray:
        """Duration without contention."""
        return self.gather_s + np.maximum(self.flop_s, self.mem_s) + self.ovh_s


class DenseGemvs:
    """A model's dense GEMVs priced from a measured table (profile compute.dense_gemv, one token,
    weights streamed from DRAM, dispatch and per-row work included): the attention's four
    projections and the lm_head per call; a dense FFN's input-side [c, d_model] and down
    [d_model, c] GEMVs as functions of its c rows."""

    def __init__(self, spec: ModelSpec, table: KernelTable):
        d, q, kv = spec.d_model, spec.q_dim, spec.kv_dim

        def gemv_s(out_features: int, in_features: int) -> float:
            return float(table.seconds_at(in_features, np.array([out_features], np.float64))[0])

        self.attention_s = gemv_s(q, d) + 2 * gemv_s(kv, d) + gemv_s(d, q)
        self.attention_weight_bytes = (2 * q * d + 2 * kv * d) * spec.weight_bits / 8   # the rest: biases
        self.head_s = gemv_s(spec.vocab_size, d)
        self.input_s = table.curve(d)                   # [c, d]: c output rows of width d_model
        self.down_s = table.transposed().curve(d)       # [d, c]: d_model output rows of width c


class ComputeModel:
    """Phase costs for one model (as stored) on one device."""

    def __init__(self, spec: ModelSpec, profile: DeviceProfile, row_bytes: int | None = None,
                 framework: str = "hf", decoder: str = "python", runtime: Runtime | None = None):
        self.spec, self.profile = spec, profile
        self.runtime = runtime if runtime is not None else load_runtime(DEFAULT_RUNTIME)
        self.kernels = self.runtime.kernels
        self.python_loop = decoder == "python"   # compute.decoder: how reads contend with it (HostCpu.of)
        # torch calls per layer of that loop (0: a compiled loop), which place it among the probes
        self.loop_attention_ops = LOOP_ATTENTION_OPS[framework] if self.python_loop else 0
        self.loop_ops_per_layer = LOOP_FFN_OPS + self.loop_attention_ops if self.python_loop else 0
        self.flops_per_s = profile.compute.flops_per_s(spec.dtype)
        # weights stream at the DRAM bandwidth x the dense GEMV's efficiency for the dtype on a profile
        # folded to its achievable numbers (devices/achievable.py); the peak and a raw profile: 1.0
        eff = profile.compute.gemv_efficiency_for(spec.dtype) if profile.bound == "achievable" else 1.0
        self.dram_bytes_per_s = profile.memory.bandwidth_bytes_per_s * eff
        self.gather_bytes_per_s = profile.compute.gather_bytes_per_s
        self.op_s = self.runtime.op_s(profile.compute.op_overhead_s)
        self.row_s = profile.compute.gemv_row_s
        self.transpose_bytes_per_s = profile.compute.transpose_bytes_per_s
        self.kv_bytes_per_layer_token = spec.kv_bytes_per_token / spec.n_layers
        # a cached neuron's DRAM row (the layout's dram_bytes_per_neuron: padded on a padded store),
        # what the gather and the cache's row moves copy
        self.row_bytes = int(row_bytes) if row_bytes else spec.ffn_neuron_bytes
        # the sparse FFN's kernels measured at this model's width and dtype (None: the single rates)
        sf = profile.compute.sparse_ffn
        table = sf.tables.get(spec.dtype) if sf is not None else None
        self.sparse_kernels = None if table is None else {
            k: table.kernel(k).curve(spec.d_model) for k in SPARSE_FFN_KERNELS}
        # a gather copies bytes: this model's cache rows take their share of the table's rows' time
        self.gather_row_scale = self.row_bytes / table_row_bytes(spec.d_model, spec.dtype_bytes)
        # dense GEMVs measured at this dtype over both matrix sizes (None: the single rates); the
        # bias bytes of the projections are streamed at the DRAM rate beside them
        dg = profile.compute.dense_gemv
        dense = dg.tables.get(spec.dtype) if dg is not None else None
        self.dense_gemv = None if dense is None else DenseGemvs(spec, dense.table())

    def attention(self, n_tokens: np.ndarray, ctx_sum: np.ndarray, kv_tokens: np.ndarray, decode: np.ndarray,
                  predictor_flops_per_token: float = 0.0, predictor_bytes: int = 0) -> Phase:
        """One layer's attention (plus the FFN predictor) for each step: arrays [S]."""
        s = self.spec
        n = np.asarray(n_tokens, np.float64)
        flops = n * 2.0 * s.attn_params_per_layer + 4.0 * s.q_dim * np.asarray(ctx_sum, np.float64)
        flops = flops + n * predictor_flops_per_token
        nbytes = self.attention_bytes(ctx_sum, kv_tokens, decode) + predictor_bytes
        k = self.kernels
        kernels = k.attention + (k.predictor if predictor_flops_per_token > 0 else 0)
        z = np.zeros_like(n)
        g = self.dense_gemv
        if g is not None:   # the four projections from the table (their dispatch and rows included)
            mem = g.attention_s + (nbytes - g.attention_weight_bytes) / self.dram_bytes_per_s
            return Phase(flops / self.flops_per_s, mem, z,
                         z + (kernels - k.attention_gemvs) * self.op_s)
        rows = s.q_dim + 2 * s.kv_dim + s.d_model   # output rows of the q, k, v and o projections
        return Phase(flops / self.flops_per_s, nbytes / self.dram_bytes_per_s, z,
                     z + kernels * self.op_s + rows * self.row_s)

    def attention_bytes(self, ctx_sum: np.ndarray, kv_tokens: np.ndarray, decode: np.ndarray) -> np.ndarray:
        """Bytes one layer's attention streams for each step: its weights, norms and KV cache."""
        s = self.spec
        kv_entries = np.where(decode, ctx_sum, kv_tokens).astype(np.float64)
        return s.attn_bytes_per_layer + s.norm_bytes_per_layer + kv_entries * self.kv_bytes_per_layer_token

    def _sparse(self, c: np.ndarray, gathers: bool | np.ndarray) -> np.ndarray:
        """Where an FFN of c computed neurons gathers them out of the cache matrix (the caller's
        `gathers`, Residency.gathers_at: every neuron computed included where the cache's rows sit
        in arrival order, as real.runtime.backend gathers whatever the step computes)."""
        return (c > 0) & gathers

    def ffn_bytes(self, n_computed: np.ndarray, gathers: bool | np.ndarray = True) -> np.ndarray:
        """Distinct DRAM bytes an FFN of n_computed neurons moves (sim/energy.py's traffic): a sparse
        FFN its cache rows, the gathered copy and the transposed down copy; a dense one its weights."""
        s = self.spec
        c = np.asarray(n_computed, np.float64)
        gathered = 2.0 * c * self.row_bytes + c * s.d_model * s.dtype_bytes
        sparse = (c > 0) & gathers
        return np.where(sparse, gathered, c * s.ffn_neuron_bytes)

    def ffn(self, n_tokens: np.ndarray, n_computed: np.ndarray, gathers: bool | np.ndarray = True) -> Phase:
        """FFN of each (step, layer): n_tokens [S, 1] or [S], n_computed [S, L]. `gathers` (a bool
        or one per entry of n_computed): the computed rows are gathered out of the cache matrix
        (Residency.gathers_at); False prices contiguous matrices (the dense GEMV table)."""
        s = self.spec
        c = np.asarray(n_computed, np.float64)
        n = np.asarray(n_tokens, np.float64)
        if n.ndim == 1 and c.ndim == 2:
            n = n[:, None]
        flops = 2.0 * n * c * s.ffn_matrices * s.d_model
        nbytes = c * s.ffn_neuron_bytes
        sparse = self._sparse(c, gathers)
        # the gather copies whole cache rows; the down rows are then transposed into a [d_model, c] matrix
        gather = c * self.row_bytes / self.gather_bytes_per_s
        if self.transpose_bytes_per_s:
            gather = gather + c * s.d_model * s.dtype_bytes / self.transpose_bytes_per_s
        gather = np.where(sparse, gather, 0.0)
        kernels = np.where(c > 0, self.kernels.ffn_base + s.ffn_matrices + sparse, 0)
        # output rows: c per input-side matrix (gate, up), d_model for the down projection
        rows = np.where(c > 0, c * (s.ffn_matrices - 1) + s.d_model, 0.0)
        ph = Phase(flops / self.flops_per_s, nbytes / self.dram_bytes_per_s, gather,
                   kernels * self.op_s + rows * self.row_s)
        g = self.dense_gemv
        if g is not None and np.any(dense := (c > 0) & ~sparse):   # contiguous [c, d] and [d, c]: the table
            mem = (s.ffn_matrices - 1) * g.input_s(c) + g.down_s(c)
            ph = Phase(ph.flop_s, np.where(dense, mem, ph.mem_s), ph.gather_s,
                       np.where(dense, self.kernels.ffn_base * self.op_s, ph.ovh_s))
        if self.sparse_kernels is not None and np.any(sparse):
            ph = self._measured_sparse(ph, c, sparse)
        return ph

    def _measured_sparse(self, ph: Phase, c: np.ndarray, sparse: np.ndarray) -> Phase:
        """`ph` with its sparse entries priced from the profile's measured kernels at (d_model, c)
        (compute.sparse_ffn); the other entries keep `ph`'s prices. The GEMVs stream weights (the
        memory term, slowed by DMA contention); the gather and the transposed copy are the gather
        term. The table's times include the kernels' dispatch and per-row work, so only the norm,
        activation and residual pay op_overhead_s."""
        s, k = self.spec, self.sparse_kernels
        assert k is not None
        gemv = (s.ffn_matrices - 1) * k["input_gemv_s"](c) + k["down_gemv_s"](c)
        copy = k["gather_s"](c) * self.gather_row_scale + k["transpose_s"](c)
        return Phase(ph.flop_s, np.where(sparse, gemv, ph.mem_s), np.where(sparse, copy, ph.gather_s),
                     np.where(sparse, self.kernels.ffn_base * self.op_s, ph.ovh_s))

    def memory_management(self, moved_neurons: np.ndarray) -> Phase:
        """Move rows inside the cache matrix: a gather of the moved rows and a scatter into the holes,
        rows x 2 x bundle bytes / gather_bytes_per_s (scattered rows, not a streaming copy, so not
        the DRAM copy bandwidth). A move copies the neuron's bundle (`ffn_neuron_bytes`), not its padded
        DRAM row: real.runtime.cache_matrices's deletion copies each row's data part (`LayerCache._data`), 6912 of
        8192 B in SmolLM2 fp32, where the gather copies whole padded rows (`row_bytes`)."""
        m = np.asarray(moved_neurons, np.float64)
        z = np.zeros_like(m)
        return Phase(z, m * (2.0 * self.spec.ffn_neuron_bytes / self.gather_bytes_per_s), z,
                     np.where(m > 0, self.kernels.mgmt * self.op_s, 0.0))

    def head(self, n_sequences: int, n_tokens: np.ndarray) -> Phase:
        """Final norm + lm_head for one logits row per sequence, plus the embedding lookup."""
        s = self.spec
        n = np.asarray(n_tokens, np.float64)
        head_bytes = s.lm_head_bytes if not s.tied_embeddings else s.embedding_bytes
        flops = np.full_like(n, 2.0 * n_sequences * s.vocab_size * s.d_model)
        nbytes = head_bytes + s.final_norm_bytes + n * s.d_model * s.dtype_bytes
        z = np.zeros_like(n)
        g = self.dense_gemv
        if g is not None:   # the lm_head GEMV [vocab, d_model] from the table (tied: the embedding's),
            mem = g.head_s + (nbytes - head_bytes) / self.dram_bytes_per_s   # one of the head's kernels
            return Phase(flops / self.flops_per_s, mem, z, z + (self.kernels.head - 1) * self.op_s)
        return Phase(flops / self.flops_per_s, nbytes / self.dram_bytes_per_s, z,
                     z + self.kernels.head * self.op_s + s.vocab_size * self.row_s)


def stretch(t0_s: float, work_s: float, segments, ) -> float:  # type: ignore[no-untyped-def]
    """Duration of `work_s` seconds of memory-bound work starting at t0 while flash DMA transfers
    run in `segments` [(start, end, DRAM share left to compute)] (sorted, non-overlapping: the
    FIFO device). Outside transfers the work runs at full speed."""
    if work_s <= 0:
        return 0.0
    t, left = t0_s, work_s
    for a, b, share in segments:
        if b <= t:
            continue
        if a > t:
            if left <= a - t:
                return t + left - t0_s
            left -= a - t
            t = a
        if left <= (b - t) * share:
            return t + left / share - t0_s
        left -= (b - t) * share
        t = b
    return t + left - t0_s
