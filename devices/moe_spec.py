"""MoESpec: the architecture numbers of a Mixture-of-Experts decoder that decide what is read per token.

A routed **expert** is one gated FFN (gate, up, down: 3 x d_model x d_expert_ff weights, plus biases in
gpt-oss); the router picks `top_k` of `n_experts` per token in each MoE layer, so only those experts'
bytes are needed for that token: an expert is the bundle a flash read fetches as one contiguous unit.
Everything else is **resident**: attention (full, sliding-window, linear Gated DeltaNet or DeepSeek's
MLA), the router, shared experts (always active), the dense FFNs of non-MoE layers, norms, embeddings
and the lm_head.

KV cache: full-attention and MLA layers grow by one entry per token (MLA caches the compressed
latent, kv_lora_rank + qk_rope_head_dim per layer); sliding-window layers stop growing at their
window; linear-attention layers hold a fixed recurrent state (`state_bytes`).

Built from any Hugging Face config.json (devices/moe_hf.py) or a bundled spec in
`devices/models/moe/*.yaml` (an HF config excerpt, its source and the published parameter totals).
"""

from __future__ import annotations

import json
import math
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from devices.errors import FlashsimError, unknown_name
from devices.loading import validate_file, validation_message
from devices.model_spec import DTYPE_BITS
from devices.moe_hf import is_moe_config, moe_fields, text_config
from devices.safe_load import parse_json, read_text_file

BUNDLED_MOE_DIR = Path(__file__).parent / "models" / "moe"

# Bits per stored weight: the dense table (devices/model_spec.py DTYPE_BITS: int4 = 4.5 bits, one fp16
# scale per 32 weights, as Q4_0 and MLX's 4-bit with group 64 and an fp16 scale + bias) plus MXFP4
# (4-bit e2m1 values with one 8-bit shared exponent per 32 weights: 4.25 bits; OCP Microscaling
# Formats (MX) v1.0 spec; gpt-oss ships its experts in it).
MOE_DTYPE_BITS: dict[str, float] = {**DTYPE_BITS, "mxfp4": 4.25}
LayerKind = Literal["full", "sliding", "linear", "mla"]
__all__ = ["MOE_DTYPE_BITS", "MoESpec", "is_moe_config", "list_moe_models", "load_moe_model",
           "moe_spec_from_hf_config"]


def _nbytes(params: int, dtype: str) -> int:
    if dtype not in MOE_DTYPE_BITS:
        raise FlashsimError(f"unknown dtype {dtype!r}; choose one of {', '.join(MOE_DTYPE_BITS)}")
    return int(math.ceil(params * MOE_DTYPE_BITS[dtype] / 8))


class MoESpec(BaseModel):
    """Architecture of a routed-expert decoder, validated; parameter counts and bytes as methods."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    family: str
    n_layers: int = Field(gt=0, le=1000)
    moe_layers: tuple[int, ...]
    n_experts: int = Field(gt=1, le=65536)
    top_k: int = Field(gt=0)
    n_shared_experts: int = Field(default=0, ge=0)
    d_model: int = Field(gt=0, le=1 << 17)
    d_expert_ff: int = Field(gt=0, le=1 << 18)
    d_shared_ff: int = Field(default=0, ge=0, description="intermediate size of ONE shared expert")
    d_dense_ff: int = Field(default=0, ge=0, description="intermediate size of the FFN of a non-MoE layer")
    expert_bias: bool = False
    router_bias: bool = False
    shared_expert_gate: bool = Field(default=False, description="Qwen's sigmoid gate (d_model -> 1) on the shared expert")
    n_heads: int = Field(gt=0)
    n_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    attn_qkv_bias: bool = False
    attn_out_bias: bool = False
    attn_output_gate: bool = Field(default=False, description="Qwen3-Next/3.5: q_proj also emits a per-head output gate")
    attn_sinks: bool = Field(default=False, description="gpt-oss: one learned sink logit per head")
    qk_norm: Literal["none", "head", "full"] = "none"
    layer_kinds: tuple[LayerKind, ...]
    sliding_window: int = Field(default=0, ge=0)
    linear_num_key_heads: int = Field(default=0, ge=0)
    linear_num_value_heads: int = Field(default=0, ge=0)
    linear_key_head_dim: int = Field(default=0, ge=0)
    linear_value_head_dim: int = Field(default=0, ge=0)
    linear_conv_kernel: int = Field(default=0, ge=0)
    q_lora_rank: int = Field(default=0, ge=0)
    kv_lora_rank: int = Field(default=0, ge=0)
    qk_nope_head_dim: int = Field(default=0, ge=0)
    qk_rope_head_dim: int = Field(default=0, ge=0)
    v_head_dim: int = Field(default=0, ge=0)
    vocab_size: int = Field(gt=0)
    tied_embeddings: bool = False
    dtype: str = Field(default="bf16", description="the precision the checkpoint stores its experts in")
    source: str = ""

    @model_validator(mode="after")
    def _check(self) -> MoESpec:
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k ({self.top_k}) exceeds n_experts ({self.n_experts})")
        if not self.moe_layers:
            raise ValueError("moe_layers is empty: a model without routed experts is not an MoE")
        if list(self.moe_layers) != sorted(set(self.moe_layers)) or not 0 <= self.moe_layers[0] \
                or self.moe_layers[-1] >= self.n_layers:
            raise ValueError(f"moe_layers must be distinct, increasing layer indices below n_layers ({self.n_layers})")
        if len(self.layer_kinds) != self.n_layers:
            raise ValueError(f"layer_kinds has {len(self.layer_kinds)} entries for {self.n_layers} layers")
        if self.n_layers > len(self.moe_layers) and not self.d_dense_ff:
            raise ValueError("d_dense_ff must be > 0: the model has layers without routed experts")
        if self.n_shared_experts and not self.d_shared_ff:
            raise ValueError("d_shared_ff must be > 0 when n_shared_experts > 0")
        if "linear" in self.layer_kinds and not (self.linear_num_value_heads and self.linear_value_head_dim):
            raise ValueError("linear-attention layers need linear_num_*_heads and linear_*_head_dim")
        if "mla" in self.layer_kinds and not (self.kv_lora_rank and self.v_head_dim):
            raise ValueError("MLA layers need kv_lora_rank, qk_*_head_dim and v_head_dim")
        if self.dtype not in MOE_DTYPE_BITS:
            raise ValueError(f"dtype {self.dtype!r}: choose one of {', '.join(MOE_DTYPE_BITS)}")
        return self

    # ---- experts -------------------------------------------------------------------------------
    @property
    def n_moe_layers(self) -> int:
        return len(self.moe_layers)

    @property
    def expert_params(self) -> int:
        """One routed expert: gate and up (d_model x d_expert_ff each) and down (d_expert_ff x d_model)."""
        bias = 2 * self.d_expert_ff + self.d_model if self.expert_bias else 0
        return 3 * self.d_model * self.d_expert_ff + bias

    def expert_bytes(self, dtype: str) -> int:
        """One routed expert's gate+up+down at `dtype`: the unit one flash read fetches."""
        return _nbytes(self.expert_params, dtype)

    def expert_read_bytes(self, dtype: str, align_bytes: int = 4096) -> int:
        """The expert's extent on flash, rounded up to the read alignment (direct I/O needs 4 KiB)."""
        return -(-self.expert_bytes(dtype) // align_bytes) * align_bytes

    @property
    def routed_params(self) -> int:
        return self.n_moe_layers * self.n_experts * self.expert_params

    # ---- resident parts -------------------------------------------------------------------------
    def attn_params(self, kind: str) -> int:
        """One layer's token mixer (projections, biases, per-head norms, sinks, convolution)."""
        d, h, hd, kv = self.d_model, self.n_heads, self.head_dim, self.n_kv_heads
        if kind == "linear":   # Gated DeltaNet: in_proj_qkv, in_proj_z, in_proj_a/b, conv1d, A_log, dt_bias, norm, out_proj
            kd = self.linear_num_key_heads * self.linear_key_head_dim
            vd = self.linear_num_value_heads * self.linear_value_head_dim
            nv = self.linear_num_value_heads
            return (d * (2 * kd + vd) + d * vd + 2 * d * nv + (2 * kd + vd) * self.linear_conv_kernel
                    + 2 * nv + self.linear_value_head_dim + vd * d)
        if kind == "mla":      # DeepSeek: low-rank q (optional), compressed kv latent + decoupled rope key
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            q = (d * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * h * qk) if self.q_lora_rank \
                else d * h * qk
            kv_a = d * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
            kv_b = self.kv_lora_rank * h * (self.qk_nope_head_dim + self.v_head_dim)
            return q + kv_a + kv_b + h * self.v_head_dim * d
        q_out = h * hd * (2 if self.attn_output_gate else 1)
        p = d * (q_out + 2 * kv * hd) + h * hd * d
        if self.attn_qkv_bias:
            p += q_out + 2 * kv * hd
        if self.attn_out_bias:
            p += d
        p += {"none": 0, "head": 2 * hd, "full": h * hd + kv * hd}[self.qk_norm]
        return p + (h if self.attn_sinks else 0)

    @property
    def router_params(self) -> int:
        return self.n_experts * self.d_model + (self.n_experts if self.router_bias else 0)

    @property
    def shared_params_per_layer(self) -> int:
        gate = self.d_model if self.shared_expert_gate else 0
        return self.n_shared_experts * 3 * self.d_model * self.d_shared_ff + gate

    @property
    def dense_ffn_params(self) -> int:
        return 3 * self.d_model * self.d_dense_ff

    @property
    def embedding_params(self) -> int:
        """Input embedding plus the lm_head (once when tied)."""
        return self.vocab_size * self.d_model * (1 if self.tied_embeddings else 2)

    @cached_property
    def resident_params(self) -> int:
        """Everything but the routed experts: attention, norms, routers, shared experts, dense FFNs,
        embeddings, the final norm."""
        moe = set(self.moe_layers)
        p = sum(self.attn_params(k) + 2 * self.d_model for k in self.layer_kinds)
        p += self.n_moe_layers * (self.router_params + self.shared_params_per_layer)
        p += (self.n_layers - self.n_moe_layers) * self.dense_ffn_params
        assert len(moe) == self.n_moe_layers
        return p + self.embedding_params + self.d_model

    def resident_bytes(self, dtype: str) -> int:
        return _nbytes(self.resident_params, dtype)

    @property
    def total_params(self) -> int:
        return self.resident_params + self.routed_params

    def total_bytes(self, dtype: str) -> int:
        return self.resident_bytes(dtype) + self.n_moe_layers * self.n_experts * self.expert_bytes(dtype)

    def active_params_per_token(self, counts: str = "lm_head") -> int:
        """Parameters one decode token computes with: everything resident and top_k experts per MoE
        layer. `counts` says which vocabulary matrices are in: "lm_head" (the default: a token reads
        one embedding row, not the table, but multiplies the whole lm_head), "all" (embedding table
        and lm_head, as Mistral and Qwen3 count), "non_embedding" (neither, as Qwen3-Next counts)."""
        active = self.resident_params + self.n_moe_layers * self.top_k * self.expert_params
        table = self.vocab_size * self.d_model
        lm_head = 0 if self.tied_embeddings else table
        drop = {"all": 0, "lm_head": self.embedding_params - lm_head if lm_head else 0,
                "non_embedding": self.embedding_params}
        if counts not in drop:
            raise FlashsimError(f"counts must be one of {', '.join(drop)}, got {counts!r}")
        return active - drop[counts]

    # ---- KV cache and recurrent state -----------------------------------------------------------
    def _kv_elems_per_layer(self, kind: str) -> int:
        if kind == "mla":
            return self.kv_lora_rank + self.qk_rope_head_dim
        if kind in ("full", "sliding"):
            return 2 * self.n_kv_heads * self.head_dim
        return 0

    def kv_bytes_per_token(self, dtype: str = "fp16") -> int:
        """What the cache grows by per token at long context: full-attention and MLA layers (sliding
        layers stop at their window, linear layers hold a fixed state; see `kv_bytes`)."""
        kinds = [k for k in self.layer_kinds if k in ("full", "mla") or (k == "sliding" and not self.sliding_window)]
        return _nbytes(sum(self._kv_elems_per_layer(k) for k in kinds), dtype)

    def state_bytes(self, dtype: str = "fp32") -> int:
        """Fixed per-sequence state of the linear-attention layers: the DeltaNet memory (value heads x
        key dim x value dim) and the convolution's last kernel-1 inputs."""
        n = sum(1 for k in self.layer_kinds if k == "linear")
        kd = self.linear_num_key_heads * self.linear_key_head_dim
        vd = self.linear_num_value_heads * self.linear_value_head_dim
        per = (self.linear_num_value_heads * self.linear_key_head_dim * self.linear_value_head_dim
               + (2 * kd + vd) * max(self.linear_conv_kernel - 1, 0))
        return _nbytes(n * per, dtype)

    def kv_bytes(self, context_tokens: int, dtype: str = "fp16") -> int:
        """KV cache plus recurrent state for one sequence of `context_tokens`."""
        slide = sum(self._kv_elems_per_layer(k) for k in self.layer_kinds if k == "sliding" and self.sliding_window)
        grow = self.kv_bytes_per_token(dtype) * context_tokens
        return grow + _nbytes(slide * min(context_tokens, self.sliding_window), dtype) + self.state_bytes()

    def summary(self, dtype: str | None = None) -> dict[str, Any]:
        """The flat view printed by `flashsim models show` for an MoE (bytes at `dtype`)."""
        dt = dtype or self.dtype
        kinds = {k: self.layer_kinds.count(k) for k in ("full", "sliding", "linear", "mla") if k in self.layer_kinds}
        return {
            "name": self.name, "family": self.family, "dtype": dt, "n_layers": self.n_layers,
            "n_moe_layers": self.n_moe_layers, "first_moe_layer": self.moe_layers[0],
            "layer_kinds": kinds, "n_experts": self.n_experts, "top_k": self.top_k,
            "n_shared_experts": self.n_shared_experts, "d_model": self.d_model, "d_expert_ff": self.d_expert_ff,
            "d_shared_ff": self.d_shared_ff, "d_dense_ff": self.d_dense_ff,
            "total_params": self.total_params, "active_params_per_token": self.active_params_per_token(),
            "expert_params": self.expert_params,
            "expert_bytes": {k: self.expert_bytes(k) for k in ("bf16", "int8", "int4", "mxfp4")},
            "expert_bytes_at_dtype": self.expert_bytes(dt),
            "routed_bytes": self.n_moe_layers * self.n_experts * self.expert_bytes(dt),
            "resident_bytes": self.resident_bytes(dt), "total_bytes": self.total_bytes(dt),
            "active_expert_bytes_per_token": self.n_moe_layers * self.top_k * self.expert_bytes(dt),
            "kv_bytes_per_token_fp16": self.kv_bytes_per_token("fp16"),
            "state_bytes_fp32": self.state_bytes(), "source": self.source,
        }


# ---- construction and lookup ----------------------------------------------------------------------
def moe_spec_from_hf_config(config: dict[str, Any], name: str, source: str = "") -> MoESpec:
    """An MoESpec from a config.json mapping; FlashsimError names the missing or bad field."""
    fields = moe_fields(config)
    try:
        return MoESpec.model_validate({**fields, "name": name, "source": source})
    except ValidationError as e:
        raise FlashsimError(f"config.json: {validation_message(e)}") from None


class BundledMoE(BaseModel):
    """A bundled spec file: the HF config excerpt, its source, and the published parameter totals."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    source: str
    dtype: str = "bf16"
    published_total_params: float = Field(gt=0)
    published_active_params: float = Field(gt=0)
    published_source: str
    published_active_counts: Literal["all", "lm_head", "non_embedding"] = Field(
        description="which vocabulary matrices the publisher's active figure includes")
    published_digit_params: float = Field(gt=0, description="the last digit the publisher printed "
                                          "(1e9 for '3B', 1e8 for '3.3B'): half of it is the rounding")
    config: dict[str, Any]


def list_moe_models() -> list[str]:
    return sorted(p.stem for p in BUNDLED_MOE_DIR.glob("*.yaml"))


def bundled_moe_entry(name: str) -> BundledMoE:
    path = BUNDLED_MOE_DIR / f"{name}.yaml"
    if not path.is_file():
        raise unknown_name("MoE model", name, list_moe_models())
    return validate_file(BundledMoE, path)


def load_moe_model(name_or_path: str | Path) -> MoESpec:
    """A bundled MoE spec by name, or a local HF model folder / config.json path."""
    p = Path(name_or_path)
    if p.is_dir():
        p = p / "config.json"
        if not p.is_file():
            raise FlashsimError(f"{p.parent}: no config.json in this folder; give a Hugging Face model folder")
    if p.is_file() and p.suffix == ".json":
        config = parse_json(read_text_file(p, "config.json"), str(p))   # duplicate keys refused
        if not isinstance(config, dict):
            raise FlashsimError(f"{p}: expected a JSON object")
        name = p.parent.name or p.stem
        try:
            return moe_spec_from_hf_config(config, name=name, source=str(p))
        except FlashsimError as e:
            raise FlashsimError(f"{p}: {str(e).removeprefix('config.json: ')}") from None
    if str(name_or_path) not in list_moe_models() and (p.suffix in (".json", ".yaml") or "/" in str(name_or_path)):
        raise FlashsimError(f"{p}: no such model folder or file")
    entry = bundled_moe_entry(str(name_or_path))
    try:
        spec = moe_spec_from_hf_config(entry.config, name=entry.name, source=entry.source)
    except FlashsimError as e:
        raise FlashsimError(f"{BUNDLED_MOE_DIR / (entry.name + '.yaml')}: {str(e).removeprefix('config.json: ')}") \
            from None
    return spec.model_copy(update={"dtype": entry.dtype})


def is_moe_model(name_or_path: str | Path) -> bool:
    """True for a bundled MoE name or a folder / config.json whose config is an MoE."""
    p = Path(name_or_path)
    if not p.exists():
        return str(name_or_path) in list_moe_models()
    cfg = p / "config.json" if p.is_dir() else p
    if not (cfg.is_file() and cfg.suffix == ".json"):
        return False
    try:
        data = json.loads(cfg.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return isinstance(data, dict) and is_moe_config(text_config(data))
