"""Small traces and models for the simulator tests (seeded; built with the real trace writer)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from devices.model_spec import ModelSpec
from traces.build import write_dense_trace
from traces.format import PromptInfo, SparsityRule, TraceWriter, pack_mask


def tiny_spec(n_layers: int = 2, d_model: int = 64, d_ff: int = 256, ffn_kind: str = "relu",
              name: str = "tiny") -> ModelSpec:
    return ModelSpec(name=name, family="llama", n_layers=n_layers, d_model=d_model, d_ff=d_ff, n_heads=4,
                     n_kv_heads=4, head_dim=d_model // 4, vocab_size=1000, ffn_kind=ffn_kind)


def dense_trace(path: Path, spec: ModelSpec, n_prompt: int = 4, n_gen: int = 12, seed: int = 0,
                active_fraction: float = 0.1, reuse: float = 0.6, n_prompts: int = 1,
                tasks: tuple[str, ...] = ("qa",)) -> Path:
    """ReLU outputs with temporal reuse: each neuron keeps its previous state with probability
    `reuse`, else is active with probability `active_fraction`; inactive neurons output 0. Written with
    `traces.build.write_dense_trace` (rule relu, top-25% magnitudes stored)."""
    rng = np.random.default_rng(seed)
    L, N = spec.n_layers, spec.d_ff
    T = n_prompts * (n_prompt + n_gen)
    acts = np.empty((L, T, N), np.float32)
    for layer in range(L):
        prev = rng.random(N) < active_fraction
        for t in range(T):
            fresh = rng.random(N) < active_fraction
            keep = rng.random(N) < reuse
            act = np.where(keep, prev, fresh)
            mag = rng.gamma(2.0, 1.0, N).astype(np.float32)
            acts[layer, t] = np.where(act, mag, 0.0)
            prev = act
    phase = np.tile(np.r_[np.zeros(n_prompt, np.uint8), np.ones(n_gen, np.uint8)], n_prompts)
    pidx = np.repeat(np.arange(n_prompts, dtype=np.int32), n_prompt + n_gen)
    prompts = [PromptInfo(id=f"p{i}", task=tasks[i % len(tasks)], n_prompt_tokens=n_prompt, n_generated_tokens=n_gen)
               for i in range(n_prompts)]
    return write_dense_trace(path, spec, acts, rng.integers(0, spec.vocab_size, T).astype(np.int32), phase, pidx,
                             prompts, rule="relu")


def mask_trace(path: Path, spec: ModelSpec, n_tokens: int, active_fraction: float = 0.03, reuse: float = 0.8,
               seed: int = 0, n_prompt: int = 0, top_k: int = 0) -> Path:
    """Random packed masks (no magnitudes unless top_k > 0) with temporal reuse and a skewed hotness,
    written layer by layer with TraceWriter: for large (7B-shape) traces."""
    rng = np.random.default_rng(seed)
    L, N, T = spec.n_layers, spec.d_ff, n_tokens
    hot = rng.lognormal(0.0, 1.0, N)   # skewed hotness: a few neurons fire far more often
    p = hot / hot.mean() * active_fraction
    for _ in range(5):                  # clip and renormalise so the mean stays active_fraction
        p = np.minimum(p, 0.9)
        p *= active_fraction / p.mean()
    p = np.minimum(p, 0.9)
    prompts = [PromptInfo(id="p0", task="synthetic", n_prompt_tokens=n_prompt, n_generated_tokens=T - n_prompt)]
    with TraceWriter(path, spec, T, top_k, SparsityRule(rule="synthetic", target_fraction=active_fraction),
                     prompts, synthetic={"generator": "tests.sim.helpers.mask_trace", "seed": seed}) as w:
        w.token_ids[:] = rng.integers(0, spec.vocab_size, T)
        w.phase[:] = np.r_[np.zeros(n_prompt, np.uint8), np.ones(T - n_prompt, np.uint8)]
        w.prompt_index[:] = 0
        for layer in range(L):
            m = np.empty((T, N), bool)
            prev = rng.random(N) < p
            for t0 in range(0, T, 256):
                t1 = min(T, t0 + 256)
                u = rng.random((t1 - t0, N))
                fresh = rng.random((t1 - t0, N)) < p
                for i in range(t1 - t0):
                    prev = np.where(u[i] < reuse, prev, fresh[i])
                    m[t0 + i] = prev
            w.masks[layer] = pack_mask(m)
            if top_k:
                mag = rng.gamma(2.0, 1.0, (T, N)).astype(np.float32) * m
                idx = np.argsort(-mag, axis=1, kind="stable")[:, :top_k]
                w.top_idx[layer] = idx
                w.top_mag[layer] = np.take_along_axis(mag, idx, axis=1).astype(np.float16)
                w.abs_sum[layer] = mag.sum(axis=1)
            else:
                w.abs_sum[layer] = m.sum(axis=1)
    return Path(path)
