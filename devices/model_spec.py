"""ModelSpec: the architecture numbers that decide a model's bytes, FLOPs and KV cache.

Built from any Hugging Face `config.json` (llama, mistral, qwen2/qwen3, gemma, phi, phi3, opt, falcon,
gpt2 families) or from a bundled spec in `devices/models/*.yaml` (an HF config excerpt plus the
source of its numbers). Derived sizes are bytes at the spec's weight dtype; the KV cache uses its own
dtype (fp16 by default, as llama.cpp and HF do).

Vocabulary: an FFN **neuron** i is row i of the up projection, column i of the down projection and,
in gated FFNs (SwiGLU/GeGLU), row i of the gate projection. Its **bundle** is all of them together:
the unit one flash read fetches under row-column bundling.
"""

from __future__ import annotations

import math
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from devices.errors import FlashsimError, unknown_name
from devices.limits import MAX_PARAMS, check_field
from devices.loading import validate_file, validation_message
from devices.safe_load import parse_json, read_text_file
from devices.suggest import hint, looks_like_path

BUNDLED_DIR = Path(__file__).parent / "models"

# Bits per stored weight. int8/int4 include one fp16 scale per block of 32 weights, as llama.cpp's
# Q8_0 (8.5 bits/weight) and Q4_0 (4.5 bits/weight) do (ggml quantization formats, ggml/src/ggml-common.h).
DTYPE_BITS: dict[str, float] = {"fp32": 32, "fp16": 16, "bf16": 16, "int8": 8.5, "int4": 4.5}

FfnKind = Literal["relu", "gelu", "swiglu", "geglu"]


def _nbytes(params: int, bits: float) -> int:
    return int(math.ceil(params * bits / 8))


class ModelSpec(BaseModel):
    """Architecture of a decoder-only transformer, validated; derived sizes as properties."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    family: str
    n_layers: int = Field(gt=0)
    d_model: int = Field(gt=0)
    d_ff: int = Field(gt=0)
    n_heads: int = Field(gt=0)
    n_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    ffn_kind: FfnKind
    ffn_bias: bool = False
    attn_qkv_bias: bool = False
    attn_out_bias: bool = False
    norm_kind: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    norms_per_layer: int = Field(default=2, ge=0)
    tied_embeddings: bool = False
    learned_positions: int = Field(default=0, ge=0, description="rows of a learned position table")
    dtype: Literal["fp32", "fp16", "bf16", "int8", "int4"] = "fp16"
    kv_dtype: Literal["fp32", "fp16", "bf16", "int8"] = "fp16"
    source: str = ""

    @field_validator("*")
    @classmethod
    def _physical_range(cls, v: object, info: ValidationInfo) -> object:
        """Every number within its physical range (devices/limits.py FIELD_LIMITS)."""
        return check_field("ModelSpec", str(info.field_name), v)

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if self.total_params > MAX_PARAMS:
            raise ValueError(f"{self.total_params:,} parameters is above the limit of {MAX_PARAMS:,} (no model has "
                             "10^14 parameters: the largest published have ~2x10^12)")
        return self

    def with_dtype(self, dtype: str) -> ModelSpec:
        """The same architecture stored at another weight dtype."""
        if dtype not in DTYPE_BITS:
            raise FlashsimError(f"unknown dtype {dtype!r}; {hint(dtype, DTYPE_BITS, 'choose one of')}")
        return self.model_copy(update={"dtype": dtype})

    # ---- per-element sizes -------------------------------------------------------------------
    @property
    def weight_bits(self) -> float:
        return DTYPE_BITS[self.dtype]

    @property
    def dtype_bytes(self) -> float:
        """Bytes per stored weight (fractional for the block-quantized int8/int4)."""
        return self.weight_bits / 8

    @property
    def gated(self) -> bool:
        return self.ffn_kind in ("swiglu", "geglu")

    @property
    def ffn_matrices(self) -> int:
        """Matrices one neuron touches: up+down, plus gate when gated."""
        return 3 if self.gated else 2

    # ---- FFN -----------------------------------------------------------------------------------
    @property
    def ffn_neuron_params(self) -> int:
        """Parameters of one neuron's bundle: its row/column in each FFN matrix."""
        return self.ffn_matrices * self.d_model

    @property
    def ffn_row_bytes(self) -> int:
        """One neuron's row (or column) in ONE matrix: the read unit without bundling."""
        return _nbytes(self.d_model, self.weight_bits)

    @property
    def ffn_neuron_bytes(self) -> int:
        """One neuron's bundle (all its rows and columns): the read unit with bundling."""
        return _nbytes(self.ffn_neuron_params, self.weight_bits)

    @property
    def ffn_bytes_per_layer(self) -> int:
        """The streamable FFN weights of one layer: d_ff bundles (biases are counted as resident)."""
        return self.d_ff * self.ffn_neuron_bytes

    @property
    def ffn_bytes_total(self) -> int:
        return self.n_layers * self.ffn_bytes_per_layer

    @property
    def ffn_bias_params_per_layer(self) -> int:
        """One scalar per neuron per input matrix plus the down bias: tiny, so kept resident, never
        inside a 4 KiB-aligned bundle."""
        return (self.d_ff * (self.ffn_matrices - 1) + self.d_model) if self.ffn_bias else 0

    # ---- attention, norms, embeddings --------------------------------------------------------
    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def attn_params_per_layer(self) -> int:
        p = self.d_model * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.d_model
        if self.attn_qkv_bias:
            p += self.q_dim + 2 * self.kv_dim
        if self.attn_out_bias:
            p += self.d_model
        return p

    @property
    def attn_bytes_per_layer(self) -> int:
        return _nbytes(self.attn_params_per_layer, self.weight_bits)

    @property
    def norm_params_per_layer(self) -> int:
        per_norm = self.d_model * (2 if self.norm_kind == "layernorm" else 1)
        return self.norms_per_layer * per_norm

    @property
    def norm_bytes_per_layer(self) -> int:
        """Norm weights plus FFN biases: the small per-layer tensors that always stay resident."""
        return _nbytes(self.norm_params_per_layer + self.ffn_bias_params_per_layer, self.weight_bits)

    @property
    def embedding_bytes(self) -> int:
        return _nbytes((self.vocab_size + self.learned_positions) * self.d_model, self.weight_bits)

    @property
    def lm_head_bytes(self) -> int:
        """0 when tied to the embedding (the same bytes serve both)."""
        return 0 if self.tied_embeddings else _nbytes(self.vocab_size * self.d_model, self.weight_bits)

    @property
    def final_norm_bytes(self) -> int:
        return _nbytes(self.d_model * (2 if self.norm_kind == "layernorm" else 1), self.weight_bits)

    @property
    def non_ffn_bytes(self) -> int:
        """Everything but the FFNs: what flash-streaming policies keep resident by default."""
        per_layer = self.attn_bytes_per_layer + self.norm_bytes_per_layer
        return self.n_layers * per_layer + self.embedding_bytes + self.lm_head_bytes + self.final_norm_bytes

    @property
    def total_weight_bytes(self) -> int:
        return self.non_ffn_bytes + self.ffn_bytes_total

    @cached_property
    def total_params(self) -> int:
        per_layer = (self.attn_params_per_layer + self.norm_params_per_layer
                     + self.d_ff * self.ffn_neuron_params + self.ffn_bias_params_per_layer)
        emb = (self.vocab_size + self.learned_positions) * self.d_model
        head = 0 if self.tied_embeddings else self.vocab_size * self.d_model
        final = self.d_model * (2 if self.norm_kind == "layernorm" else 1)
        return self.n_layers * per_layer + emb + head + final

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token across all layers, at kv_dtype."""
        return _nbytes(2 * self.n_layers * self.kv_dim, DTYPE_BITS[self.kv_dtype])

    # ---- FLOPs ---------------------------------------------------------------------------------
    def flops_per_token(self, context_tokens: int = 0) -> dict[str, float]:
        """FLOPs of one decode token by component (2 per multiply-add), attending over `context_tokens`."""
        L = self.n_layers
        return {
            "attention_proj": 2.0 * L * self.attn_params_per_layer,
            "attention_scores": 2.0 * L * 2 * self.q_dim * max(context_tokens, 0),
            "ffn": 2.0 * L * self.d_ff * self.ffn_matrices * self.d_model,
            "lm_head": 2.0 * self.vocab_size * self.d_model,
        }

    def summary(self) -> dict[str, Any]:
        """The flat view printed by `flashsim models show` (bytes at this spec's dtype)."""
        return {
            "name": self.name,
            "family": self.family,
            "n_layers": self.n_layers,
            "d_model": self.d_model,
            "d_ff": self.d_ff,
            "n_heads": self.n_heads,
            "n_kv_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "ffn_kind": self.ffn_kind,
            "tied_embeddings": self.tied_embeddings,
            "dtype": self.dtype,
            "dtype_bytes": self.dtype_bytes,
            "total_params": self.total_params,
            "ffn_row_bytes": self.ffn_row_bytes,
            "ffn_neuron_bytes": self.ffn_neuron_bytes,
            "ffn_bytes_per_layer": self.ffn_bytes_per_layer,
            "ffn_bytes_total": self.ffn_bytes_total,
            "attn_bytes_per_layer": self.attn_bytes_per_layer,
            "embedding_bytes": self.embedding_bytes,
            "lm_head_bytes": self.lm_head_bytes,
            "non_ffn_bytes": self.non_ffn_bytes,
            "total_weight_bytes": self.total_weight_bytes,
            "kv_dtype": self.kv_dtype,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "flops_per_token": self.flops_per_token(0),
            "source": self.source,
        }

    # ---- construction ----------------------------------------------------------------------------
    @classmethod
    def from_hf_config(cls, config: dict[str, Any], name: str, source: str = "") -> ModelSpec:
        """Build from a Hugging Face config.json mapping; FlashsimError names a missing key."""
        return cls.model_validate({**_from_hf(config, name), "name": name, "source": source})


def _act_kind(act: str, gated: bool) -> FfnKind:
    act = (act or "").lower()
    if act in ("relu", "relu2"):
        return "relu" if not gated else "swiglu"  # a gated ReLU is still 3 matrices
    if act.startswith("gelu"):
        return "geglu" if gated else "gelu"
    if act in ("silu", "swish"):
        return "swiglu" if gated else "gelu"  # ungated SiLU: 2 matrices, like GELU
    raise ValueError(f"unsupported activation {act!r}")


def _need(config: dict[str, Any], *keys: str) -> Any:
    for k in keys:
        if config.get(k) is not None:
            return _whole(config, k)
    raise FlashsimError(f"config.json: missing key {' / '.join(repr(k) for k in keys)}")


def _given(config: dict[str, Any], key: str, default: Any) -> Any:
    """`key` when the config gives it (0 included: the range check refuses it), else `default`;
    only an absent or null key falls back (`x or default` would turn a 0 into the default)."""
    return default if config.get(key) is None else _whole(config, key)


def _whole(config: dict[str, Any], key: str) -> int:
    v = config[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise FlashsimError(f"config.json: {key!r} is {v!r}; expected a whole number")
    return v


def _from_hf(c: dict[str, Any], name: str) -> dict[str, Any]:
    mt = str(c.get("model_type", "")).lower()
    if mt in ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "mixtral", "phi3", "smollm3", "olmo2"):
        d = _need(c, "hidden_size")
        heads = _need(c, "num_attention_heads")
        act = c.get("hidden_act") or c.get("hidden_activation") or "silu"
        out = dict(
            family=mt, n_layers=_need(c, "num_hidden_layers"), d_model=d,
            d_ff=_need(c, "intermediate_size"), n_heads=heads,
            n_kv_heads=_given(c, "num_key_value_heads", heads),
            head_dim=_given(c, "head_dim", d // heads), vocab_size=_need(c, "vocab_size"),
            ffn_kind=_act_kind(act, gated=True), ffn_bias=bool(c.get("mlp_bias", False)),
            attn_qkv_bias=bool(c.get("attention_bias", mt == "qwen2")),
            attn_out_bias=bool(c.get("attention_bias", False)),
            tied_embeddings=bool(c.get("tie_word_embeddings", mt in ("gemma", "gemma2"))),
        )
        return out
    if mt == "phi":
        d = _need(c, "hidden_size")
        heads = _need(c, "num_attention_heads")
        return dict(
            family=mt, n_layers=_need(c, "num_hidden_layers"), d_model=d,
            d_ff=_need(c, "intermediate_size"), n_heads=heads,
            n_kv_heads=_given(c, "num_key_value_heads", heads), head_dim=d // heads,
            vocab_size=_need(c, "vocab_size"), ffn_kind=_act_kind(c.get("hidden_act", "gelu_new"), False),
            ffn_bias=True, attn_qkv_bias=True, attn_out_bias=True, norm_kind="layernorm",
            norms_per_layer=1, tied_embeddings=bool(c.get("tie_word_embeddings", False)),
        )
    if mt == "opt":
        d = _need(c, "hidden_size")
        heads = _need(c, "num_attention_heads")
        if c.get("word_embed_proj_dim", d) != d:
            raise FlashsimError("config.json: OPT with word_embed_proj_dim != hidden_size is not supported")
        bias = bool(c.get("enable_bias", True))
        return dict(
            family=mt, n_layers=_need(c, "num_hidden_layers"), d_model=d, d_ff=_need(c, "ffn_dim"),
            n_heads=heads, n_kv_heads=heads, head_dim=d // heads, vocab_size=_need(c, "vocab_size"),
            ffn_kind=_act_kind(c.get("activation_function", "relu"), False), ffn_bias=bias,
            attn_qkv_bias=bias, attn_out_bias=bias, norm_kind="layernorm",
            tied_embeddings=bool(c.get("tie_word_embeddings", True)),
            learned_positions=int(c.get("max_position_embeddings", 2048)) + 2,  # OPT offsets positions by 2
        )
    if mt in ("falcon", "refinedweb", "refinedwebmodel"):
        d = _need(c, "hidden_size")
        heads = _need(c, "num_attention_heads", "n_head")
        if c.get("new_decoder_architecture"):
            kv = _given(c, "num_kv_heads", heads)
        else:
            kv = 1 if c.get("multi_query", True) else heads
        bias = bool(c.get("bias", False))
        return dict(
            family="falcon", n_layers=_need(c, "num_hidden_layers", "n_layer"), d_model=d,
            d_ff=_given(c, "ffn_hidden_size", 4 * d), n_heads=heads, n_kv_heads=kv, head_dim=d // heads,
            vocab_size=_need(c, "vocab_size"), ffn_kind=_act_kind(c.get("activation", "gelu"), False),
            ffn_bias=bias, attn_qkv_bias=bias, attn_out_bias=bias, norm_kind="layernorm",
            norms_per_layer=1 if c.get("parallel_attn", True) and not c.get("new_decoder_architecture") else 2,
            tied_embeddings=bool(c.get("tie_word_embeddings", True)),
        )
    if mt == "gpt2":
        d = _need(c, "n_embd", "hidden_size")
        heads = _need(c, "n_head", "num_attention_heads")
        return dict(
            family=mt, n_layers=_need(c, "n_layer", "num_hidden_layers"), d_model=d,
            d_ff=_given(c, "n_inner", 4 * d), n_heads=heads, n_kv_heads=heads, head_dim=d // heads,
            vocab_size=_need(c, "vocab_size"), ffn_kind=_act_kind(c.get("activation_function", "gelu_new"), False),
            ffn_bias=True, attn_qkv_bias=True, attn_out_bias=True, norm_kind="layernorm",
            tied_embeddings=bool(c.get("tie_word_embeddings", True)),
            learned_positions=int(c.get("n_positions", 1024)),
        )
    raise FlashsimError(
        f"config.json: model_type {mt or '(missing)'!r} is not supported; supported: llama, mistral, "
        "qwen2, qwen3, gemma, phi, phi3, opt, falcon, gpt2"
    )


# ---- lookup ------------------------------------------------------------------------------------------
class _BundledSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    source: str
    config: dict[str, Any]


def list_models() -> list[str]:
    """Names of the bundled specs, sorted."""
    return sorted(p.stem for p in BUNDLED_DIR.glob("*.yaml"))


def load_model(name_or_path: str | Path, dtype: str | None = None) -> ModelSpec:
    """A bundled spec by name, or a local HF model folder / config.json / spec YAML by path."""
    p = Path(name_or_path)
    if p.is_dir():
        cfg = p / "config.json"
        if not cfg.is_file():
            raise FlashsimError(f"{p}: no config.json in this folder; give a Hugging Face model folder")
        spec = _from_config_file(cfg, name=p.name)
    elif p.is_file() and p.suffix == ".json":
        spec = _from_config_file(p, name=p.parent.name or p.stem)
    elif p.is_file() and p.suffix in (".yaml", ".yml"):
        spec = _from_bundled_file(p)
    elif (BUNDLED_DIR / f"{name_or_path}.yaml").is_file():
        spec = _from_bundled_file(BUNDLED_DIR / f"{name_or_path}.yaml")
    elif looks_like_path(str(name_or_path)):
        raise FlashsimError(f"{p}: no such model folder or file")
    else:
        raise unknown_name("model", str(name_or_path), list_models())
    return spec.with_dtype(dtype) if dtype else spec


def _from_config_file(path: Path, name: str) -> ModelSpec:
    cfg = parse_json(read_text_file(path, "config.json"), str(path))
    if not isinstance(cfg, dict):
        raise FlashsimError(f"{path}: expected a JSON object (a Hugging Face config), got {type(cfg).__name__}")
    try:
        return ModelSpec.from_hf_config(cfg, name=name, source=f"{path}")
    except FlashsimError as e:
        raise FlashsimError(f"{path}: {str(e).removeprefix('config.json: ')}") from None
    except ValueError as e:  # pydantic ValidationError is a ValueError
        raise FlashsimError(f"{path}: {_first_line(e)}") from None


def _from_bundled_file(path: Path) -> ModelSpec:
    entry = validate_file(_BundledSpec, path)
    try:
        return ModelSpec.from_hf_config(entry.config, name=entry.name, source=entry.source)
    except FlashsimError as e:
        raise FlashsimError(f"{path}: {str(e).removeprefix('config.json: ')}") from None
    except ValueError as e:
        raise FlashsimError(f"{path}: {_first_line(e)}") from None


def _first_line(e: Exception) -> str:
    if isinstance(e, ValidationError):
        return validation_message(e)
    return str(e).splitlines()[0]
