"""DeviceProfile: the validated schema of a device data file, and where bundled profiles live.

One YAML file per device in `devices/profiles/`: the only place device numbers live. Every section
carries a `source` string saying where its numbers come from (datasheet, paper, measured, estimate;
"peak" where a datasheet gives a peak). Units are in the key names: `_bytes`, `_bytes_per_s`,
`_flops_per_s`, `_s`. Unknown keys are errors. Extra profile folders can be listed in the
environment variable FLASHSIM_PROFILE_PATH (os.pathsep-separated); they shadow bundled ones.

This module owns the top level (DeviceProfile, its power modes) and finding and loading profile
files (`load_profile`, `list_profiles`). The sections live by area and are re-exported here:
devices/section_base.py (the strict base, provenance, retired keys), devices/section_compute.py
(memory, compute and its kernel tables), devices/section_flash.py (flash and its read curves,
host-CPU terms), devices/section_energy.py (energy).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, PrivateAttr, model_validator

from devices.errors import FlashsimError, unknown_name
from devices.loading import validate_file
from devices.power_modes import with_power_mode
from devices.section_base import (
    RETIRED_COMPUTE_KEYS,
    RETIRED_FLASH_KEYS,
    Provenance,
    Source,
    Strict,
)
from devices.section_compute import (
    SPARSE_FFN_KERNELS,
    ComputeSpec,
    DenseGemvSpec,
    DenseGemvTable,
    MemorySpec,
    SparseFfnSpec,
    SparseFfnTable,
)
from devices.section_energy import EnergySpec
from devices.section_flash import FlashSpec, ReadTable
from devices.section_moe import MoECosts

__all__ = [
    "BUNDLED_DIR",
    "DTYPES",
    "RETIRED_COMPUTE_KEYS",
    "RETIRED_FLASH_KEYS",
    "SCHEMA_VERSION",
    "SPARSE_FFN_KERNELS",
    "ComputeSpec",
    "DenseGemvSpec",
    "DenseGemvTable",
    "DeviceProfile",
    "EnergySpec",
    "FlashSpec",
    "MemorySpec",
    "PowerMode",
    "PowerModes",
    "Provenance",
    "ReadTable",
    "Source",
    "SparseFfnSpec",
    "SparseFfnTable",
    "check_profile_name",
    "list_profiles",
    "load_profile",
    "profile_file",
    "profile_path",
]

SCHEMA_VERSION = 1
BUNDLED_DIR = Path(__file__).parent / "profiles"
DTYPES = ("fp32", "fp16", "bf16", "int8", "int4")


class PowerMode(Strict):
    """One power mode (nvpmodel mode, performance profile): the fields it changes, by dotted path
    (`memory.bandwidth_bytes_per_s`, `compute.gemv_flops_per_s.fp16`, `flash.request_cpu_s`), each
    an absolute value; the profile's own numbers are its default mode's."""

    description: str
    source: str
    set: dict[str, float] = Field(default_factory=dict)


class PowerModes(Strict):
    """The device's power modes; `default` is the mode it ships in (named in every output)."""

    default: str
    modes: dict[str, PowerMode]

    @model_validator(mode="after")
    def _default_listed(self) -> PowerModes:
        if self.default not in self.modes:
            raise ValueError(f"default {self.default!r} is not one of the modes ({', '.join(self.modes)})")
        for name in self.modes:
            if not name or "@" in name or not name.replace("-", "").replace("_", "").isalnum():
                raise ValueError(f"mode name {name!r}: use letters, digits, '-' and '_'")
        return self


class DeviceProfile(Strict):
    """A device: memory, compute and flash, each with its source. Achievable numbers sit beside the
    peaks; devices/achievable.py folds one set into the fields the simulator reads (`bound`) and
    applies a power mode (`power_mode`)."""

    schema_version: Literal[1] = 1
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    description: str
    source: Source
    memory: MemorySpec
    compute: ComputeSpec
    flash: FlashSpec
    energy: EnergySpec | None = None
    moe: MoECosts | None = None
    power_modes: PowerModes | None = None
    # set by devices/achievable.py, never read from a file
    _power_mode: str | None = PrivateAttr(default=None)
    _bound: str = PrivateAttr(default="raw")

    @property
    def power_mode(self) -> str | None:
        """The power mode applied (None: the profile has no modes)."""
        if self._power_mode is not None:
            return self._power_mode
        return self.power_modes.default if self.power_modes is not None else None

    @property
    def bound(self) -> str:
        """"raw" (as in the file: peaks and achievable numbers side by side), "achievable" or "peak"."""
        return self._bound

    @property
    def available_bytes(self) -> int:
        """DRAM left for the model after the OS's reserve."""
        return self.memory.capacity_bytes - self.memory.reserved_bytes

    def summary(self) -> dict:
        """The flat view printed by `flashsim devices` (units in the key names)."""
        return {
            "name": self.name,
            "description": self.description,
            "dram_bytes": self.memory.capacity_bytes,
            "dram_available_bytes": self.available_bytes,
            "dram_bandwidth_bytes_per_s": self.memory.bandwidth_bytes_per_s,
            "unified_memory": self.memory.unified,
            "flash_sequential_bytes_per_s": self.flash.sequential_read_bytes_per_s,
            "flash_4k_random_bytes_per_s": self.flash.bytes_per_s(4096),
            "flash_read_model": "table" if self.flash.read_table is not None else "closed_form",
            "source_kind": self.source.kind,
        }


def _search_dirs() -> list[Path]:
    extra = [Path(p) for p in os.environ.get("FLASHSIM_PROFILE_PATH", "").split(os.pathsep) if p]
    return [*extra, BUNDLED_DIR]


def list_profiles() -> list[str]:
    """Names of every profile on the search path (bundled and FLASHSIM_PROFILE_PATH), sorted."""
    names = {p.stem for d in _search_dirs() if d.is_dir() for p in d.glob("*.yaml")}
    return sorted(names)


def profile_path(name: str) -> Path:
    """The file a profile name resolves to (first match on the search path)."""
    for d in _search_dirs():
        p = d / f"{name}.yaml"
        if p.is_file():
            return p
    raise unknown_name("device", name, list_profiles())


def profile_file(name_or_path: str | Path) -> Path:
    """The file of a profile given by name (the search path) or by path (absolute or relative)."""
    p = Path(name_or_path).expanduser()
    return p if p.suffix in (".yaml", ".yml", ".json") or p.is_file() else profile_path(str(name_or_path))


def load_profile(name_or_path: str | Path) -> DeviceProfile:
    """Load a bundled profile by name, or any profile file by path; raise FlashsimError. A name or
    path may end in `@MODE` to pick one of the profile's power modes (default: the mode it ships in).
    The profile comes back raw (peaks and achievable numbers side by side); the simulator folds in
    the achievable numbers (devices/achievable.py `at_bound`) unless told `--bound peak`."""
    text = str(name_or_path)
    mode = None
    if "@" in text and not Path(text).is_file():
        text, mode = text.rsplit("@", 1)
        if not mode.strip():
            raise FlashsimError(f"{name_or_path}: no power mode after '@'; give DEVICE@MODE or drop the '@'")
    p = Path(text).expanduser()
    by_path = p.suffix in (".yaml", ".yml", ".json") or p.is_file()
    path = profile_file(text)
    profile = validate_file(DeviceProfile, path)
    if not by_path:
        check_profile_name(profile, path)
    return with_power_mode(profile, mode)


def check_profile_name(profile: DeviceProfile, path: Path) -> None:
    """Bundled files must be named after the profile they hold."""
    if path.stem != profile.name:
        raise FlashsimError(f"{path}: field 'name': {profile.name!r} does not match the file name")
