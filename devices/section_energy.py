"""EnergySpec: a device profile's energy numbers, each with its value, its source and its kind.

The `energy:` section of a profile YAML (last in the file) holds the six numbers the energy model of
`sim/energy.py` needs. Units are in the names (`_w` watts, `_j_per_byte` joules per byte,
`_j_per_flop` joules per floating-point operation). Every number is a mapping
`{value, kind, source}`: `kind` says where it comes from (datasheet: a vendor's specification, an
upper bound when it is a peak; published: a measurement in a paper, review or benchmark, with its
conditions in `source`; estimate: reasoning written in `source`; measured: by flashsim on this host,
with date and host), `source` cites it (title and URL, or the reasoning).

The model (sim/energy.py) per decode token:
    flash   = (flash_read_active_w - flash_idle_w) x flash busy seconds
    dram    = dram_j_per_byte x DRAM bytes moved (weights and KV streamed, flash DMA written,
              gathered and moved rows)
    compute = compute_j_per_flop x FLOPs + compute_busy_w x compute-busy seconds
    static  = (static_w + flash_idle_w) x the token's seconds
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

SOURCE_KINDS = ("datasheet", "published", "estimate", "measured")
ENERGY_FIELDS = ("flash_read_active_w", "flash_idle_w", "dram_j_per_byte", "compute_j_per_flop",
                 "compute_busy_w", "static_w")


class SourcedValue(BaseModel):
    """One energy number: its value (>= 0, in the unit its field name says), kind and source."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    value: float = Field(ge=0, le=1e5, allow_inf_nan=False)  # devices/limits.py: no device draws 100 kW
    kind: Literal["datasheet", "published", "estimate", "measured"]
    source: str = Field(min_length=1, description="citation (title, URL) or the reasoning of an estimate")


class EnergySpec(BaseModel):
    """Energy figures of one device (and one power mode, `power_mode`) with their sources."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    power_mode: str | None = Field(default=None, description="the power mode the numbers hold for (Jetson "
                                   "nvpmodel modes); None: the device has one")
    flash_read_active_w: SourcedValue = Field(description="storage power while serving reads (watts)")
    flash_idle_w: SourcedValue = Field(description="storage power while idle between reads, without entering "
                                       "its deep low-power states (watts)")
    dram_j_per_byte: SourcedValue = Field(description="dynamic energy per byte read or written in DRAM, "
                                          "controller and interface included (joules per byte)")
    compute_j_per_flop: SourcedValue = Field(description="arithmetic energy per FLOP of the unit that runs "
                                             "the model (joules per FLOP)")
    compute_busy_w: SourcedValue = Field(description="power above idle of the compute unit while it runs "
                                         "kernels, beyond the arithmetic: clocks, issue, caches, waiting on "
                                         "DRAM (watts)")
    static_w: SourcedValue = Field(description="the rest of the platform's power while the model runs, "
                                   "storage idle excluded (watts)")
    notes: str | None = None

    @model_validator(mode="after")
    def _active_above_idle(self) -> EnergySpec:
        if self.flash_read_active_w.value < self.flash_idle_w.value:
            raise ValueError(f"flash_read_active_w ({self.flash_read_active_w.value} W) must be >= flash_idle_w "
                             f"({self.flash_idle_w.value} W)")
        return self

    def value(self, name: str) -> float:
        """The value of one of ENERGY_FIELDS."""
        return float(getattr(self, name).value)

    def kinds(self) -> dict[str, str]:
        """{field: source kind} of every number (printed beside the energy figures)."""
        return {n: getattr(self, n).kind for n in ENERGY_FIELDS}
