"""Shape mode: any ModelSpec with a random-weight store, driven by a trace's active sets: real
direct-I/O reads and real sparse FFN compute, timing only (the numbers computed mean nothing).

Per step and layer: an attention stand-in (the q, k, v, o projections as GEMVs over the hidden
vector, context of one token: the projections are the attention's weight traffic and FLOPs at short
context), then the store-backed sparse FFN (`real.runtime.backend.RealExecutor.ffn`), then the lm_head GEMV
after the last layer. The attention and lm_head weights are random and resident. A real model's
layers each have their own attention weights, which a decoder streams from DRAM every token; the
stand-in must too, or it measures a CPU cache instead: with ONE set shared by every layer the
validation shape's 12 MB set stays in the last-level cache and its attention took 191 us per layer
against 701 us with a set per layer. So each layer has
its own set, up to ATTN_DISTINCT_BYTES in all; beyond that (a 7B shape: 128 MiB per fp16 layer,
4 GiB for 32) the layers cycle through as many sets as fit, every one read again only after the
others, far more bytes than any CPU's last-level cache holds, so each layer's weights still come
from DRAM. Hidden vectors are RMS-normalised between layers so fp16 never overflows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from devices.schema import DeviceProfile
from real.runtime.backend import RealExecutor, RealRun
from sim.config import RunConfig
from traces.format import Trace

SHAPE_WEIGHT_STD = 0.02
# the distinct attention weight sets' bytes in all: a set per layer up to this, then as many as fit
# (at least 2). 512 MiB is beyond the last-level cache of any CPU the tool targets (Jetson Orin: 4 MB;
# server x86 up to a few hundred MB), so cycling sets read each layer's weights from DRAM.
ATTN_DISTINCT_BYTES = 512 << 20


def attention_sets(spec: Any, dtype_bytes: int) -> int:
    """How many distinct attention weight sets the stand-in's layers cycle through (module doc)."""
    kv = spec.n_kv_heads * spec.head_dim
    q = spec.n_heads * spec.head_dim
    set_bytes = (2 * q * spec.d_model + 2 * kv * spec.d_model) * dtype_bytes
    return min(spec.n_layers, max(2, ATTN_DISTINCT_BYTES // set_bytes))


def shape_config(config: RunConfig) -> RunConfig:
    """The run config shape mode runs under: `compute.framework=kernels`, since its attention
    stand-in calls the projection kernels directly, not through Hugging Face modules (replay an
    executed shape-mode trace with this config, or `--set compute.framework=kernels`)."""
    return config.with_overrides(["compute.framework=kernels"])


def run_shape(store: Any, trace: Trace, profile: DeviceProfile, config: RunConfig, *, seed: int = 0,
              device: str = "cpu", threads: int | None = None) -> RealRun:
    ex = RealExecutor(store, trace, profile, shape_config(config), device=device, threads=threads)
    try:
        step, n_sets = decode_step(ex, seed)
        outs = [step(s) for s in range(ex.n_steps)]
        run = ex.finish()
    except BaseException:
        ex.close()
        raise
    run.notes.append(f"shape mode: random weights; attention stand-in (q/k/v/o GEMVs, {n_sets} distinct weight "
                     f"sets over {ex.spec.n_layers} layers)")
    run.outputs = outs
    return run


def decode_step(ex: RealExecutor, seed: int) -> tuple[Callable[[int], float], int]:
    """Shape mode's model on the executor `ex` (random resident weights from `seed`): (step(s) ->
    the logits' absolute sum, running decode step s from ex.begin_step to ex.end_step; the number of
    distinct attention weight sets, `attention_sets`)."""
    import torch

    F = torch.nn.functional
    spec, dt = ex.spec, ex.tdtype
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> Any:
        return (torch.randn(*shape, generator=gen) * SHAPE_WEIGHT_STD).to(dt).to(ex.tdev)

    d, kv, qd = spec.d_model, spec.n_kv_heads * spec.head_dim, spec.n_heads * spec.head_dim
    n_sets = attention_sets(spec, torch.empty((), dtype=dt).element_size())
    sets = [(rand(qd, d), rand(kv, d), rand(kv, d), rand(d, qd)) for _ in range(n_sets)]
    head = rand(spec.vocab_size, d)
    x0 = torch.randn(1, d, generator=gen).to(dt).to(ex.tdev)

    def step(s: int) -> float:
        ex.begin_step(s)
        h = x0
        for layer in range(spec.n_layers):
            wq, wk, wv, wo = sets[layer % n_sets]
            q = F.linear(h, wq)
            _k, _v = F.linear(h, wk), F.linear(h, wv)
            h = h + F.linear(q, wo)
            h = _rms(h)
            h = h + ex.ffn(layer, h)
            h = _rms(h)
        out = float(F.linear(h, head).float().abs().sum())
        ex.end_step()
        return out

    return step, n_sets


def _rms(h: Any) -> Any:
    return h * (h.float().pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt().to(h.dtype)


def shape_trace_like(spec: Any, out: Any, n_tokens: int, seed: int, active_fraction: float = 0.1,
                     overlap: float = 0.6, hot_skew: float = 0.3) -> Any:
    """A synthetic trace of `spec`'s shape (one prompt), for shape-mode runs and tests."""
    from traces.synthetic import synthesize

    return synthesize(out, spec, n_tokens, seed, active_fraction=active_fraction, overlap=overlap, hot_skew=hot_skew,
                      prompt_tokens=n_tokens,
                      overwrite=True)
