"""First-order fit estimate: does a model fit a device, and roughly how fast can it decode?

No trace and no simulation: a roofline over bytes. Decode is memory-bound at batch 1, so a token
costs the bytes it must touch divided by the bandwidth they come from:
  - everything resident:   t = (weights + KV) / DRAM bandwidth;
  - FFN partly on flash:   t = resident bytes / DRAM bw + streamed FFN bytes / flash sequential bw
    (dense streaming, the "hybrid" baseline: every FFN byte that does not fit is read every token);
  - does not fit:          the non-FFN weights plus the KV cache alone exceed the available DRAM.
This is the upper bound on bytes; sparsity-aware policies (simulated by `flashsim replay`) read far less.
"""

from __future__ import annotations

from dataclasses import dataclass

from devices.model_spec import ModelSpec
from devices.schema import DeviceProfile


@dataclass(frozen=True)
class FitEstimate:
    model: str
    device: str
    verdict: str                 # "fits" | "streams-ffn" | "does-not-fit"
    weight_bytes: int
    available_bytes: int
    streamed_bytes_per_token: int
    ms_per_token: float | None   # None when it does not fit

    @property
    def tokens_per_s(self) -> float | None:
        return None if not self.ms_per_token else 1e3 / self.ms_per_token


def estimate_fit(model: ModelSpec, device: DeviceProfile, context_tokens: int = 1024) -> FitEstimate:
    """The first-order verdict for `model` on `device` with a KV cache of `context_tokens`."""
    kv = model.kv_bytes_per_token * context_tokens
    avail = device.available_bytes
    dram_bw = device.memory.bandwidth_bytes_per_s
    total = model.total_weight_bytes
    if total + kv <= avail:
        return FitEstimate(model.name, device.name, "fits", total, avail, 0, 1e3 * (total + kv) / dram_bw)
    must_stay = model.non_ffn_bytes + kv
    if must_stay > avail:
        return FitEstimate(model.name, device.name, "does-not-fit", total, avail, 0, None)
    resident_ffn = avail - must_stay
    streamed = model.ffn_bytes_total - resident_ffn
    t_s = (must_stay + resident_ffn) / dram_bw + streamed / device.flash.sequential_read_bytes_per_s
    return FitEstimate(model.name, device.name, "streams-ffn", total, avail, streamed, 1e3 * t_s)
