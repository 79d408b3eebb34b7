"""Quantization quality measured on a real model: int8 / int4 block quantize-dequantize of every weight
matrix, alone and combined with oracle top-k FFN sparsity (issue 46, item 2).

Owns: the quantizers (`quantize_q8_0`, `quantize_q4_0`: llama.cpp's Q8_0 / Q4_0 reference rules), the
context managers that swap a model's matrices for their quantize-dequantized copies (`quantized_weights`)
and keep only the top-k FFN neurons per token (`OracleTopK`), and the measurement (`measure_quality`:
perplexity, next-token agreement with the native model and activation mass kept, per configuration).

Quantizers (ggml/src/ggml-quants.c, `quantize_row_q8_0_ref` / `quantize_row_q4_0_ref`), per group of
GROUP = 32 consecutive weights along a matrix's input dimension (the contiguous dimension of a GGUF
tensor, the last one of a torch weight), one fp16 scale d per group:
* Q8_0: amax = max |x|; d = amax / 127; q = roundf(x / d) (half away from zero), in [-127, 127];
  x' = q * fp16(d).
* Q4_0 (symmetric 4-bit): m = the signed value of largest |x| (the first one on ties); d = m / -8;
  q = min(15, trunc(x / d + 8.5)) in [0, 15]; x' = (q - 8) * fp16(d). So m maps exactly to -8 * d and
  the levels are -8d..7d.
A group of zeros has d = 0 and dequantizes to zeros. A last partial group (input dimension not a
multiple of 32) is quantized on its own, as if padded with zeros (zeros do not change max |x|).

Which tensors: every 2-D weight of an `nn.Linear` or `nn.Embedding` (attention and FFN projections, the
token embedding and the lm_head; tied weights once), as the simulator's `quantized` precision counts every
weight byte at 8.5 / 4.5 bits. Norm weights and biases stay as they are (llama.cpp keeps them F32).

Oracle top-k (the sparse policies with an exact predictor): a forward pre-hook on every FFN's output
projection keeps, per token, the round(keep * N) neurons of largest |a| (a = act(gate(x)) * up(x)) and
zeroes the rest, i.e. the FFN computes only those neurons. keep = 1 leaves the FFN alone. Activation
mass kept = sum over layers and tokens of the kept |a| / sum of all |a| (the simulator's proxy, here on
the real activations).

Measurement: one teacher-forced pass (no KV cache) over the evaluation token ids per configuration;
perplexity = exp(mean next-token cross-entropy), agreement = fraction of positions whose argmax equals
the native model's argmax at that position (the native model: the weights as loaded, no sparsity).
Deterministic: no randomness; the same weights and tokens give the same numbers.

torch is imported inside the functions, so importing this module is cheap.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from devices.errors import FlashsimError

GROUP = 32                 # weights per scale (llama.cpp QK8_0 = QK4_0 = 32)
BITS = (8, 4)              # Q8_0, Q4_0
FORMAT = {8: "Q8_0", 4: "Q4_0"}
DEFAULT_KEEPS = (1.0, 0.9, 0.75, 0.5, 0.3, 0.2, 0.1)
DEFAULT_MAX_TOKENS = 512


# ---- quantizers ----------------------------------------------------------------------------------------
def _groups(w: Any) -> tuple[Any, int]:
    """(w as fp32 [rows, n_groups, GROUP] zero-padded, the unpadded last-dimension length)."""
    import torch

    x = w.detach().to(torch.float32)
    n = x.shape[-1]
    x = x.reshape(-1, n)
    pad = (-n) % GROUP
    if pad:
        x = torch.nn.functional.pad(x, (0, pad))
    return x.reshape(x.shape[0], -1, GROUP), n


def _ungroup(g: Any, n: int, like: Any) -> Any:
    return g.reshape(g.shape[0], -1)[:, :n].reshape(like.shape).to(like.dtype)


def _fp16(d: Any) -> Any:
    import torch

    return d.to(torch.float16).to(torch.float32)


def quantize_q8_0(w: Any) -> Any:
    """Q8_0 quantize-dequantize of a weight tensor (groups of 32 along the last dimension)."""
    import torch

    g, n = _groups(w)
    d = g.abs().amax(dim=-1, keepdim=True) / 127.0
    inv = torch.where(d > 0, 1.0 / torch.where(d > 0, d, 1.0), 0.0)
    v = g * inv
    q = torch.sign(v) * torch.floor(v.abs() + 0.5)        # C roundf: half away from zero
    return _ungroup(q * _fp16(d), n, w)


def quantize_q4_0(w: Any) -> Any:
    """Q4_0 quantize-dequantize of a weight tensor (groups of 32 along the last dimension)."""
    import torch

    g, n = _groups(w)
    idx = g.abs().argmax(dim=-1, keepdim=True)            # the first of equal maxima, as the C loop
    m = torch.gather(g, -1, idx)
    d = m / -8.0
    inv = torch.where(d != 0, 1.0 / torch.where(d != 0, d, 1.0), 0.0)
    q = torch.clamp(torch.trunc(g * inv + 8.5), 0, 15)    # C: MIN(15, (int8_t)(x0 + 8.5f))
    return _ungroup((q - 8.0) * _fp16(d), n, w)


def quantize_dequantize(w: Any, bits: int) -> Any:
    if bits == 8:
        return quantize_q8_0(w)
    if bits == 4:
        return quantize_q4_0(w)
    raise FlashsimError(f"bits {bits}: expected 8 (Q8_0) or 4 (Q4_0)")


def weight_matrices(model: Any) -> list[tuple[str, Any]]:
    """(name, parameter) of every 2-D weight of an nn.Linear / nn.Embedding, each tensor once."""
    import torch

    seen: set[int] = set()
    out = []
    for name, mod in model.named_modules():
        if isinstance(mod, (torch.nn.Linear, torch.nn.Embedding)):
            p = mod.weight
            if p.dim() == 2 and id(p) not in seen:
                seen.add(id(p))
                out.append((f"{name}.weight", p))
    return out


@contextlib.contextmanager
def quantized_weights(model: Any, bits: int | None) -> Iterator[int]:
    """Within the context every weight matrix holds its quantize-dequantize copy (bits 8 or 4; None:
    unchanged). Yields the number of weights quantized. The originals are restored on exit, also when
    the body raises."""
    import torch

    if bits is None:
        yield 0
        return
    if bits not in BITS:
        raise FlashsimError(f"bits {bits}: expected 8 (Q8_0) or 4 (Q4_0)")
    saved: list[tuple[Any, Any]] = []
    try:
        with torch.no_grad():
            for _, p in weight_matrices(model):
                saved.append((p, p.data.clone()))
                p.data.copy_(quantize_dequantize(p.data, bits))
        yield sum(p.numel() for p, _ in saved)
    finally:
        with torch.no_grad():
            for p, orig in saved:
                p.data.copy_(orig)


class OracleTopK:
    """Context manager: every FFN computes only its round(keep * N) neurons of largest |a| per token;
    accumulates the activation mass kept (`kept_abs` / `total_abs`, sums over layers and tokens)."""

    def __init__(self, model: Any, keep: float):
        from traces.capture.hooks import ffn_input_modules

        if not (0 < keep <= 1):
            raise FlashsimError(f"keep {keep}: must be in (0, 1]")
        self.modules = ffn_input_modules(model)
        self.keep = keep
        self.kept_abs = 0.0
        self.total_abs = 0.0
        self._handles: list[Any] = []

    def _pre_hook(self, _module: Any, args: tuple) -> tuple | None:
        import torch

        a = args[0]
        mag = a.detach().abs().float()
        n = a.shape[-1]
        k = max(1, int(round(self.keep * n)))
        self.total_abs += float(mag.sum(dtype=torch.float64))
        if k >= n:
            self.kept_abs += float(mag.sum(dtype=torch.float64))
            return None
        top = torch.topk(mag, k, dim=-1, sorted=False)
        self.kept_abs += float(top.values.sum(dtype=torch.float64))
        mask = torch.zeros_like(a).scatter_(-1, top.indices, 1.0)
        return (a * mask,) + tuple(args[1:])

    @property
    def mass_kept(self) -> float:
        return self.kept_abs / self.total_abs if self.total_abs > 0 else math.nan

    def __enter__(self) -> OracleTopK:
        self._handles = [m.register_forward_pre_hook(self._pre_hook) for m in self.modules]
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


# ---- measurement ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    """One measured configuration: weight precision (None = native) and FFN neurons kept per token."""

    bits: int | None
    keep: float = 1.0

    @property
    def precision(self) -> str:
        return "native" if self.bits is None else f"int{self.bits}"

    @property
    def label(self) -> str:
        p = "native" if self.bits is None else f"int{self.bits} ({FORMAT[self.bits]})"
        return p if self.keep >= 1 else f"{p} + oracle top-{self.keep:g} FFN"


def default_configs(bits: Sequence[int] = BITS, keeps: Sequence[float] = DEFAULT_KEEPS) -> list[Config]:
    """Native first, then every (precision, keep) pair; precisions in the order native, 8, 4."""
    check_settings(bits, keeps)
    out = [Config(None, 1.0)]
    for b in (None, *bits):
        for k in keeps:
            if not (b is None and k >= 1):
                out.append(Config(b, k))
    return out


def check_settings(bits: Sequence[int], keeps: Sequence[float]) -> None:
    for b in bits:
        if b not in BITS:
            raise FlashsimError(f"--bits {b}: each value must be 8 (Q8_0) or 4 (Q4_0)")
    if not keeps:
        raise FlashsimError("--keep: give at least one fraction")
    for k in keeps:
        if not (math.isfinite(k) and 0 < k <= 1):
            raise FlashsimError(f"--keep {k}: each value must be in (0, 1] (share of FFN neurons kept per token)")


def _logits(model: Any, input_ids: Any) -> Any:
    import torch

    with torch.inference_mode():
        return model(input_ids=input_ids, use_cache=False).logits[0].float()


def _nll(logits: Any, input_ids: Any) -> float:
    import torch

    return float(torch.nn.functional.cross_entropy(logits[:-1], input_ids[0, 1:], reduction="mean"))


def _ppl(nll: float) -> float:
    return math.exp(nll) if math.isfinite(nll) and nll < 700 else math.inf


def measure_quality(model: Any, input_ids: Any, configs: Sequence[Config],
                    progress: Callable[[dict], None] | None = None) -> list[dict[str, Any]]:
    """One row per configuration (same order): precision, bits, keep, ppl, ppl_ratio (to native),
    nll_delta (nats per token), agreement (argmax equal to the native model's), mass_kept, seconds.
    `input_ids`: int64 [1, T], T >= 2. The native reference is measured first (not listed unless asked)."""
    if int(input_ids.shape[-1]) < 2:
        raise FlashsimError(f"evaluation text has {int(input_ids.shape[-1])} token(s); perplexity needs at least 2")
    ref = _logits(model, input_ids)
    ref_argmax = ref[:-1].argmax(-1)
    ref_nll = _nll(ref, input_ids)
    rows: list[dict[str, Any] | None] = [None] * len(configs)
    order = list(dict.fromkeys(c.bits for c in configs))   # quantize once per precision
    for bits in order:
        with quantized_weights(model, bits) as n_q:
            for i, c in enumerate(configs):
                if c.bits != bits:
                    continue
                t0 = time.perf_counter()
                if c.keep < 1:
                    with OracleTopK(model, c.keep) as ora:
                        logits = _logits(model, input_ids)
                    mass = ora.mass_kept
                else:
                    logits = _logits(model, input_ids)
                    mass = 1.0
                nll = _nll(logits, input_ids)
                agree = float((logits[:-1].argmax(-1) == ref_argmax).float().mean())
                row = {"label": c.label, "precision": c.precision, "bits": c.bits,
                       "format": FORMAT[c.bits] if c.bits else "native", "keep": c.keep,
                       "ppl": _ppl(nll), "ppl_ratio": _ppl(nll - ref_nll), "nll_delta": nll - ref_nll,
                       "agreement": agree, "mass_kept": mass, "weights_quantized": n_q,
                       "seconds": round(time.perf_counter() - t0, 3)}
                rows[i] = row
                if progress:
                    progress(row)
    return [r for r in rows if r is not None]


__all__ = ["BITS", "Config", "DEFAULT_KEEPS", "DEFAULT_MAX_TOKENS", "FORMAT", "GROUP", "OracleTopK",
           "check_settings", "default_configs", "measure_quality", "quantize_dequantize", "quantize_q4_0",
           "quantize_q8_0", "quantized_weights", "weight_matrices"]
