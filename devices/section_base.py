"""What every section of a device profile shares: the strict base model, provenance, retired keys.

`Strict` is the base of every section model (devices/schema.py DeviceProfile and its sections in
devices/section_compute.py and devices/section_flash.py): unknown keys are errors, models are
frozen, and every number is checked against its physical range (devices/limits.py). `Source` is a
profile's provenance as a whole; `Provenance` is the source of one achievable number, and
`needs_source` makes an achievable number without one an error. `RETIRED_FLASH_KEYS` and
`RETIRED_COMPUTE_KEYS` name the keys of terms the simulator no longer models, which the flash and
compute sections drop on loading.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from devices.limits import check_field

# Keys of terms the simulator no longer has: the compute penalty after a demand read's wait, the
# cache index work and the host-CPU interference curves over a batch's reads (flash), the penalty
# after a layer's streaming (compute). None lowered the error on a grid of another boot
# (docs/model-reference.md, "Which machine-model terms earn their place"). Older profiles and kept grids carry them;
# loading drops them (with whatever they nest).
RETIRED_FLASH_KEYS = ("cold_wait_s", "cold_batch_reads", "cold_compute_s", "framework_cold_compute_s",
                      "cache_index_s_per_layer", "cache_index_s_per_evicted", "host_cpu_batch_reads",
                      "host_cpu_curves", "batch_overhead_reads_per_thread", "batch_overhead_by_ratio_s",
                      "plan_s_per_batch", "plan_s_per_neuron")
RETIRED_COMPUTE_KEYS = ("evict_bytes", "evict_layer_s", "framework_evict_layer_s", "row_move_bytes_per_s",
                        "row_move_row_s", "framework_layer_s", "framework_token_s")


class Strict(BaseModel):
    """Base of every profile section: unknown keys are errors, frozen, numbers within their range."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*")
    @classmethod
    def _physical_range(cls, v: object, info: ValidationInfo) -> object:
        """Every number within its physical range (devices/limits.py FIELD_LIMITS)."""
        return check_field(cls.__name__, str(info.field_name), v)


class Calibration(Strict):
    """What `flashsim calibrate` found when it wrote the profile: how thoroughly it measured (`quick`:
    the benches' small grids, 64 MiB; `full`), the validation's verdict on this host (PASS / FAIL
    against the host's own repeat spread, or `not validated` while validation has not finished), the
    date, the verdict's figures in one line and the next step. replay and plan print it beside the
    device inputs; bench flash / bench compute drop it (the sections it judged have changed)."""

    mode: Literal["quick", "full"]
    verdict: Literal["PASS", "FAIL", "not validated"]
    date: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")
    detail: str | None = None
    next_step: str | None = None


class Source(Strict):
    """Provenance of a profile as a whole."""

    kind: Literal["datasheet", "paper", "measured", "estimate", "mixed"]
    references: list[str] = Field(default_factory=list)
    date: str | None = None
    host: str | None = None
    tool: str | None = None
    notes: str | None = None
    calibration: Calibration | None = None


# Where one achievable number comes from (devices/achievable.py folds them in; `devices show` prints
# them beside the peaks): measured on the host by `flashsim bench`, a published measurement (cited
# with its conditions), a datasheet figure, or a stated estimate with its reasoning.
SourceKind = Literal["measured", "published", "datasheet", "estimate"]


class Provenance(Strict):
    """The source of one achievable number: its kind and the citation with its conditions, and for a
    published figure what was measured: `component` (a kernel, a bandwidth test, an SSD test: the
    number itself) or `end_to_end` (derived from a whole decode of one model and framework, which
    holds every other term too; analysis/baselines.py refuses such a constant under a row it is
    scored against, tests/analysis/test_published_baselines.py checks)."""

    kind: SourceKind
    source: str
    evidence: Literal["component", "end_to_end"] | None = None


def needs_source(value: object, source: Provenance | None, name: str) -> None:
    """An achievable number `name` given without its `<name>_source` is an error."""
    if value is not None and source is None:
        raise ValueError(f"{name} needs {name.split('.')[-1]}_source (kind and citation)")


def drop_retired(data: Any, retired: tuple[str, ...]) -> Any:
    """A section's raw mapping without the keys of retired terms (so profiles and kept grids
    written with them still load); anything else unchanged."""
    if isinstance(data, dict) and any(k in data for k in retired):
        return {k: v for k, v in data.items() if k not in retired}
    return data
