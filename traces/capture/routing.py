"""Capture of MoE routing from a local Hugging Face model: hooks on every MoE layer's router.

The router of Mixtral, Qwen2/3-MoE, Qwen3-Next/3.5-MoE, OLMoE and DeepSeek-V2/V3 lives at
`model.layers[i].mlp.gate` (gpt-oss: `mlp.router`; Mixtral before transformers 4.45:
`block_sparse_moe.gate`). In transformers >= 5 it is a TopKRouter whose forward returns
(router_logits, routing weights [N, K], expert indices [N, K]): the weights are exactly what the block
multiplies the expert outputs by (softmax, top-k, renormalised when the model's `norm_topk_prob` asks;
DeepSeek-V3's sigmoid, group-limited choice and routed scaling factor; gpt-oss's softmax over the top
k logits). Run here on tiny models of Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE and gpt-oss; the others
share the interface but were not run. Older versions return only the logits from an nn.Linear; the recorder then
applies the same rule (softmax in fp32, top-k, renormalise when `norm_topk_prob`, which Mixtral always
does). A forward hook copies ids and weights of every row the router sees, so one prefill of P tokens
adds P rows and each decode step one.

Prompts go through `traces.capture.generate.Decoder` (greedy or seeded sampling, batch 1, KV cache).
A model folder without a tokenizer (a tiny model built from a config) is fed the prompt's UTF-8 bytes
modulo the vocabulary: routing, not text, is what is recorded. torch and transformers are imported
inside the functions.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from devices.errors import FlashsimError
from traces.capture.prompts import Prompt
from traces.routing import DECODE, PREFILL, order_by_weight, write_routing_trace

ROUTER_NAMES = re.compile(r"^(?:.*\.)?layers\.(\d+)\.(?:mlp|block_sparse_moe)\.(?:gate|router)$")


class RoutingRecorder:
    """Forward hooks on every MoE router of `model`; `rows()` returns what they saw, in call order."""

    def __init__(self, model: Any):
        cfg = getattr(model, "config", None)
        self.top_k = int(getattr(cfg, "num_experts_per_tok", 0) or getattr(cfg, "top_k", 0) or 0)
        self.n_experts = int(getattr(cfg, "num_local_experts", 0) or getattr(cfg, "num_experts", 0)
                             or getattr(cfg, "n_routed_experts", 0) or 0)
        # Mixtral renormalises its top-k always; the others say so in norm_topk_prob
        self.norm = bool(getattr(cfg, "norm_topk_prob", True))
        self.layers: list[int] = []
        self._handles, self._rows = [], {}
        for name, mod in model.named_modules():
            m = ROUTER_NAMES.match(name)
            if m:
                layer = int(m.group(1))
                self.layers.append(layer)
                self._rows[layer] = []
                self._handles.append(mod.register_forward_hook(self._hook(layer)))
        if not self.layers:
            raise FlashsimError(f"{type(model).__name__}: no MoE router found (looked for layers.N.mlp.gate, "
                                "layers.N.mlp.router and layers.N.block_sparse_moe.gate); this model has no routed "
                                "experts flashsim knows")
        if self.top_k < 1 or self.n_experts < 1:
            raise FlashsimError(f"{type(model).__name__}: config lacks num_experts_per_tok / the expert count")

    def _hook(self, layer: int):
        def hook(module: Any, inputs: Any, output: Any) -> None:
            import torch

            if isinstance(output, tuple) and len(output) >= 3:
                weights, ids = output[1], output[2]
            else:
                logits = output[0] if isinstance(output, tuple) else output
                probs = torch.softmax(logits.float(), dim=-1)
                weights, ids = torch.topk(probs, self.top_k, dim=-1)
                if self.norm:
                    weights = weights / weights.sum(dim=-1, keepdim=True)
            self._rows[layer].append((ids.detach().reshape(-1, ids.shape[-1]).cpu().numpy(),
                                      weights.detach().float().reshape(-1, ids.shape[-1]).cpu().numpy()))
        return hook

    def take(self) -> tuple[np.ndarray, np.ndarray]:
        """(ids [n, M, K], weights [n, M, K]) of the rows recorded since the last take."""
        ids, ws = [], []
        for layer in sorted(self.layers):
            rows = self._rows[layer]
            ids.append(np.concatenate([r[0] for r in rows]) if rows else np.zeros((0, self.top_k), np.int64))
            ws.append(np.concatenate([r[1] for r in rows]) if rows else np.zeros((0, self.top_k), np.float32))
            self._rows[layer] = []
        n = {a.shape[0] for a in ids}
        if len(n) != 1:
            raise FlashsimError(f"router hooks saw different token counts per layer ({sorted(n)}); "
                                "the model skips routers on some tokens, which flashsim cannot record")
        return np.stack(ids, axis=1), np.stack(ws, axis=1)

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def load_moe_folder(folder: str | Path) -> tuple[Any, Any, dict]:
    """(model in fp32 eval mode, tokenizer or None, config dict) of a local HF MoE folder."""
    folder = Path(folder)
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise FlashsimError(f"{folder}: no config.json in this folder; give a Hugging Face model folder")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    except (OSError, ValueError, KeyError) as e:
        raise FlashsimError(f"{folder}: cannot load the model ({str(e).splitlines()[0]})") from None
    tok = None
    if any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        tok = AutoTokenizer.from_pretrained(folder)
    return model, tok, json.loads(cfg_path.read_text())


def prompt_ids(tokenizer: Any, text: str, vocab: int, chat_template: bool) -> list[int]:
    if tokenizer is not None:
        from traces.capture.generate import encode_prompt

        return encode_prompt(tokenizer, text, chat_template)
    return [b % vocab for b in text.encode("utf-8")] or [0]


def capture_routing(folder: str | Path, prompts: list[Prompt], out: str | Path, *, max_new_tokens: int = 16,
                    seed: int = 0, temperature: float = 0.0, chat_template: bool = True, model_name: str | None = None,
                    provenance: dict | None = None, overwrite: bool = False) -> Path:
    """Run `prompts` through the MoE model in `folder` and write a routing trace of every token."""
    from traces.capture.generate import Decoder, eos_token_ids
    from traces.capture.run import library_versions, prompt_seed

    model, tok, cfg = load_moe_folder(folder)
    rec = RoutingRecorder(model)
    decoder = Decoder(model, eos_token_ids(model, tok) if tok is not None else frozenset(), temperature)
    vocab = int(cfg.get("vocab_size") or model.config.vocab_size)
    ids_all, w_all, phase, seq = [], [], [], []
    try:
        for i, p in enumerate(prompts):
            ids = prompt_ids(tok, p.text, vocab, chat_template)
            rng = np.random.default_rng(prompt_seed(seed, p.id)) if temperature > 0 else None
            decoder.run(ids, max_new_tokens, rng)
            e, w = rec.take()
            n_pre = len(ids)
            ids_all.append(e)
            w_all.append(w)
            phase.append(np.r_[np.full(n_pre, PREFILL), np.full(e.shape[0] - n_pre, DECODE)].astype(np.uint8))
            seq.append(np.full(e.shape[0], i, np.int32))
    finally:
        rec.remove()
    experts, weights = order_by_weight(np.concatenate(ids_all), np.concatenate(w_all))
    source = {"kind": "captured", "model_folder": str(Path(folder).resolve()), "hook": "layers.N.mlp.gate forward",
              "prompts": [{"id": p.id, "task": p.task} for p in prompts], "max_new_tokens": max_new_tokens,
              "seed": seed, "temperature": temperature, "tokenizer": tok is not None,
              "libraries": library_versions(), **(provenance or {})}
    return write_routing_trace(out, model=model_name or Path(folder).resolve().name,
                               n_layers=int(cfg.get("num_hidden_layers") or model.config.num_hidden_layers),
                               moe_layers=sorted(rec.layers), n_experts=rec.n_experts, top_k=rec.top_k,
                               experts=experts, weights=weights, phase=np.concatenate(phase),
                               sequence=np.concatenate(seq), source=source, overwrite=overwrite)


def build_tiny_moe(folder: str | Path, family: str = "mixtral", *, n_layers: int = 2, n_experts: int = 8,
                   top_k: int = 2, hidden: int = 32, expert_ff: int = 64, vocab: int = 128, seed: int = 0) -> Path:
    """Save a randomly initialised MoE (shapes only) of `family` (mixtral | qwen2_moe | qwen3_moe | olmoe | gpt_oss)
    to `folder` as safetensors + config.json: the model capture and the real backend's tests run."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    common = dict(num_hidden_layers=n_layers, hidden_size=hidden, intermediate_size=expert_ff,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=vocab, num_experts_per_tok=top_k,
                  max_position_embeddings=512, tie_word_embeddings=False)
    extra = {"mixtral": dict(num_local_experts=n_experts),
             "qwen2_moe": dict(num_experts=n_experts, moe_intermediate_size=expert_ff, shared_expert_intermediate_size=0,
                               decoder_sparse_step=1, norm_topk_prob=False),
             "qwen3_moe": dict(num_experts=n_experts, moe_intermediate_size=expert_ff, decoder_sparse_step=1,
                               norm_topk_prob=True, head_dim=hidden // 4),
             "olmoe": dict(num_experts=n_experts, norm_topk_prob=False),
             "gpt_oss": dict(num_local_experts=n_experts, head_dim=hidden // 4,
                             layer_types=["sliding_attention", "full_attention"] * (n_layers // 2)
                             + ["sliding_attention"] * (n_layers % 2))}
    if family not in extra:
        raise FlashsimError(f"tiny MoE family {family!r}: choose one of {', '.join(extra)}")
    cfg = AutoConfig.for_model(family, **common, **extra[family])
    with torch.random.fork_rng(devices=[]):    # seeded without touching the caller's global RNG state
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        with torch.no_grad():               # router weights large enough that top-k is not a near-tie
            for name, p in model.named_parameters():
                if name.endswith(("mlp.gate.weight", "mlp.router.weight")):
                    p.normal_(0.0, 1.0)
    folder = Path(folder)
    model.save_pretrained(folder)
    return folder
