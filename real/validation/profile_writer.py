"""Writing measured DeviceProfiles (the devices/schema.py schema), merged and atomic.

`flashsim bench flash` rewrites the `flash` section, `flashsim bench compute` the `compute` section
and the memory bandwidth and capacity; every other field is kept from the base profile: the file
being updated if it exists, else the bundled profile of that name, else the bundled `this-host`
(each kept section keeps its own `source` line, so provenance stays per section). The top-level
`source` becomes kind `measured` once both flash and compute were measured by flashsim bench
(`mixed` before), with the date, the host, the tool version and one reference per command.
The YAML is validated with the schema before it is written (temporary name, then rename) and
read back with `devices.load_profile`.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import re
import uuid
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from devices.errors import FlashsimError
from devices.loading import read_mapping, validation_message
from devices.schema import BUNDLED_DIR, DeviceProfile, list_profiles, load_profile
from traces.outputs import replace_output

MEASURED_PREFIX = "measured by flashsim bench"


def sig4(x: float) -> float:
    """A measured number as the profiles store it: 4 significant digits."""
    return float(f"{x:.4g}")


class _Dumper(yaml.SafeDumper):
    """Block style, except lists of numbers (table rows), which stay on one line."""


def _represent_list(dumper: yaml.SafeDumper, value: list) -> yaml.Node:
    flow = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=flow)


_Dumper.add_representer(list, _represent_list)


def profile_yaml(profile: DeviceProfile, comment: str) -> str:
    """A profile as the bundled files store it (block style, table rows on one line), after a
    `# comment` line; it loads back to an equal profile (floats are written exactly)."""
    text = yaml.dump(profile.model_dump(mode="json", exclude_none=True), Dumper=_Dumper, sort_keys=False, width=120)
    return f"# {comment}\n{text}"


def default_path(name: str) -> Path:
    return BUNDLED_DIR / f"{name}.yaml"


def host_description() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{platform.node()}: {cpu}, {os.cpu_count()} CPUs, {ram:.1f} GiB RAM, "
            f"{platform.system()} {platform.release()}, Python {platform.python_version()}")


def tool_version() -> str:
    try:
        from importlib.metadata import version

        return f"flashsim {version('flashsim')}"
    except Exception:  # not installed (running from a checkout)
        return "flashsim (checkout)"


def _base(path: Path, name: str) -> dict[str, Any]:
    if path.is_file():
        load_profile(path)  # refuse to merge into an invalid file
        return read_mapping(path)
    base = load_profile(name if name in list_profiles() else "this-host")
    data = base.model_dump(mode="json", exclude_none=True)
    if data["name"] != name:
        data["description"] = f"Measured by flashsim bench on {platform.node()}"
    return data


def write_profile(path: Path, name: str, *, flash: dict[str, Any] | None = None,
                  compute: dict[str, Any] | None = None, memory: dict[str, Any] | None = None,
                  command: str) -> DeviceProfile:
    """Merge the given sections into the profile at `path` and write it atomically."""
    data = _base(path, name)
    base_from = _carried_from(data, path) if path.is_file() else (name if name in list_profiles() else "this-host")
    data["name"] = name
    data["schema_version"] = 1
    what = "flash" if flash is not None else "compute"
    if flash is not None:
        data["flash"] = flash
    if compute is not None:
        data["compute"] = compute
    if memory is not None:
        # the bandwidth measured here is what this host sustains: a base profile's published
        # achievable figure describes another machine
        carried = {k: v for k, v in data["memory"].items()
                   if k not in ("sustained_bandwidth_bytes_per_s", "sustained_bandwidth_source")}
        data["memory"] = {**carried, **memory}
    # a measured profile describes the host in the power mode it ran in: a base profile's modes
    # would overwrite the measurements with datasheet numbers
    data.pop("power_modes", None)
    today = dt.date.today().isoformat()
    src = dict(data.get("source", {}))
    refs = [r for r in src.get("references", []) if not r.startswith(f"flashsim bench {what}")]
    refs.append(f"flashsim bench {what} ({today}, {tool_version()}): {command}")
    measured = all(str(data[s].get("source", "")).startswith(MEASURED_PREFIX) for s in ("flash", "compute"))
    src.update(kind="measured" if measured else "mixed", references=refs, date=today,
               host=host_description(), tool=tool_version())
    src["notes"] = provenance_note(data, base_from)
    src.pop("calibration", None)      # a calibrate verdict judged the sections this bench just replaced
    data["source"] = src
    try:
        profile = DeviceProfile.model_validate(data)
    except ValidationError as e:
        raise FlashsimError(f"{path}: the measured profile is invalid: {validation_message(e)}") from None
    return write_profile_text(path, profile_yaml(profile, f"Written by `{command}`; merged sections keep their "
                                                          "own sources."))


def record_calibration(path: Path, mode: str, verdict: str, *, detail: str | None = None,
                       next_step: str | None = None, date: str | None = None) -> DeviceProfile:
    """Write `flashsim calibrate`'s mode (quick / full), verdict and date into the profile at `path`
    (source.calibration, devices/section_base.py Calibration), atomically; every other field kept."""
    data = read_mapping(path)
    src = dict(data.get("source", {}))
    cal = {"mode": mode, "verdict": verdict, "date": date or dt.date.today().isoformat()}
    cal.update({k: v for k, v in (("detail", detail), ("next_step", next_step)) if v})
    src["calibration"] = cal
    data["source"] = src
    try:
        profile = DeviceProfile.model_validate(data)
    except ValidationError as e:
        raise FlashsimError(f"{path}: cannot record the calibration: {validation_message(e)}") from None
    return write_profile_text(path, profile_yaml(profile, f"Written by `flashsim calibrate{' --quick' if mode == 'quick' else ''}`"
                                                          f" ({cal['date']}): verdict {verdict}; merged sections keep "
                                                          "their own sources."))


def measured_fields(data: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(fields measured by flashsim bench on this host, fields carried over from the base profile)
    of a profile mapping, section by section: a section whose `source` starts with MEASURED_PREFIX
    was measured; of the memory section, bench compute measures the capacity and the bandwidth (and,
    on a GPU, whether the memory is unified)."""
    measured, carried = [], []
    for sec in ("flash", "compute"):
        (measured if str(data[sec].get("source", "")).startswith(MEASURED_PREFIX) else carried).append(sec)
    mem_measured = str(data["memory"].get("source", "")).startswith(MEASURED_PREFIX)
    for key in ("capacity_bytes", "bandwidth_bytes_per_s"):
        (measured if mem_measured else carried).append(f"memory.{key}")
    carried.append("memory.reserved_bytes")
    # a GPU's memory section (real/bench/bench_cuda.py) says whether it shares the DRAM: the device's answer
    unified_measured = "unified from cudaDeviceProp" in str(data["memory"].get("source", ""))
    (measured if unified_measured else carried).append("memory.unified")
    carried.append("description")
    return measured, carried


def _carried_from(data: dict[str, Any], path: Path) -> str:
    """Where an existing profile's carried-over fields came from: what its notes say (a profile
    written by bench flash and then bench compute keeps naming the first base), else the file."""
    m = re.search(r"carried over from (.+?) \(their sources", str(data.get("source", {}).get("notes", "")))
    return m.group(1) if m else str(path)


def provenance_note(data: dict[str, Any], base_from: str) -> str:
    """The top-level source's notes: what this host measured and what was carried over, from where."""
    measured, carried = measured_fields(data)
    return (f"measured here by flashsim bench: {', '.join(measured) or 'nothing yet'}; carried over from "
            f"{base_from} (their sources say where they come from): {', '.join(carried)}")


def write_profile_text(path: Path, text: str) -> DeviceProfile:
    """Writes a profile's YAML text at `path` (temporary name, then rename) and reads it back."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        tmp.write_text(text)
        replace_output(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise FlashsimError(f"{path}: cannot write the profile ({e.strerror})") from None
    written = load_profile(path)
    if path.parent == BUNDLED_DIR and path.stem != written.name:
        raise FlashsimError(f"{path}: the profile name {written.name!r} must match the file name")
    return written
