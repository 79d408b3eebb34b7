"""Fixtures for the real backend: tiny model shapes and stores written into tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest

from devices.model_spec import ModelSpec
from real.weights.convert import write_shape_store
from real.weights.store import WeightStore, open_store


def tiny_spec(d_model: int = 128, d_ff: int = 256, n_layers: int = 2, ffn_kind: str = "swiglu",
              ffn_bias: bool = False) -> ModelSpec:
    return ModelSpec(name="tiny", family="llama", n_layers=n_layers, d_model=d_model, d_ff=d_ff, n_heads=4,
                     n_kv_heads=2, head_dim=d_model // 4, vocab_size=100, ffn_kind=ffn_kind, ffn_bias=ffn_bias)


@pytest.fixture
def spec() -> ModelSpec:
    return tiny_spec()


@pytest.fixture
def make_store(tmp_path: Path):
    """make_store(name, spec=tiny, **write_shape_store kwargs) -> opened WeightStore."""

    def make(name: str = "store", spec: ModelSpec | None = None, **kw) -> WeightStore:
        kw.setdefault("seed", 7)
        kw.setdefault("dtype", "fp32")
        path = write_shape_store(spec or tiny_spec(), tmp_path / name, **kw)
        return open_store(path, verify="full")

    return make


def tiny_llama(n_layers: int, d_ff: int = 64, std: float = 0.2, seed: int = 0):  # type: ignore[no-untyped-def]
    """A random-weight LlamaForCausalLM (vocab 64, d_model 32, 4 heads, 2 KV heads) with its matrices
    redrawn from N(0, std): larger than the default init, so dropping a block or a neuron matters."""
    import torch
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=d_ff, num_hidden_layers=n_layers,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, std)
    return model


TINY_WORDS = [f"w{i}" for i in range(60)]   # the word-level vocabulary of save_tiny_llama_folder


def save_tiny_llama_folder(folder: Path, model) -> Path:  # type: ignore[no-untyped-def]
    """Save `model` (tiny_llama) with a word-level tokenizer over TINY_WORDS as a local Hugging Face
    folder, as the CLI verbs that take --model FOLDER load it."""
    import transformers
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    tok = Tokenizer(WordLevel({"<unk>": 0, **{w: i + 1 for i, w in enumerate(TINY_WORDS)}}, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(folder)
    model.save_pretrained(folder)
    return folder
