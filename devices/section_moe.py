"""MoECosts: the `moe:` section of a device profile, the costs an MoE decode pays that a dense one lacks.

- `router_sync_s`: once per MoE layer the host must learn which experts the router picked before it
  can issue their reads. On a GPU that is a device-to-host read-back that waits for every queued
  kernel (the pipeline drains, then refills): a fixed latency per MoE layer, on the critical path.
  On a CPU-only host it is a few microseconds of reading the router's output.
- `page_fault_bytes`: the kernel's read-around window when a mapped file faults (Linux: 128 KiB,
  `/sys/block/*/queue/read_ahead_kb`): the read size of the page-cache baseline's misses.
- `expert_reads_in_flight`: how many expert reads the engine keeps outstanding at once (default the
  flash's `max_in_flight`).
- `host_copy_bytes_per_s` (discrete accelerators): an expert read from the SSD lands in host memory (a
  pinned buffer) and is then copied to the accelerator's memory over its link: the second hop of the
  read, after the SSD's, at this achievable rate (with its source); the peak bound uses the link's
  datasheet rate `host_copy_link_bytes_per_s`. Unset: the reads land where the compute reads them
  (unified memory, or a CPU host).
"""

from __future__ import annotations

from pydantic import Field, model_validator

from devices.section_base import Provenance, Strict


class MoECosts(Strict):
    """Per-MoE-layer host costs and the read shape of MoE engines on this device."""

    router_sync_s: float = Field(ge=0, description="seconds per MoE layer for the host to learn the router's "
                                 "choice (GPU read-back and pipeline drain)")
    router_sync_source: Provenance
    page_fault_bytes: int = Field(default=131072, gt=0, description="read-around bytes per page fault of a "
                                  "mapped file")
    page_fault_source: Provenance | None = None
    expert_reads_in_flight: int | None = Field(default=None, ge=1, description="expert reads kept outstanding "
                                               "at once (default: flash.max_in_flight)")
    expert_reads_in_flight_source: Provenance | None = None
    host_copy_bytes_per_s: float | None = Field(default=None, gt=0, description="achievable rate of "
                                                "the host-to-accelerator copy of each read expert (second hop)")
    host_copy_link_bytes_per_s: float | None = Field(default=None, gt=0, description="the link's "
                                                     "datasheet rate: the second hop at the peak bound")
    host_copy_source: Provenance | None = None

    @model_validator(mode="after")
    def _copy_sourced(self) -> MoECosts:
        if self.host_copy_bytes_per_s is not None and (self.host_copy_source is None
                                                        or self.host_copy_link_bytes_per_s is None):
            raise ValueError("moe.host_copy_bytes_per_s needs host_copy_source (kind and citation) and "
                             "host_copy_link_bytes_per_s (the link's datasheet rate, for the peak bound)")
        if (self.host_copy_bytes_per_s or 0) > (self.host_copy_link_bytes_per_s or float("inf")):
            raise ValueError("moe.host_copy_bytes_per_s is above host_copy_link_bytes_per_s: the achievable "
                             "rate cannot beat the link's datasheet rate")
        return self
