"""One device profile from several calibrations of the same host: `flashsim bench merge`.

A calibration is a few minutes of measurement, and on a shared host the machine's state moves
over minutes. On the development VM, two full calibrations 8 minutes apart priced the same
320 real runs 3.8% and 20.1% off (median), and
the validation's own host checks moved 0.80-1.21x in 5-minute means over one grid. A run of an
hour meets those states in proportion, so the profile that predicts it is the host's mean over
the hour, which several calibrations spread over it estimate better than any one of them.

The merge works on the profile's numbers, whatever section they are in, by their units (the
schema names every quantity with its unit):

* **rates** (a key on the path ends in `_per_s`: bytes/s, FLOP/s): the harmonic mean. A run's
  time adds up the seconds of its work, so the mean time per byte (or FLOP) over the calibrations
  is what predicts it; `bench flash` averages its sweeps the same way (real/bench/bench_flash.py).
* **every other float** (seconds, seconds per read, ratios): the arithmetic mean, for the same
  reason (times add).
  Both kept to 4 significant digits, as the benches write them.
* **integers** (axes and settings: chunk sizes, reads in flight, widths, threads, capacities)
  and booleans: must be equal in every profile, else the profiles measured different grids or
  hosts and there is no meaningful mean; refused with the path of the first difference.
* **strings**: the first profile's, except each section's `source`, which says it is a mean of N
  calibrations, and the top-level source, which lists the merged files.

Mappings must have the same keys and lists the same lengths (same refusal). Nothing is fitted:
every merged number is a mean of measured numbers of the same quantity.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from devices.errors import FlashsimError
from real.validation.profile_writer import sig4

RATE_SUFFIX = "_per_s"


class _Mismatch(Exception):
    """The profiles differ where they must agree; str: what and where (a dotted path)."""


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _merge(values: list[Any], path: str, rate: bool) -> Any:
    first = values[0]
    if isinstance(first, dict):
        keys = list(first)
        for v in values[1:]:
            if not isinstance(v, dict) or set(v) != set(keys):
                extra = sorted(set(v) ^ set(keys)) if isinstance(v, dict) else "not a mapping"
                raise _Mismatch(f"{path or 'the profile'}: different keys ({extra})")
        return {k: _merge([v[k] for v in values], f"{path}.{k}" if path else k, rate or k.endswith(RATE_SUFFIX))
                for k in keys}
    if isinstance(first, list):
        if any(not isinstance(v, list) or len(v) != len(first) for v in values[1:]):
            raise _Mismatch(f"{path}: lists of different lengths")
        return [_merge([v[i] for v in values], f"{path}[{i}]", rate) for i in range(len(first))]
    if _is_number(first) and all(_is_number(v) for v in values):
        if all(isinstance(v, int) for v in values):
            if len(set(values)) > 1:
                raise _Mismatch(f"{path}: the integers differ ({', '.join(map(str, values))})")
            return first
        if rate:
            if any(v <= 0 for v in values):
                raise _Mismatch(f"{path}: a rate <= 0 ({', '.join(map(str, values))})")
            return sig4(len(values) / math.fsum(1.0 / v for v in values))
        return sig4(math.fsum(values) / len(values))
    if isinstance(first, bool) or _is_number(first):
        if any(v != first or type(v) is not type(first) for v in values):
            raise _Mismatch(f"{path}: the values differ ({', '.join(map(str, values))})")
        return first
    if first is None or isinstance(first, str):
        if any(v is not None and not isinstance(v, str) for v in values) or (first is None and any(values)):
            raise _Mismatch(f"{path}: the values differ in kind")
        return first
    raise _Mismatch(f"{path}: unexpected value {first!r}")


def merge_profile_data(docs: Sequence[dict[str, Any]], name: str, labels: Sequence[str]) -> dict[str, Any]:
    """The merged profile mapping of `docs` (profile mappings, `model_dump(mode="json")`), named
    `name`; `labels` (one per doc, e.g. the file names) go into the source. FlashsimError when
    fewer than two are given or they do not agree in shape (module docstring)."""
    if len(docs) < 2:
        raise FlashsimError(f"bench merge: give two or more profiles, got {len(docs)}")
    try:
        out = _merge(list(docs), "", False)
    except _Mismatch as e:
        raise FlashsimError(f"bench merge: {e}; merge calibrations of the same host made with the same settings") from None
    n = len(docs)
    for section, data in out.items():
        if isinstance(data, dict) and isinstance(data.get("source"), str) and section != "source":
            data["source"] = (f"mean of {n} calibrations (flashsim bench merge: rates as harmonic means, times "
                              f"as arithmetic means); the first's source: {data['source']}")
    out["name"] = name
    src = dict(out.get("source") or {})
    dates = sorted({str(d.get("source", {}).get("date")) for d in docs if d.get("source", {}).get("date")})
    src["kind"] = "measured" if all(d.get("source", {}).get("kind") == "measured" for d in docs) else "mixed"
    src["date"] = dates[-1] if dates else dt.date.today().isoformat()
    src["references"] = [f"flashsim bench merge of {n} profiles: {', '.join(labels)}"]
    for d, label in zip(docs, labels, strict=True):
        src["references"] += [f"{label}: {r}" for r in d.get("source", {}).get("references", [])]
    src["notes"] = (f"the mean of {n} calibrations of this host ({', '.join(labels)}; measured {', '.join(dates)}); "
                    "every number is a mean of the same quantity's measurements: rates (keys ending in _per_s) "
                    "harmonic, other floats arithmetic (real/validation/profile_merge.py)")
    out["source"] = src
    return out


def merge_profiles(paths: Sequence[str | Path], name: str) -> Any:
    """The DeviceProfile that merges the profiles at `paths` (files or names), validated."""
    from pydantic import ValidationError

    from devices.loading import validation_message
    from devices.schema import DeviceProfile, load_profile

    profiles = [load_profile(str(p)) for p in paths]
    data = merge_profile_data([p.model_dump(mode="json", exclude_none=True) for p in profiles], name,
                              [str(p) for p in paths])
    try:
        return DeviceProfile.model_validate(data)
    except ValidationError as e:
        raise FlashsimError(f"bench merge: the merged profile is invalid: {validation_message(e)}") from None
