"""Published-baselines check: the simulator's dense decode against published end-to-end numbers.

`analysis/data/published_baselines.yaml` lists published decode speeds (tok/s at batch 1) of models
that fit in DRAM, each with its source and conditions. `recompute()` prices every row with the
simulator's own compute model (sim/components/compute.py ComputeModel, on the profile folded to its
achievable numbers in the row's power mode, devices/achievable.py): one decode token is every
layer's attention (weights + KV cache at the row's context), its dense FFN (all neurons, no gather)
and the lm_head, with the kernels of the runtime the row names (`runtime`: devices/runtimes/, e.g.
llama.cpp for llama.cpp and Ollama, compiled-graph for MLC, TensorRT and ExLlama) at the profile's
launch cost per kernel (compute.framework=kernels, a compiled decoder loop). Nothing here feeds the profiles: they derive from component measurements,
and this table checks them.

Each row carries its own error bound (`max_error`, default the project's 25%; a wider one says why in
`bound_reason`), and beside the simulated figure the row's peak-bound: a roofline on the datasheet
peaks of the row's power mode, counting only the bytes that must move per token (every layer's
weights and the lm_head at the stored width, the KV cache at the row's context; the embedding lookup
reads one row) and the FLOPs at the dtype's peak rate, with no launch overhead. No real run can beat
it; a published figure above it means a wrong input (`peak_bound_tokens_per_s`).

`row_inputs` names the achievable profile constants a row is priced with and their provenance: a
published constant must be a component measurement (`evidence: component`), never derived from an
end-to-end decode (the rows here are end-to-end decodes: one would be scored on itself).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from devices import load_model, load_profile
from devices.achievable import at_bound
from devices.errors import FlashsimError
from devices.runtime import DEFAULT_RUNTIME, load_runtime

DATA = Path(__file__).parent / "data" / "published_baselines.yaml"


@dataclass(frozen=True)
class BaselineRow:
    device: str              # a profile name, optionally NAME@MODE
    model: str               # a bundled model spec
    dtype: str               # the simulated weight dtype (int4 = 4.5 bits/weight, int8 = 8.5)
    context_tokens: int
    published_tokens_per_s: float
    framework: str
    runtime: str             # the bundled runtime (devices/runtimes/) that prices the framework's kernels
    conditions: str
    source: str
    max_error: float = 0.25  # this row's bound on |simulated / published - 1|
    bound_reason: str = ""   # why a bound wider than the 25% target (what the simulator does not model)


def load_rows(path: Path = DATA) -> list[BaselineRow]:
    """The table's rows (FlashsimError on a malformed file)."""
    try:
        data = yaml.safe_load(path.read_text())
        return [BaselineRow(**r) for r in data["rows"]]
    except (OSError, KeyError, TypeError, yaml.YAMLError) as e:
        raise FlashsimError(f"{path}: cannot read the published baselines ({e})") from None


def dense_decode_tokens_per_s(device: str, model: str, dtype: str, context_tokens: int,
                              bound: str = "achievable", runtime: str = DEFAULT_RUNTIME) -> float:
    """Decode tokens per second of `model` stored at `dtype`, all weights in DRAM, on `device`, with
    the kernels of `runtime` (devices/runtimes/)."""
    from sim.components.compute import ComputeModel

    spec = load_model(model, dtype=dtype)
    profile = at_bound(load_profile(device), bound)
    if spec.total_weight_bytes > profile.available_bytes:
        raise FlashsimError(f"{model} ({dtype}) does not fit in {device}'s DRAM: not a dense baseline")
    cm = ComputeModel(spec, profile, framework="kernels", decoder="native", runtime=load_runtime(runtime))
    one = np.ones(1)
    ctx = np.asarray([float(context_tokens)])
    layer = (cm.attention(one, ctx, ctx, np.asarray([True])).total_s()
             + cm.ffn(one, np.asarray([float(spec.d_ff)]), gathers=False).total_s())
    token_s = float(layer[0]) * spec.n_layers + float(cm.head(1, one).total_s()[0])
    return 1.0 / token_s


def bytes_that_must_move(spec: Any, context_tokens: int) -> int:
    """Bytes one decode token must read from DRAM at batch 1: every layer's weights (attention, FFN,
    norms), the final norm and the lm_head (the tied embedding matrix when tied) at the stored width,
    one embedding row, and the KV cache of `context_tokens` tokens."""
    per_layer = spec.attn_bytes_per_layer + spec.norm_bytes_per_layer + spec.ffn_bytes_per_layer
    head = int(spec.vocab_size * spec.d_model * spec.weight_bits / 8)       # the lm_head, tied or not
    row = int(spec.d_model * spec.weight_bits / 8)
    return spec.n_layers * per_layer + spec.final_norm_bytes + head + row + spec.kv_bytes_per_token * context_tokens


def peak_bound_tokens_per_s(device: str, model: str, dtype: str, context_tokens: int) -> float:
    """The roofline no run can beat (module docstring): 1 / max(bytes that must move / the datasheet
    DRAM bandwidth, FLOPs / the datasheet GEMV rate of the dtype), in the row's power mode."""
    spec = load_model(model, dtype=dtype)
    profile = load_profile(device)                       # raw: the fields the simulator reads hold the peaks
    bytes_s = bytes_that_must_move(spec, context_tokens) / profile.memory.bandwidth_bytes_per_s
    flops = sum(spec.flops_per_token(context_tokens).values())
    # a weight-only quantized GEMV computes in fp16: the faster of the two rates bounds it
    flops_s = flops / max(profile.compute.flops_per_s(dtype), profile.compute.flops_per_s("fp16"))
    return 1.0 / max(bytes_s, flops_s)


def row_inputs(device: str, dtype: str, *, flash: bool = False, compute: bool = True) -> list[tuple[str, Any]]:
    """(name, Provenance) of the achievable constants a row is priced with: the sustained DRAM
    bandwidth and the GEMV efficiency (compute), the achievable read table (flash)."""
    p = load_profile(device)
    out: list[tuple[str, Any]] = []
    if compute:
        if p.memory.sustained_bandwidth_source is not None:
            out.append(("memory.sustained_bandwidth_bytes_per_s", p.memory.sustained_bandwidth_source))
        if p.compute.gemv_efficiency_source is not None:
            out.append((f"compute.gemv_efficiency.{dtype}", p.compute.gemv_efficiency_source))
    if flash and p.flash.read_table_achievable_source is not None:
        out.append(("flash.read_table_achievable", p.flash.read_table_achievable_source))
    return out


def recompute(rows: list[BaselineRow] | None = None) -> list[dict[str, Any]]:
    """Every row with the simulator's figure, its error (simulated / published - 1), its own bound and
    whether it holds, and the peak-bound roofline."""
    out = []
    for r in rows if rows is not None else load_rows():
        sim = dense_decode_tokens_per_s(r.device, r.model, r.dtype, r.context_tokens, runtime=r.runtime)
        peak = peak_bound_tokens_per_s(r.device, r.model, r.dtype, r.context_tokens)
        err = sim / r.published_tokens_per_s - 1.0
        out.append({**r.__dict__, "simulated_tokens_per_s": sim, "peak_bound_tokens_per_s": peak,
                    "error": err, "within_bound": abs(err) <= r.max_error})
    return out
