"""Published-baselines check: the simulator's dense decode against published end-to-end numbers.

`analysis/data/published_baselines.yaml` lists published decode speeds (tok/s at batch 1) of models
that fit in DRAM, each with its source and conditions. `recompute()` prices every row with the
simulator's own compute model (sim/components/compute.py ComputeModel, on the profile folded to its
achievable numbers in the row's power mode, devices/achievable.py): one decode token is every
layer's attention (weights + KV cache at the row's context), its dense FFN (all neurons, no gather)
and the lm_head, with the profile's launch overhead per kernel (compute.framework=kernels, a
compiled decoder loop). Nothing here feeds the profiles: they derive from component measurements,
and this table checks them.
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

DATA = Path(__file__).parent / "data" / "published_baselines.yaml"


@dataclass(frozen=True)
class BaselineRow:
    device: str              # a profile name, optionally NAME@MODE
    model: str               # a bundled model spec
    dtype: str               # the simulated weight dtype (int4 = 4.5 bits/weight, int8 = 8.5)
    context_tokens: int
    published_tokens_per_s: float
    framework: str
    conditions: str
    source: str


def load_rows(path: Path = DATA) -> list[BaselineRow]:
    """The table's rows (FlashsimError on a malformed file)."""
    try:
        data = yaml.safe_load(path.read_text())
        return [BaselineRow(**r) for r in data["rows"]]
    except (OSError, KeyError, TypeError, yaml.YAMLError) as e:
        raise FlashsimError(f"{path}: cannot read the published baselines ({e})") from None


def dense_decode_tokens_per_s(device: str, model: str, dtype: str, context_tokens: int,
                              bound: str = "achievable") -> float:
    """Decode tokens per second of `model` stored at `dtype`, all weights in DRAM, on `device`."""
    from sim.components.compute import ComputeModel

    spec = load_model(model, dtype=dtype)
    profile = at_bound(load_profile(device), bound)
    if spec.total_weight_bytes > profile.available_bytes:
        raise FlashsimError(f"{model} ({dtype}) does not fit in {device}'s DRAM: not a dense baseline")
    cm = ComputeModel(spec, profile, framework="kernels", decoder="native")
    one = np.ones(1)
    ctx = np.asarray([float(context_tokens)])
    layer = (cm.attention(one, ctx, ctx, np.asarray([True])).total_s()
             + cm.ffn(one, np.asarray([float(spec.d_ff)]), gathers=False).total_s())
    token_s = float(layer[0]) * spec.n_layers + float(cm.head(1, one).total_s()[0])
    return 1.0 / token_s


def recompute(rows: list[BaselineRow] | None = None) -> list[dict[str, Any]]:
    """Every row with the simulator's figure and its error (simulated / published - 1)."""
    out = []
    for r in rows if rows is not None else load_rows():
        sim = dense_decode_tokens_per_s(r.device, r.model, r.dtype, r.context_tokens)
        peak = dense_decode_tokens_per_s(r.device, r.model, r.dtype, r.context_tokens, bound="peak")
        out.append({**r.__dict__, "simulated_tokens_per_s": sim, "peak_bound_tokens_per_s": peak,
                    "error": sim / r.published_tokens_per_s - 1.0})
    return out
