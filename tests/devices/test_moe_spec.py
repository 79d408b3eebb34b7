"""MoESpec: bundled specs against published parameter totals, hand-computed expert bytes, every family's
config.json, errors, and `flashsim models show` for an MoE."""

from __future__ import annotations

import json

import pytest

from devices.errors import FlashsimError
from devices.moe_spec import (
    bundled_moe_entry,
    is_moe_config,
    is_moe_model,
    list_moe_models,
    load_moe_model,
    moe_spec_from_hf_config,
)

ISSUE_MODELS = {"mixtral-8x7b", "qwen3-30b-a3b", "qwen3.5-35b-a3b", "qwen3.6-35b-a3b", "qwen3.5-397b-a17b",
                "deepseek-v3", "olmoe-1b-7b", "gpt-oss-20b", "gpt-oss-120b", "qwen3-coder-next"}


def test_every_issue_model_is_bundled() -> None:
    assert ISSUE_MODELS <= set(list_moe_models())


@pytest.mark.parametrize("name", sorted(ISSUE_MODELS))
def test_bundled_totals_match_published(name: str) -> None:
    """Total parameters within 1.5% (published totals carry 3-4 digits); active parameters within the
    publisher's rounding (half its last printed digit) or 3%, counted the publisher's way."""
    spec, entry = load_moe_model(name), bundled_moe_entry(name)
    assert spec.source and entry.published_source
    assert spec.total_params == pytest.approx(entry.published_total_params, rel=0.015)
    active = spec.active_params_per_token(entry.published_active_counts)
    tol = max(0.03, 0.5 * entry.published_digit_params / entry.published_active_params)
    assert active == pytest.approx(entry.published_active_params, rel=tol)


def test_mixtral_expert_bytes_hand_computed() -> None:
    s = load_moe_model("mixtral-8x7b")
    assert s.expert_params == 3 * 4096 * 14336
    assert s.expert_bytes("bf16") == 3 * 4096 * 14336 * 2
    assert s.expert_bytes("int4") == 3 * 4096 * 14336 * 9 // 16         # 4.5 bits per weight
    assert s.expert_read_bytes("int4") % 4096 == 0 and s.expert_read_bytes("int4") >= s.expert_bytes("int4")
    assert s.kv_bytes_per_token("fp16") == 32 * 2 * 8 * 128 * 2
    assert s.moe_layers == tuple(range(32)) and s.n_shared_experts == 0


def test_deepseek_v3_mla_kv_and_dense_layers() -> None:
    s = load_moe_model("deepseek-v3")
    assert s.moe_layers[0] == 3 and s.n_moe_layers == 58          # first_k_dense_replace = 3
    assert s.kv_bytes_per_token("fp16") == 61 * (512 + 64) * 2     # compressed latent + rope key
    assert s.n_shared_experts == 1 and s.d_shared_ff == 2048


def test_qwen35_hybrid_layers_and_shared_expert() -> None:
    s = load_moe_model("qwen3.5-397b-a17b")
    assert s.layer_kinds.count("linear") == 45 and s.layer_kinds[3] == "full"
    assert s.kv_bytes_per_token("fp16") == 15 * 2 * 2 * 256 * 2     # only the 15 full-attention layers
    assert s.state_bytes() == 45 * (64 * 128 * 128 + (2 * 2048 + 8192) * 3) * 4
    assert s.expert_bytes("bf16") == 3 * 4096 * 1024 * 2


def test_gpt_oss_sliding_layers_do_not_grow_kv() -> None:
    s = load_moe_model("gpt-oss-20b")
    assert s.kv_bytes_per_token("fp16") == 12 * 2 * 8 * 64 * 2
    assert s.kv_bytes(1000) - s.kv_bytes(500) == 500 * s.kv_bytes_per_token("fp16")
    assert s.expert_bytes("mxfp4") == int((3 * 2880 * 2880 + 2 * 2880 + 2880) * 4.25 / 8 + 0.999)


def test_qwen2_moe_sparse_step_and_dense_layers() -> None:
    cfg = {"model_type": "qwen2_moe", "hidden_size": 64, "intermediate_size": 256, "moe_intermediate_size": 32,
           "shared_expert_intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
           "vocab_size": 100, "num_experts": 8, "num_experts_per_tok": 2, "decoder_sparse_step": 2,
           "mlp_only_layers": []}
    s = moe_spec_from_hf_config(cfg, "tiny")
    assert s.moe_layers == (1, 3) and s.d_dense_ff == 256 and s.attn_qkv_bias
    per_layer_attn = 4 * 64 * 64 + 3 * 64
    expected = (4 * (per_layer_attn + 128) + 2 * (8 * 64 + 3 * 64 * 128 + 64) + 2 * 3 * 64 * 256
                + 2 * 100 * 64 + 64 + 2 * 8 * 3 * 64 * 32)
    assert s.total_params == expected


def test_is_moe_config_and_nested_text_config() -> None:
    assert is_moe_config({"model_type": "mixtral"})
    assert is_moe_config({"model_type": "qwen3_5_moe", "text_config": {"model_type": "qwen3_5_moe_text"}})
    assert not is_moe_config({"model_type": "llama", "hidden_size": 8})


def test_missing_key_names_the_field(tmp_path) -> None:
    cfg = {"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "vocab_size": 10, "num_experts": 4, "num_experts_per_tok": 2}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FlashsimError, match="moe_intermediate_size"):
        load_moe_model(tmp_path)
    cfg["moe_intermediate_size"] = 16
    cfg["num_experts_per_tok"] = 9
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FlashsimError, match="top_k"):
        load_moe_model(tmp_path)


def test_unknown_name_suggests() -> None:
    with pytest.raises(FlashsimError, match="did you mean"):
        load_moe_model("qwen3-30b-a3")


def test_models_show_cli_json_for_hf_folder(tmp_path, capsys) -> None:
    from flashsim.main import main

    cfg = bundled_moe_entry("qwen3-30b-a3b").config
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert is_moe_model(tmp_path)
    assert main(["models", "show", str(tmp_path), "--dtype", "int4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n_experts"] == 128 and out["expert_bytes_at_dtype"] == int(3 * 2048 * 768 * 4.5 / 8)
    assert main(["models", "show", "deepseek-v3"]) == 0
    assert "58 with routed experts" in capsys.readouterr().out


def test_deepseek_v2_lite_without_q_lora() -> None:
    """DeepSeek-V2-Lite's config (q_lora_rank null: a full q projection; 2 shared experts, first layer dense):
    15.7B total and 2.4B active parameters (DeepSeek-AI, 'DeepSeek-V2', arXiv 2405.04434, the Lite model)."""
    cfg = {"model_type": "deepseek_v2", "hidden_size": 2048, "intermediate_size": 10944, "moe_intermediate_size": 1408,
           "num_hidden_layers": 27, "first_k_dense_replace": 1, "moe_layer_freq": 1, "num_attention_heads": 16,
           "num_key_value_heads": 16, "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6,
           "q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
           "v_head_dim": 128, "vocab_size": 102400, "tie_word_embeddings": False}
    s = moe_spec_from_hf_config(cfg, "deepseek-v2-lite")
    assert s.q_lora_rank == 0 and s.n_shared_experts == 2 and s.moe_layers[0] == 1
    assert s.total_params == pytest.approx(15.7e9, rel=0.01)
    assert s.active_params_per_token("lm_head") == pytest.approx(2.4e9, rel=0.05)
    assert s.kv_bytes_per_token("fp16") == 27 * (512 + 64) * 2
