"""Power modes: a profile's `power_modes` (`name@MODE` on the command line) set absolute values by
dotted path (`compute.cpu_cores: 4`, `memory.bandwidth_bytes_per_s: ...`) before anything else reads
the profile; the default is the mode the device ships in.

Applied by `devices.schema.load_profile`, so this module works on any profile model (pydantic) and
imports nothing of `devices.schema`: the loader depends on it, not the other way round.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from devices.errors import FlashsimError
from devices.suggest import hint

P = TypeVar("P", bound=BaseModel)   # a devices.schema.DeviceProfile


def with_power_mode(profile: P, mode: str | None) -> P:
    """The profile in power mode `mode` (None: its default); a profile without modes takes only None."""
    modes = profile.power_modes
    if modes is None:
        if mode is not None:
            raise FlashsimError(f"device {profile.name}: no power modes; drop '@{mode}'")
        return profile
    name = mode or modes.default
    if name not in modes.modes:
        raise FlashsimError(f"device {profile.name}: unknown power mode {name!r}; "
                            f"{hint(name, modes.modes, 'choose one of')} (default {modes.default})")
    data = profile.model_dump()
    sets = modes.modes[name].set
    for path, value in sets.items():
        _set_path(data, path, value, profile.name, name)
    if data.get("energy") is not None and any(p.startswith("energy.") for p in sets):
        # the mode carries its own energy numbers: they now hold for it. A mode that sets none keeps the
        # label of the mode they were taken in, which `inputs()` prints beside them.
        data["energy"]["power_mode"] = name
    where = f"{profile.name}@{name}"
    try:
        out = type(profile).model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise FlashsimError(f"device {where}: field {loc!r}: {err['msg']}") from None
    out._power_mode = name
    return out


def _set_path(data: dict[str, Any], path: str, value: float, device: str, mode: str) -> None:
    keys = path.split(".")
    node: Any = data
    for k in keys[:-1]:
        if not isinstance(node, dict) or node.get(k) is None:
            raise FlashsimError(f"device {device}, power mode {mode}: {path!r} is not a field of the profile")
        node = node[k]
    if not isinstance(node, dict) or (keys[-1] not in node and len(keys) < 3):
        raise FlashsimError(f"device {device}, power mode {mode}: {path!r} is not a field of the profile")
    old = node.get(keys[-1])
    node[keys[-1]] = int(value) if isinstance(old, int) and not isinstance(old, bool) else value
