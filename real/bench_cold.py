"""Compute after a read wait: how much longer a decoder layer takes when the decoder thread has just
waited for reads (seconds, as a function of how long it waited).

Without prefetch, the real backend waits for every layer's demand reads. While it waits, the
reader's threads run on the same cores (Python, syscalls, page-table walks), the decoder's core
idles, and on a shared VM other tenants run there too: they evict the decoder's code and data (the
Python interpreter's and PyTorch's dispatch paths, module objects, activation and scratch buffers)
from the CPU caches that a layer run back to back finds warm. The layer after the wait refills them.
Measured here:

* a transformers llama layer of negligible width (`bench_compute.tiny_llama`; what model mode runs
  under compute.framework=hf) took 133 us back to back and 283 / 326 / 367 / 545 us after batches of
  4 / 16 / 64 / 256 reads;
* real.backend's sparse FFN of 400 SmolLM2 rows took 384 us cycling through 30 layers' caches and
  490 us after a 128-read batch.
* The penalty follows the wait's length, not its reads (measured on an Intel Xeon VM): the
  same 768 reads cost the kernel probe 263 us after a 13.6 ms wait (32 in flight) and 486 us after
  a 40 ms one (2 in flight); 3,070 reads in a 54 ms wait cost 531 us. A plain sleep, no reads at
  all, cost 21-47 us up to 16 ms and 150-640 us at 25-40 ms. Unbundled SmolLM2 waits 13-26 ms per
  layer for 400-860 small reads, longer than any single batch of this bench's store, whose reads
  coalesce.

* The penalty is paid at the first touch of each piece of code and data the wait left alone, and
  it is not only a refill of caches (the same host): after a 32 / 64 ms spin
  of the decoder's own Python (no reads, no sleep, the core busy), a 5 us torch.add of one element
  took 584 / 1,849 us, a 576 x 576 GEMV over matrices that miss the L3 anyway 849 / 1,494 us
  against 115, and the call right after each ran at its usual time. So a layer pays for the code
  it runs, and the probe must run the decoder's code: model mode's layer is transformers' llama
  layer with real.backend's FFN step as its MLP (its NumPy cache work, the gather, the sparse
  kernels), not the tiny llama's own dense MLP. After 7.8 / 41.5 ms waits for SmolLM2-store
  batches, the tiny llama alone paid 0.88 / 3.8 ms and with the FFN step inside 1.2 / 8.6 ms.
  Against SmolLM2's own layers (tests/benchmarks/test_bench_wait_penalty.py, paired runs without
  the reads' I/O), that probe priced 0.84x the real cost at 18 and 37 ms waits, where the tiny
  llama alone priced 1.2-2x short. The kernel probe keeps its own small
  FFN: with the FFN step inside, it priced validate shape's layers 4-6x short at 2 ms waits
  (36 us against 156-209), where alone it had priced 124-166 us.

`cold_compute` times one layer of each kind (hf: a tiny llama decoder layer through forward hooks;
kernels: the shape-mode layer's kernels at small width: four projections, an RMS norm, the gather
of cache rows and the three FFN GEMVs; given `ffn_step`, bench flash's full bench, the tiny llama
runs real.backend's FFN step as its MLP, `real.bench_host_cpu.FfnStepProbe.layer`, its reads
planned but not transferred) back to back and right after a real.reader batch of n random
neurons of the bench store, for each n in COLD_BATCH_NEURONS, and right after COLD_LONG_REPEATS
batches of the largest back to back (longer waits); the penalty is the difference of the means
(real/call_time.py says why means; the wait's own time not included). `flashsim bench flash`
writes it as the profile's `flash.cold_wait_s` (the mean wait) / `cold_compute_s` /
`framework_cold_compute_s`; the simulator adds it to every layer that waited for demand reads, at
the demand batch's time, spread over that layer's FFN, its cache work and the next attention as the
real runs pay it (sim/components/compute.py, COLD_SPLIT).

Compute after the caches were swept. A real layer needs no wait to find its code cold: its own
weights, KV cache and FFN rows stream megabytes through the caches, more than a core's L2 holds,
and evict the code and data the next layer's framework and kernels run (a probe layer run back to
back keeps them warm). `swept_compute` times the same two probe layers back to back and right
after touching every cache line of SWEEP_BYTES (each n in turn; one byte read and written per 64 B
line, as a gather streams rows). `flashsim bench compute` writes the difference of the means as
the profile's `compute.evict_bytes` / `evict_layer_s` / `framework_evict_layer_s`; the simulator
charges it to the code after every layer, at the bytes that layer streamed (ComputeModel.evict_s).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from real.cache import LayerCache, TransposeScratch, gather_rows, gather_scratch
from real.call_time import mean_call_s
from real.reader import BundleReader
from real.store import WeightStore
from real.torch_threads import torch_threads

COLD_BATCH_NEURONS = (4, 16, 64, 256, 1024)
COLD_LONG_REPEATS = (2, 4, 8)  # longer waits: that many batches of the largest size back to back
SWEEP_BYTES = (1 << 20, 4 << 20, 16 << 20, 64 << 20)   # swept before a layer (swept_compute)
COLD_SAMPLES = 40              # timed layers per batch size and kind (after 5 untimed)
KERNEL_DIMS = (64, 256, 32)    # the kernel probe's d_model, cached rows, computed rows
# a probe's timing loop: before (run untimed before each layer, None: back to back) -> layer times
LayerTimes = Callable[[Callable[[], None] | None], list[float]]


def _kernel_layer(torch: Any, seed: int) -> Callable[[], Any]:
    """One shape-mode layer's kernels at small width (module docstring)."""
    F = torch.nn.functional
    d, n, k = KERNEL_DIMS
    g = torch.Generator().manual_seed(seed)
    wq, wk, wv, wo = (torch.randn(d, d, generator=g) for _ in range(4))
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, 64, (n, 3 * d * 4), dtype=np.uint8)    # small bytes: finite fp32 values
    slots = np.sort(rng.choice(n, k, replace=False))
    scratch = gather_scratch(k, rows.shape[1])
    down_t = TransposeScratch(torch)
    x = torch.randn(1, d, generator=g)

    def layer() -> Any:
        h = x + F.linear(F.linear(x, wq), wo)
        F.linear(x, wk), F.linear(x, wv)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        r = gather_rows(rows, slots, scratch, torch.float32)
        act = F.silu(F.linear(h, r[:, :d])) * F.linear(h, r[:, d:2 * d])
        return h + F.linear(act, down_t.transposed(r[:, 2 * d:3 * d], k, d, 4))

    return layer


def _framework_layer(torch: Any, seed: int,
                     ffn_step: Callable[[], None] | None = None) -> Callable[[Callable[[], None] | None], list[float]] | None:
    """A tiny transformers llama whose decoder layers run `before()` (untimed) and are timed one by
    one through forward hooks: returns step(before) -> the layers' times of one decode step, or None
    without transformers. `ffn_step`: each layer's MLP is replaced by it (the backend's FFN step, as
    model mode replaces SmolLM2's: real.model_mode), its output zeros of the MLP's shape."""
    from real.bench_compute import tiny_llama
    from real.model_mode import _decode_step

    tiny = tiny_llama(torch, 4, seed)
    if tiny is None:
        return None
    model, arg, ids = tiny
    if ffn_step is not None:
        class _FfnStep(torch.nn.Module):
            def forward(self, x: Any) -> Any:
                ffn_step()
                return torch.zeros_like(x)

        for layer in model.model.layers:
            layer.mlp = _FfnStep()
    state: dict[str, Any] = {"before": None, "t0": 0.0, "times": [], "past": None, "steps": 0}

    def pre(_mod: Any, _args: Any) -> None:
        if state["before"] is not None:
            state["before"]()
        state["t0"] = time.perf_counter()

    def post(_mod: Any, _args: Any, _out: Any) -> None:
        state["times"].append(time.perf_counter() - state["t0"])

    for layer in model.model.layers:
        layer.register_forward_pre_hook(pre)
        layer.register_forward_hook(post)

    def step(before: Callable[[], None] | None) -> list[float]:
        state["before"], state["times"] = before, []
        if state["steps"] % 32 == 0:    # keep the KV cache short: a fixed context
            state["past"] = None
        state["steps"] += 1
        with torch.no_grad():
            _, state["past"] = _decode_step(model, ids, state["past"], arg)
        return list(state["times"])

    return step


def cold_compute(store: WeightStore, in_flight: int, seed: int, framework: bool = True,
                 samples: int = COLD_SAMPLES, long_repeats: tuple[int, ...] = COLD_LONG_REPEATS,
                 ffn_step: Callable[[], None] | None = None) -> dict[str, Any]:
    """Per wait: a layer's time right after the decoder waited for reads, less its time back to back
    (module docstring), for the kernel probe and (framework=True, transformers installed) the tiny
    llama's decoder layer; `samples` timed layers per point. The waits are one batch of n neurons for
    each n in COLD_BATCH_NEURONS, then `long_repeats` batches of the largest back to back (one long
    wait, as a layer of many small reads waits). `ffn_step` (one layer's FFN step of the real
    backend, real.bench_host_cpu.FfnStepProbe.layer): the tiny llama runs it as its MLP, as model
    mode's layers do (module docstring). Runs on one torch thread, as the decoder does."""
    import torch

    N = store.n_neurons
    sizes = [n for n in COLD_BATCH_NEURONS if n <= N]
    points = [(n, 1) for n in sizes] + [(sizes[-1], r) for r in long_repeats]
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xC01D]))
    reads: dict[tuple[int, int], list[int]] = {p: [] for p in points}
    waits: dict[tuple[int, int], list[float]] = {p: [] for p in points}
    with torch_threads(torch, 1), BundleReader(store, layout="bundled", in_flight=in_flight) as reader:
        cache = LayerCache(max(sizes), N, store.bundle_bytes, reader.dest_row_bytes)

        def wait(n: int, repeats: int) -> Callable[[], None]:
            def run() -> None:
                t0, k = time.perf_counter(), 0
                for _ in range(repeats):
                    ids = np.sort(rng.choice(N, n, replace=False))
                    cache.clear()
                    a, b = cache.append(ids)
                    k += reader.read(0, ids, cache.rows[a:b]).reads_issued
                waits[n, repeats].append(time.perf_counter() - t0)
                reads[n, repeats].append(k)
            return run

        kernel = _kernel_layer(torch, seed)
        befores = [wait(*p) for p in points]
        result: dict[str, Any] = {"batch_neurons": [n for n, _ in points], "batch_repeats": [r for _, r in points],
                                  "in_flight": in_flight, "kernel_dims": list(KERNEL_DIMS), "samples": samples,
                                  "ffn_step": ffn_step is not None}
        result["kernel_warm_s"], result["kernel_cold_s"] = _penalties_after(_kernel_times(torch, kernel, samples),
                                                                            befores)
        step = _framework_layer(torch, seed, ffn_step) if framework else None
        if step is not None:
            result["framework_warm_s"], result["framework_cold_s"] = _penalties_after(_fw_times(step, samples),
                                                                                      befores)
        # the x axis the simulator looks the penalty up by: how long the decoder waited
        result["batch_wait_s"] = [float(mean_call_s(waits[p])) for p in points]
        result["batch_reads"] = [float(np.median(reads[p])) for p in points]
    return result


def _kernel_times(torch: Any, kernel: Callable[[], Any], samples: int) -> LayerTimes:
    """The kernel probe's timing loop: before(), then one timed layer; `samples` after 5 untimed."""
    def times(before: Callable[[], None] | None) -> list[float]:
        out = []
        with torch.no_grad():
            for _ in range(samples + 5):
                if before is not None:
                    before()
                t = time.perf_counter()
                kernel()
                out.append(time.perf_counter() - t)
        return out[5:]
    return times


def _fw_times(step: LayerTimes, samples: int) -> LayerTimes:
    """The framework probe's timing loop: decode steps until `samples` layers after 8 untimed."""
    def times(before: Callable[[], None] | None) -> list[float]:
        out: list[float] = []
        while len(out) < samples + 8:
            out.extend(step(before))
        return out[8:]
    return times


def _penalties_after(layer_times: LayerTimes,
                     befores: list[Callable[[], None]]) -> tuple[float, list[float]]:
    """(mean back to back, [mean after each `before` less that]) of a probe's layer times."""
    warm = float(mean_call_s(layer_times(None)))
    return warm, [max(0.0, float(mean_call_s(layer_times(b))) - warm) for b in befores]


def swept_compute(seed: int, framework: bool = True, samples: int = COLD_SAMPLES,
                  sweep_bytes: tuple[int, ...] = SWEEP_BYTES) -> dict[str, Any]:
    """Per size n in `sweep_bytes`: a probe layer's time right after every cache line of n bytes was
    read and written, less its time back to back (module docstring), for the kernel probe and
    (framework=True, transformers installed) the tiny llama's decoder layer; `samples` timed layers
    per point. One torch thread, as the decoder."""
    import torch

    buf = np.zeros(max(sweep_bytes), np.uint8)

    def sweep(n: int) -> Callable[[], None]:
        def run() -> None:
            lines = buf[:n:64]
            lines += 1
        return run

    with torch_threads(torch, 1):
        sweeps = [sweep(n) for n in sweep_bytes]
        result: dict[str, Any] = {"sweep_bytes": list(sweep_bytes), "kernel_dims": list(KERNEL_DIMS), "samples": samples}
        result["kernel_warm_s"], result["kernel_swept_s"] = _penalties_after(
            _kernel_times(torch, _kernel_layer(torch, seed), samples), sweeps)
        step = _framework_layer(torch, seed) if framework else None
        if step is not None:
            result["framework_warm_s"], result["framework_swept_s"] = _penalties_after(_fw_times(step, samples), sweeps)
    return result
