"""The inference runtime: the software that launches a decoder layer's kernels, an input beside the device.

What a user runs decides per-token costs the device profile cannot hold alone. A fused runtime
(llama.cpp, MLC, TensorRT-LLM) launches a handful of kernels per layer from a captured graph; eager
PyTorch / transformers issues every elementary op (each RMSNorm is six, rotary embedding ten) from
the host CPU, one dispatch at a time. A runtime is one data file in devices/runtimes/:

  * `kernels`: kernels launched per decoder layer and per token, by phase (attention including its
    norm and residual, the FFN's non-GEMV kernels, the predictor, the lm_head, a cache row move);
    sim/components/compute.py charges each one per-op cost;
  * `dispatch_s`: the host CPU's time to issue one op, when the runtime issues ops one by one from
    the host (eager frameworks); a kernel cannot start before it is issued, so one op costs
    max(the device's `compute.op_overhead_s`, dispatch_s). 0 for a graph-launched runtime, whose
    per-op cost is the device's own launch cost.

Every count and cost carries its source (measured here / published / estimate), like a device profile.
Units: seconds, counts.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from devices.errors import FlashsimError, unknown_name
from devices.loading import validate_file
from devices.section_base import Provenance

RUNTIMES_DIR = Path(__file__).parent / "runtimes"
DEFAULT_RUNTIME = "llama.cpp"


class KernelCounts(BaseModel):
    """Kernels launched per decoder layer (attention, FFN) or per token (head) by one runtime."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    attention: int = Field(ge=1, description="the attention phase: input norm, projections, rotary, "
                           "KV store, attention, output projection, residual")
    attention_gemvs: int = Field(ge=0, description="of those, the q/k/v/o projection GEMVs (priced by a "
                                 "measured dense GEMV table where the profile has one)")
    ffn_base: int = Field(ge=0, description="the FFN's kernels besides one GEMV per matrix: norm, "
                          "activation, gating product, residual")
    predictor: int = Field(ge=0, description="an activation predictor: two low-rank GEMVs and the top selection")
    head: int = Field(ge=1, description="per token: final norm, lm_head GEMV, embedding lookup")
    mgmt: int = Field(ge=0, description="one batched row copy per layer when cache rows move")


class Runtime(BaseModel):
    """One inference runtime: its kernel counts and its per-op dispatch cost, each with a source."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str
    kernels: KernelCounts
    kernels_source: Provenance
    dispatch_s: float = Field(ge=0, le=1e-3, description="host CPU time to issue one op (eager frameworks); "
                              "0: ops are launched from a captured graph at the device's own launch cost")
    dispatch_source: Provenance

    def op_s(self, device_op_overhead_s: float) -> float:
        """Seconds one op costs on a device whose kernel launch costs `device_op_overhead_s`."""
        return max(device_op_overhead_s, self.dispatch_s)

    def summary(self) -> str:
        """One line for a run's header: name, kernels per layer, dispatch cost, source kinds."""
        k = self.kernels
        dispatch = f"{self.dispatch_s * 1e6:.0f} us dispatch per op" if self.dispatch_s else "graph launch"
        return (f"{self.name} ({k.attention}+{k.ffn_base}+matrices kernels per layer, {dispatch}; "
                f"counts {self.kernels_source.kind}, dispatch {self.dispatch_source.kind})")


def list_runtimes() -> list[str]:
    """Names of the bundled runtimes, sorted."""
    return sorted(p.stem for p in RUNTIMES_DIR.glob("*.yaml"))


@cache
def load_runtime(name: str) -> Runtime:
    """The bundled runtime `name`; FlashsimError with close matches for an unknown name."""
    path = RUNTIMES_DIR / f"{name}.yaml"
    if not path.is_file():
        raise unknown_name("runtime", name, list_runtimes())
    rt = validate_file(Runtime, path)
    if rt.name != name:
        raise FlashsimError(f"{path}: field 'name': {rt.name!r} does not match the file name")
    return rt
