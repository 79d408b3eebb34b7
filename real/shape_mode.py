"""Shape mode: any ModelSpec with a random-weight store, driven by a trace's active sets: real
direct-I/O reads and real sparse FFN compute, timing only (the numbers computed mean nothing).

Per step and layer: an attention stand-in (the q, k, v, o projections as GEMVs over the hidden
vector, context of one token: the projections are the attention's weight traffic and FLOPs at short
context), then the store-backed sparse FFN (`real.backend.RealExecutor.ffn`), then the lm_head GEMV
after the last layer. The attention and lm_head weights are random, resident, and ONE layer's set
is shared by every layer (their compute per layer is the same; DRAM for a 7B shape stays ~0.3 GiB
instead of 4 GiB). Hidden vectors are RMS-normalised between layers so fp16 never overflows.
"""

from __future__ import annotations

from typing import Any

from devices.schema import DeviceProfile
from real.backend import RealExecutor, RealRun
from sim.config import RunConfig
from traces.format import Trace

SHAPE_WEIGHT_STD = 0.02


def shape_config(config: RunConfig) -> RunConfig:
    """The run config shape mode runs under: `compute.framework=kernels`, since its attention
    stand-in calls the projection kernels directly, not through Hugging Face modules (replay an
    executed shape-mode trace with this config, or `--set compute.framework=kernels`)."""
    return config.with_overrides(["compute.framework=kernels"])


def run_shape(store: Any, trace: Trace, profile: DeviceProfile, config: RunConfig, *, seed: int = 0,
              device: str = "cpu", threads: int | None = None) -> RealRun:
    import torch

    ex = RealExecutor(store, trace, profile, shape_config(config), device=device, threads=threads)
    try:
        F = torch.nn.functional
        spec, dt = store.spec, ex.tdtype
        gen = torch.Generator().manual_seed(seed)

        def rand(*shape: int) -> Any:
            return (torch.randn(*shape, generator=gen) * SHAPE_WEIGHT_STD).to(dt).to(ex.tdev)

        d, kv = spec.d_model, spec.n_kv_heads * spec.head_dim
        wq, wk, wv, wo = rand(spec.n_heads * spec.head_dim, d), rand(kv, d), rand(kv, d), rand(d, spec.n_heads * spec.head_dim)
        head = rand(spec.vocab_size, d)
        x0 = torch.randn(1, d, generator=gen).to(dt).to(ex.tdev)
        outs = []
        for s in range(ex.n_steps):
            ex.begin_step(s)
            h = x0
            for layer in range(spec.n_layers):
                q = F.linear(h, wq)
                _k, _v = F.linear(h, wk), F.linear(h, wv)
                h = h + F.linear(q, wo)
                h = _rms(h)
                h = h + ex.ffn(layer, h)
                h = _rms(h)
            logits = F.linear(h, head)
            outs.append(float(logits.float().abs().sum()))
            ex.end_step()
        run = ex.finish()
    except BaseException:
        ex.close()
        raise
    run.notes.append("shape mode: random weights; attention stand-in (q/k/v/o GEMVs, one shared layer set)")
    run.outputs = outs
    return run


def _rms(h: Any) -> Any:
    return h * (h.float().pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt().to(h.dtype)


def shape_trace_like(spec: Any, out: Any, n_tokens: int, seed: int, active_fraction: float = 0.1,
                     overlap: float = 0.6, hot_skew: float = 0.3) -> Any:
    """A synthetic trace of `spec`'s shape (one prompt), for shape-mode runs and tests."""
    from traces.synthetic import synthesize

    return synthesize(out, spec, n_tokens, seed, active_fraction=active_fraction, overlap=overlap, hot_skew=hot_skew,
                      prompt_tokens=n_tokens,
                      overwrite=True)
