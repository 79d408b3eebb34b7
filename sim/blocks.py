"""Transformer blocks as units of pruning (RAP): names, the dropped-set syntax, and their bytes.

A model with L layers has 2L blocks. Block index 2*l + k is layer l's self-attention ("mha", k=0,
including its input norm) or its FFN ("ffn", k=1, including its norm and biases); names are "mha:l" and
"ffn:l", as real/studies/gsi.py writes them. A dropped set is a bool array [2L] (True = dropped).

`BlockMemory` splits a `ModelSpec`'s weight and KV bytes by block, with every weight resident (RAP's
setting: no flash streaming). The split is exact: with nothing dropped the block sums equal the spec's
totals (non_ffn_bytes + ffn_bytes_total; kv_bytes_per_token), because the per-block numbers are
differences of the spec's own rounded sizes. Units: bytes (int); KV per token = one cached token of one
sequence.

How a layer's small tensors are split: attention projections (+ biases) and the first
ceil(norms_per_layer / 2) norms belong to "mha"; the FFN bundles, FFN biases and the remaining norms
belong to "ffn". With one norm per layer (phi, falcon's parallel blocks) the shared norm counts under
"mha". Embeddings, an untied lm_head and the final norm are `always_bytes`: never dropped.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from devices.errors import FlashsimError
from devices.model_spec import DTYPE_BITS, ModelSpec

KINDS = ("mha", "ffn")

_ITEM = re.compile(r"^(mha|ffn):(\d+)$")


def block_names(n_layers: int) -> tuple[str, ...]:
    """("mha:0", "ffn:0", "mha:1", "ffn:1", ...): 2 * n_layers names in block-index order."""
    return tuple(f"{kind}:{layer}" for layer in range(n_layers) for kind in KINDS)


def block_index(kind: str, layer: int) -> int:
    """Index of block `kind:layer` in a [2L] array."""
    return 2 * layer + KINDS.index(kind)


def parse_block_items(text: str, where: str = "blocks") -> list[tuple[str, int]]:
    """The syntax alone: 'mha:3,ffn:5' -> [("mha", 3), ("ffn", 5)] ('' -> []); FlashsimError naming the
    bad item. Layers are not range-checked (the model is not known here); see parse_blocks."""
    items: list[tuple[str, int]] = []
    text = (text or "").strip()
    if not text:
        return items
    seen: set[tuple[str, int]] = set()
    for raw in text.split(","):
        item = raw.strip()
        m = _ITEM.match(item)
        if not m:
            raise FlashsimError(
                f"{where}: bad block {item!r}; write KIND:LAYER items separated by commas, KIND one of "
                f"{'/'.join(KINDS)} and LAYER a layer number from 0 (e.g. mha:3,ffn:5)")
        key = (m.group(1), int(m.group(2)))
        if key in seen:
            raise FlashsimError(f"{where}: block {item!r} is listed twice; list each block once")
        seen.add(key)
        items.append(key)
    return items


def parse_blocks(text: str, n_layers: int, where: str = "blocks") -> np.ndarray:
    """'mha:3,ffn:5' -> bool [2L] dropped mask ('' or whitespace -> nothing dropped).

    Items are separated by commas (spaces around them are ignored). Raises FlashsimError naming `where`,
    the bad item and the valid range for an unknown kind, a layer outside 0..n_layers-1, or an item
    listed twice.
    """
    if n_layers <= 0:
        raise ValueError(f"n_layers must be positive, got {n_layers}")
    dropped = np.zeros(2 * n_layers, bool)
    try:
        items = parse_block_items(text, where)
    except FlashsimError as e:
        raise FlashsimError(str(e).replace("a layer number from 0", f"0..{n_layers - 1}")) from None
    for kind, layer in items:
        if layer >= n_layers:
            raise FlashsimError(
                f"{where}: bad block '{kind}:{layer}': layer {layer} is out of range; the model has "
                f"{n_layers} layers (0..{n_layers - 1})")
        dropped[block_index(kind, layer)] = True
    return dropped


def format_blocks(dropped: np.ndarray) -> str:
    """Inverse of parse_blocks: 'mha:3,ffn:5' in block-index order ('' when nothing is dropped)."""
    d = np.asarray(dropped)
    if d.ndim != 1 or d.size % 2 or d.dtype != bool:
        raise ValueError(f"dropped must be a bool array of even length 2L, got {d.dtype} shape {d.shape}")
    names = block_names(d.size // 2)
    return ",".join(names[i] for i in np.flatnonzero(d))


def _nbytes(params: int, bits: float) -> int:
    # the same rounding as devices.model_spec: whole bytes, rounded up
    return int(math.ceil(params * bits / 8))


def _check_mask(dropped: np.ndarray, n_blocks: int) -> np.ndarray:
    d = np.asarray(dropped)
    if d.shape != (n_blocks,) or d.dtype != bool:
        raise ValueError(f"dropped must be a bool array of shape ({n_blocks},), got {d.dtype} shape {d.shape}")
    return d


@dataclass(frozen=True, eq=False)  # eq=False: numpy arrays have no boolean ==
class BlockMemory:
    """Bytes of a model's blocks, all weights resident (RAP's setting)."""

    names: tuple[str, ...]
    weight_bytes: np.ndarray            # int64 [2L]: resident weights of each block
    kv_bytes_per_token: np.ndarray      # int64 [2L]: KV bytes per cached token (mha blocks; 0 for ffn)
    always_bytes: int                   # embeddings, lm_head (if untied), final norm: never dropped

    @property
    def n_layers(self) -> int:
        return len(self.names) // 2

    @classmethod
    def from_spec(cls, spec: ModelSpec) -> BlockMemory:
        L = spec.n_layers
        bits = spec.weight_bits
        per_norm = spec.d_model * (2 if spec.norm_kind == "layernorm" else 1)
        mha_norm_bytes = _nbytes(((spec.norms_per_layer + 1) // 2) * per_norm, bits)
        ffn_small_bytes = spec.norm_bytes_per_layer - mha_norm_bytes  # remaining norms + FFN biases
        weight = np.empty(2 * L, np.int64)
        weight[0::2] = spec.attn_bytes_per_layer + mha_norm_bytes
        weight[1::2] = spec.ffn_bytes_per_layer + ffn_small_bytes
        # KV: layer l's share is the difference of the cumulative rounded sizes, so the sum is exactly
        # spec.kv_bytes_per_token even for fractional-bit KV dtypes.
        kv_bits = DTYPE_BITS[spec.kv_dtype]
        cum = np.array([_nbytes(2 * layer * spec.kv_dim, kv_bits) for layer in range(L + 1)], np.int64)
        kv = np.zeros(2 * L, np.int64)
        kv[0::2] = np.diff(cum)
        always = spec.embedding_bytes + spec.lm_head_bytes + spec.final_norm_bytes
        weight.setflags(write=False)
        kv.setflags(write=False)
        return cls(names=block_names(L), weight_bytes=weight, kv_bytes_per_token=kv, always_bytes=int(always))

    def weights_bytes(self, dropped: np.ndarray) -> int:
        """Resident weights with `dropped` removed (always_bytes included)."""
        d = _check_mask(dropped, len(self.names))
        return int(self.always_bytes + self.weight_bytes[~d].sum())

    def kv_bytes(self, dropped: np.ndarray, kv_tokens: int) -> int:
        """KV cache of the kept MHA blocks for `kv_tokens` cached entries over all sequences."""
        d = _check_mask(dropped, len(self.names))
        if kv_tokens < 0:
            raise ValueError(f"kv_tokens must be >= 0, got {kv_tokens}")
        return int(kv_tokens) * int(self.kv_bytes_per_token[~d].sum())

    def footprint_bytes(self, dropped: np.ndarray, kv_tokens: int) -> int:
        """Weights + KV with `dropped` removed."""
        return self.weights_bytes(dropped) + self.kv_bytes(dropped, kv_tokens)

    def full_need_bytes(self, kv_tokens: int) -> int:
        """Weights + KV with nothing dropped."""
        return self.footprint_bytes(np.zeros(len(self.names), bool), kv_tokens)
