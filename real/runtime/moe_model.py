"""MoE model mode on the real backend: a local Hugging Face MoE decodes token by token with its routed
experts served from an expert store through the expert cache (real/runtime/moe_executor.py).

The model's own code runs everything else (embeddings, attention and KV cache, norms, the router, the
shared experts of Qwen2-MoE, the head). Only each MoE block's `experts` module is replaced: in
transformers >= 5 it is called as experts(hidden [N, d], top_k_index [N, K], top_k_weights [N, K]) by
Mixtral, Qwen2/3-MoE and OLMoE alike, and holds gate_up_proj [E, 2F, d] and down_proj [E, d, F]. The
replacement passes each row (one token: decode feeds one token per forward) to the executor, which
reads the missed experts from the store and computes the weighted SwiGLU sum on the CPU.

`store_from_hf` writes those expert weights into an expert store; `dense_logits` is the unmodified
model's forward over the whole sequence, the reference the cached run's logits are checked against.
torch and transformers are imported inside the functions.
"""

from __future__ import annotations

import inspect
import re
import time
from pathlib import Path
from typing import Any

import numpy as np

from devices.errors import FlashsimError
from real.weights.expert_store import ExpertStore, write_expert_store

EXPERTS_NAME = re.compile(r"^(?:.*\.)?layers\.(\d+)\.mlp\.experts$")


def moe_experts_modules(model: Any) -> list[tuple[int, Any]]:
    """(model layer, experts module) of every MoE block, in layer order; FlashsimError if none."""
    found = []
    for name, mod in model.named_modules():
        m = EXPERTS_NAME.match(name)
        if m and hasattr(mod, "gate_up_proj") and hasattr(mod, "down_proj"):
            found.append((int(m.group(1)), mod))
    for layer, mod in found:
        gu, dn = mod.gate_up_proj, mod.down_proj
        if hasattr(mod, "gate_up_proj_bias") or gu.ndim != 3 or dn.ndim != 3 or gu.shape[1] != 2 * dn.shape[2] \
                or gu.shape[2] != dn.shape[1]:
            raise FlashsimError(f"{type(model).__name__} layer {layer}: experts are not plain SwiGLU with "
                                "gate_up_proj [E, 2F, d] and down_proj [E, d, F] (gpt-oss's biased, clamped "
                                "experts are not supported); this model cannot run in MoE model mode")
    if not found:
        raise FlashsimError(f"{type(model).__name__}: no fused MoE experts (layers.N.mlp.experts with gate_up_proj "
                            "and down_proj, transformers >= 5); this model cannot run in MoE model mode")
    return sorted(found, key=lambda x: x[0])


def _load(folder: str | Path) -> tuple[Any, dict]:
    from traces.capture.routing import load_moe_folder

    model, _, cfg = load_moe_folder(folder)
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise FlashsimError(f"{folder}: hidden_act {act!r}; the expert executor computes SwiGLU (silu) experts only")
    return model, cfg


def store_from_hf(folder: str | Path, out: str | Path, dtype: str = "fp32", overwrite: bool = False) -> Path:
    """Write the routed experts of the HF MoE in `folder` into an expert store."""
    model, cfg = _load(folder)
    mods = moe_experts_modules(model)
    E, two_f, d = mods[0][1].gate_up_proj.shape
    F = two_f // 2
    top_k = int(cfg.get("num_experts_per_tok") or model.config.num_experts_per_tok)

    def experts(m: int, e: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        mod = mods[m][1]
        gu = mod.gate_up_proj[e].detach().float().numpy()
        return gu[:F], gu[F:], mod.down_proj[e].detach().float().numpy()

    return write_expert_store(out, model=Path(folder).resolve().name, n_layers=int(model.config.num_hidden_layers),
                              moe_layers=[layer for layer, _ in mods], n_experts=int(E), top_k=top_k, d_model=int(d),
                              d_expert_ff=int(F), dtype=dtype, experts=experts,
                              source={"kind": "hf", "folder": str(Path(folder).resolve())}, overwrite=overwrite)


def dense_logits(folder: str | Path, token_ids: list[int]) -> np.ndarray:
    """float32 [T, vocab]: the unmodified model's logits over the whole sequence (the reference)."""
    import torch

    model, _ = _load(folder)
    with torch.inference_mode():
        return model(input_ids=torch.tensor([token_ids])).logits[0].float().numpy()


def run_model(folder: str | Path, store: ExpertStore, token_ids: list[int], *, policy: str, params: dict | None,
              capacity: int, scope: str = "layer", threads: int = 4, direct: bool | None = None) -> dict[str, Any]:
    """Decode `token_ids` one token at a time (teacher forced) with experts from `store` through the cache.

    Returns per-token logits [T, vocab], wall latency [T], expert read time [T], hits and the routing the
    model chose (experts [T, M, K], weights), from which the simulator can replay the same run."""
    import torch

    from real.runtime.moe_page_cache import executor_for
    from sim.moe.base import build_cache

    model, _ = _load(folder)
    mods = moe_experts_modules(model)
    m_ = store.manifest
    if [layer for layer, _ in mods] != list(m_.moe_layers) or mods[0][1].gate_up_proj.shape[0] != m_.n_experts:
        raise FlashsimError(f"{store.path}: the expert store's layers/experts do not match the model in {folder}; "
                            "write the store from this model (`flashsim real moe-store --model FOLDER`)")
    T, M, K = len(token_ids), len(mods), m_.top_k
    routed = np.zeros((T, M, K), np.int64)
    rweights = np.zeros((T, M, K), np.float32)
    read_s, hits, nbytes = np.zeros(T), np.zeros(T), np.zeros(T)
    state = {"t": 0}
    with executor_for(store, build_cache(policy, params), capacity, scope, n_tokens=T, threads=threads,
                      direct=direct) as ex:

        def patched(m: int):
            def forward(hidden: Any, top_k_index: Any, top_k_weights: Any) -> Any:
                out = torch.zeros_like(hidden)
                idx, w = top_k_index.numpy(), top_k_weights.float().numpy()
                for r in range(hidden.shape[0]):
                    t = state["t"]
                    y, st = ex.step(t, m, idx[r], w[r], hidden[r:r + 1].to(ex.tdtype))
                    out[r] = y[0].to(hidden.dtype)
                    routed[t, m], rweights[t, m] = idx[r], w[r]
                    read_s[t] += st.read_s
                    hits[t] += st.hits
                    nbytes[t] += st.bytes_read
                return out
            return forward

        originals = [(mod, mod.forward) for _, mod in mods]
        for m, (_, mod) in enumerate(mods):
            mod.forward = patched(m)
        logits = np.zeros((T, model.config.vocab_size), np.float32)
        lat = np.zeros(T)
        # transformers 5 names the KV cache argument `cache`; 4.x `past_key_values`
        kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        try:
            with torch.inference_mode():
                cache = None
                for t, tok in enumerate(token_ids):
                    state["t"] = t
                    t0 = time.perf_counter()
                    out = model(input_ids=torch.tensor([[tok]]), use_cache=True, **({kw: cache} if cache else {}))
                    cache = out[kw] if kw in out else out.get("past_key_values")
                    lat[t] = time.perf_counter() - t0
                    logits[t] = out.logits[0, -1].float().numpy()
        finally:
            for mod, fwd in originals:
                mod.forward = fwd
        direct_io = ex.direct_io
    return {"logits": logits, "latency_s": lat, "read_s": read_s, "hits": hits, "bytes_read": nbytes, "experts": routed,
            "weights": rweights, "direct_io": direct_io, "hit_rate": float(hits.sum() / (T * M * K))}
