"""ModelSpec: hand-computed sizes, HF config parsing for every family, bundled specs, errors."""

from __future__ import annotations

import json

import pytest

from devices import FlashsimError, list_models, load_model
from devices.model_spec import ModelSpec

# Published parameter counts (model cards / papers), to 0.5%.
PUBLISHED_PARAMS = {
    "opt-6.7b": 6.66e9, "falcon-7b": 6.92e9, "llama-2-7b": 6.74e9, "llama-3-8b": 8.03e9,
    "llama-3.2-1b": 1.24e9, "llama-3.2-3b": 3.21e9, "mistral-7b": 7.24e9, "qwen2.5-3b": 3.09e9,
    "smollm2-135m": 134.5e6,
}


def test_every_issue_model_is_bundled() -> None:
    assert set(PUBLISHED_PARAMS) <= set(list_models())


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_bundled_spec_matches_published_parameter_count(name: str) -> None:
    spec = load_model(name)
    assert spec.source, "every bundled spec cites its source"
    assert spec.total_params == pytest.approx(PUBLISHED_PARAMS[name], rel=5e-3)


def test_opt_6_7b_fp16_hand_computed() -> None:
    s = load_model("opt-6.7b")
    assert s.ffn_kind == "relu" and s.ffn_matrices == 2
    assert s.ffn_neuron_bytes == 2 * 4096 * 2 == 16 * 1024      # up row + down column, fp16
    assert s.ffn_row_bytes == 4096 * 2
    assert s.ffn_bytes_per_layer == 16384 * 16 * 1024
    assert s.ffn_bytes_total == 32 * 16384 * 16 * 1024          # 8 GiB
    assert s.kv_bytes_per_token == 2 * 32 * 4096 * 2            # K and V, all layers, fp16
    assert s.lm_head_bytes == 0                                  # tied
    assert s.embedding_bytes == (50272 + 2050) * 4096 * 2        # tokens + learned positions


def test_llama_2_7b_swiglu_bundle_and_flops() -> None:
    s = load_model("llama-2-7b")
    assert s.ffn_neuron_bytes == 3 * 4096 * 2                    # gate row + up row + down column
    assert s.attn_bytes_per_layer == 4 * 4096 * 4096 * 2
    assert s.lm_head_bytes == 32000 * 4096 * 2
    f = s.flops_per_token(context_tokens=100)
    assert f["ffn"] == 2 * 32 * 11008 * 3 * 4096
    assert f["attention_scores"] == 2 * 32 * 2 * 4096 * 100
    assert s.total_weight_bytes == s.non_ffn_bytes + s.ffn_bytes_total


def test_gqa_kv_bytes() -> None:
    s = load_model("llama-3-8b")
    assert s.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2


def test_dtype_changes_bytes_not_shape() -> None:
    fp16, fp32, int4 = (load_model("smollm2-135m", dtype=d) for d in ("fp16", "fp32", "int4"))
    assert fp32.ffn_neuron_bytes == 2 * fp16.ffn_neuron_bytes == 3 * 576 * 4
    assert int4.ffn_neuron_bytes == pytest.approx(3 * 576 * 4.5 / 8, abs=1)   # Q4_0: 4.5 bits/weight
    assert int4.dtype_bytes == 4.5 / 8
    assert fp32.kv_bytes_per_token == fp16.kv_bytes_per_token                 # KV dtype is separate


FAMILY_CONFIGS = {
    "llama": ({"model_type": "llama", "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
               "hidden_act": "silu", "tie_word_embeddings": False}, "swiglu", 3),
    "mistral": ({"model_type": "mistral", "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2,
                 "num_attention_heads": 4, "num_key_value_heads": 1, "vocab_size": 100}, "swiglu", 3),
    "qwen2": ({"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
               "tie_word_embeddings": True}, "swiglu", 3),
    "opt": ({"model_type": "opt", "hidden_size": 64, "ffn_dim": 256, "num_hidden_layers": 2,
             "num_attention_heads": 4, "vocab_size": 100, "max_position_embeddings": 32,
             "activation_function": "relu"}, "relu", 2),
    "falcon": ({"model_type": "falcon", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "vocab_size": 100, "multi_query": True}, "gelu", 2),
    "gpt2": ({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 100,
              "n_positions": 32}, "gelu", 2),
    "phi": ({"model_type": "phi", "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2,
             "num_attention_heads": 4, "vocab_size": 100, "hidden_act": "gelu_new"}, "gelu", 2),
    "phi3": ({"model_type": "phi3", "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2,
              "num_attention_heads": 4, "vocab_size": 100, "hidden_act": "silu"}, "swiglu", 3),
}


@pytest.mark.parametrize("family", sorted(FAMILY_CONFIGS))
def test_hf_config_every_family(family: str, tmp_path) -> None:
    cfg, kind, mats = FAMILY_CONFIGS[family]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    s = load_model(tmp_path)
    assert s.ffn_kind == kind and s.ffn_matrices == mats
    assert s.d_model == 64 and s.n_layers == 2
    assert s.ffn_neuron_bytes == mats * 64 * 2


def test_falcon_multi_query_and_gpt2_learned_positions(tmp_path) -> None:
    falcon = ModelSpec.from_hf_config(FAMILY_CONFIGS["falcon"][0], name="f")
    assert falcon.n_kv_heads == 1 and falcon.d_ff == 4 * 64
    gpt2 = ModelSpec.from_hf_config(FAMILY_CONFIGS["gpt2"][0], name="g")
    assert gpt2.learned_positions == 32 and gpt2.ffn_bias and gpt2.tied_embeddings


def test_unknown_model_suggests_close_names() -> None:
    with pytest.raises(FlashsimError, match=r"unknown model 'llama-2-7' ; did you mean|did you mean 'llama-2-7b'"):
        load_model("llama-2-7")


def test_bad_config_names_file_and_key(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    with pytest.raises(FlashsimError, match=r"config.json: missing key 'num_attention_heads'"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    with pytest.raises(FlashsimError, match="model_type 'mamba' is not supported"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(FlashsimError, match="invalid JSON at line 1"):
        load_model(tmp_path)


def test_negative_dimension_rejected(tmp_path) -> None:
    cfg = dict(FAMILY_CONFIGS["llama"][0], hidden_size=-64)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FlashsimError, match="d_model"):
        load_model(tmp_path)


def test_unknown_key_in_bundled_style_file(tmp_path) -> None:
    p = tmp_path / "x.yaml"
    p.write_text("name: x\nsource: s\nconfig: {model_type: llama}\nextra_key: 1\n")
    with pytest.raises(FlashsimError, match=r"x.yaml: field 'extra_key': unknown key"):
        load_model(p)
