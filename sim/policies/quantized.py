"""Precision slot: `native` (the model's own dtype) and `quantized` (int8 / int4 weights).

Quantization is a baseline users compare with: every weight byte (resident, streamed, cached) and
the compute rate follow the quantized dtype. Sizes include one fp16 scale per 32 weights (llama.cpp
Q8_0 / Q4_0: 8.5 and 4.5 bits per weight, see devices/model_spec.py); compute uses the profile's
throughput for that dtype (falling back to the nearest wider one it lists). The quality proxy
(activation mass kept) does not see quantization error: results say so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from devices.model_spec import ModelSpec
from sim.params import param
from sim.policies.base import Precision
from sim.policies.registry import PRECISIONS


@PRECISIONS.register("native")
class NativePrecision(Precision):
    """Weights as the model spec stores them (fp16 for the bundled specs)."""

    def transform(self, spec: ModelSpec) -> ModelSpec:
        return spec


@PRECISIONS.register("quantized")
class QuantizedPrecision(Precision):
    """Block-quantized int8/int4 weights."""

    @dataclass(frozen=True)
    class Params:
        bits: Literal[4, 8] = param(4, "bits per weight (4: Q4_0-like, 4.5 bits stored; 8: Q8_0-like, 8.5)")

    def transform(self, spec: ModelSpec) -> ModelSpec:
        return spec.with_dtype(f"int{self.params.bits}")

    def bind(self, ctx) -> None:  # type: ignore[no-untyped-def]
        super().bind(ctx)
        ctx.notes.append(f"precision: int{self.params.bits} weights; activation_mass_kept does not include "
                         "quantization error")
