"""Hugging Face config.json -> the fields of an MoESpec (devices/moe_spec.py), per model family.

Each family names its experts differently: Mixtral `num_local_experts` + `intermediate_size`; Qwen2/3-MoE,
Qwen3-Next and Qwen3.5/3.6 `num_experts` + `moe_intermediate_size` (+ `shared_expert_intermediate_size`,
`decoder_sparse_step`, `mlp_only_layers`); DeepSeek-V2/V3 `n_routed_experts` + `n_shared_experts` +
`first_k_dense_replace` (+ MLA's `kv_lora_rank`, `q_lora_rank`); OLMoE `num_experts` +
`intermediate_size`; gpt-oss `num_local_experts` + `intermediate_size` (biased experts, sliding layers).
Multimodal checkpoints (Qwen3.5/3.6) nest the text model under `text_config`: it is read from there.
"""

from __future__ import annotations

from typing import Any

from devices.errors import FlashsimError

MOE_MODEL_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "qwen3_next", "qwen3_5_moe", "qwen3_5_moe_text",
                   "deepseek_v2", "deepseek_v3", "olmoe", "gpt_oss")
_EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's config: `text_config` when the checkpoint nests it, else the config itself."""
    inner = config.get("text_config")
    if isinstance(inner, dict) and inner:
        return {**{k: v for k, v in config.items() if k != "text_config"}, **inner}
    return config


def is_moe_config(config: dict[str, Any]) -> bool:
    """True for a config.json of a routed-expert model (a known MoE family, or more than one expert)."""
    c = text_config(config)
    if str(c.get("model_type", "")).lower() in MOE_MODEL_TYPES:
        return True
    return any(isinstance(c.get(k), int) and c[k] > 1 for k in _EXPERT_COUNT_KEYS)


def _need(c: dict[str, Any], *keys: str) -> Any:
    for k in keys:
        if c.get(k) is not None:
            return c[k]
    raise FlashsimError(f"config.json: missing key {' / '.join(repr(k) for k in keys)}")


def _layer_kinds(c: dict[str, Any], n_layers: int, default: str) -> tuple[str, ...]:
    """Per-layer token mixer: 'full', 'sliding', 'linear' (Gated DeltaNet) or 'mla'."""
    names = {"full_attention": "full", "sliding_attention": "sliding", "linear_attention": "linear"}
    types = c.get("layer_types")
    if isinstance(types, list) and types:
        if len(types) != n_layers:
            raise FlashsimError(f"config.json: layer_types has {len(types)} entries, num_hidden_layers is {n_layers}")
        out = []
        for i, t in enumerate(types):
            if t not in names:
                raise FlashsimError(f"config.json: layer_types[{i}] = {t!r}; expected one of {', '.join(names)}")
            out.append(names[t])
        return tuple(out)
    interval = c.get("full_attention_interval")
    if interval:
        return tuple("full" if i % interval == interval - 1 else "linear" for i in range(n_layers))
    return (default,) * n_layers


def _sparse_layers(c: dict[str, Any], n_layers: int) -> tuple[int, ...]:
    """Qwen's rule: layer i is MoE unless listed in mlp_only_layers, and (i + 1) % decoder_sparse_step == 0."""
    step = int(c.get("decoder_sparse_step") or 1)
    dense = set(c.get("mlp_only_layers") or [])
    return tuple(i for i in range(n_layers) if i not in dense and (i + 1) % step == 0)


def moe_fields(config: dict[str, Any]) -> dict[str, Any]:
    """The MoESpec fields (all but name and source) of a config.json mapping; FlashsimError names a key."""
    c = text_config(config)
    mt = str(c.get("model_type", "")).lower()
    if mt not in MOE_MODEL_TYPES:
        raise FlashsimError(f"config.json: model_type {mt or '(missing)'!r} is not a supported MoE family; "
                            f"supported: {', '.join(MOE_MODEL_TYPES)}")
    d = int(_need(c, "hidden_size"))
    L = int(_need(c, "num_hidden_layers"))
    heads = int(_need(c, "num_attention_heads"))
    common: dict[str, Any] = dict(
        family=mt.removesuffix("_text"), n_layers=L, d_model=d, n_heads=heads,
        n_kv_heads=int(c.get("num_key_value_heads") or heads),
        head_dim=int(c.get("head_dim") or d // heads), vocab_size=int(_need(c, "vocab_size")),
        tied_embeddings=bool(c.get("tie_word_embeddings", False)),
        top_k=int(_need(c, "num_experts_per_tok", "experts_per_token")),
    )
    if mt == "mixtral":
        return {**common, "n_experts": int(_need(c, "num_local_experts")),
                "d_expert_ff": int(_need(c, "intermediate_size")), "moe_layers": tuple(range(L)),
                "layer_kinds": ("full",) * L}
    if mt in ("qwen2_moe", "qwen3_moe", "qwen3_next", "qwen3_5_moe", "qwen3_5_moe_text"):
        shared_ff = int(c.get("shared_expert_intermediate_size") or 0)
        hybrid = mt != "qwen2_moe" and mt != "qwen3_moe"
        out = {**common, "n_experts": int(_need(c, "num_experts")),
               "d_expert_ff": int(_need(c, "moe_intermediate_size")),
               "moe_layers": _sparse_layers(c, L),
               "d_dense_ff": int(c.get("intermediate_size") or 0),
               "n_shared_experts": 1 if shared_ff else 0, "d_shared_ff": shared_ff,
               "shared_expert_gate": bool(shared_ff),
               "attn_qkv_bias": mt == "qwen2_moe" or bool(c.get("attention_bias", False)),
               "qk_norm": "none" if mt == "qwen2_moe" else "head",
               "layer_kinds": _layer_kinds(c, L, "full") if hybrid else ("full",) * L}
        if hybrid:
            out.update(attn_output_gate=bool(c.get("attn_output_gate", True)),
                       linear_num_key_heads=int(_need(c, "linear_num_key_heads")),
                       linear_num_value_heads=int(_need(c, "linear_num_value_heads")),
                       linear_key_head_dim=int(_need(c, "linear_key_head_dim")),
                       linear_value_head_dim=int(_need(c, "linear_value_head_dim")),
                       linear_conv_kernel=int(c.get("linear_conv_kernel_dim") or 4))
            if not any(k == "full" for k in out["layer_kinds"]) and "layer_types" not in c \
                    and "full_attention_interval" not in c:
                raise FlashsimError("config.json: missing key 'layer_types' / 'full_attention_interval'")
        return out
    if mt in ("deepseek_v2", "deepseek_v3"):
        first_dense = int(c.get("first_k_dense_replace") or 0)
        freq = int(c.get("moe_layer_freq") or 1)
        q_lora = c.get("q_lora_rank")
        return {**common, "n_experts": int(_need(c, "n_routed_experts")),
                "d_expert_ff": int(_need(c, "moe_intermediate_size")),
                "moe_layers": tuple(i for i in range(L) if i >= first_dense and i % freq == 0),
                "d_dense_ff": int(_need(c, "intermediate_size")),
                "n_shared_experts": int(c.get("n_shared_experts") or 0),
                "d_shared_ff": int(_need(c, "moe_intermediate_size")) if c.get("n_shared_experts") else 0,
                "router_bias": mt == "deepseek_v3",
                "layer_kinds": ("mla",) * L, "n_kv_heads": heads,
                "q_lora_rank": int(q_lora or 0), "kv_lora_rank": int(_need(c, "kv_lora_rank")),
                "qk_nope_head_dim": int(_need(c, "qk_nope_head_dim")),
                "qk_rope_head_dim": int(_need(c, "qk_rope_head_dim")),
                "v_head_dim": int(_need(c, "v_head_dim")), "head_dim": int(_need(c, "v_head_dim"))}
    if mt == "olmoe":
        return {**common, "n_experts": int(_need(c, "num_experts")),
                "d_expert_ff": int(_need(c, "intermediate_size")), "moe_layers": tuple(range(L)),
                "qk_norm": "full", "attn_qkv_bias": bool(c.get("attention_bias", False)),
                "layer_kinds": ("full",) * L}
    # gpt_oss: biased experts and attention, one learned sink logit per head, sliding/full alternation
    return {**common, "n_experts": int(_need(c, "num_local_experts")),
            "d_expert_ff": int(_need(c, "intermediate_size")), "moe_layers": tuple(range(L)),
            "expert_bias": True, "router_bias": True, "attn_qkv_bias": bool(c.get("attention_bias", True)),
            "attn_out_bias": bool(c.get("attention_bias", True)), "attn_sinks": True,
            "sliding_window": int(c.get("sliding_window") or 0),
            "layer_kinds": _layer_kinds(c, L, "full")}
