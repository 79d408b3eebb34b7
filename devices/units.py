"""Parsing and formatting of human units at the edges (CLI, files). Internally: bytes and seconds.

`parse_bytes("4GiB") == 4 * 2**30`, `parse_bytes("4 GB") == 4 * 10**9`, `parse_seconds("50 us")`.
A size a person types (a command-line option, a sweep file's budget) must carry its unit: `3` could be
bytes, MB or GiB, and a budget of 3 bytes is never meant, so `parse_bytes("3")` is refused with the
fix ("3: give a unit, e.g. 3GiB"); `B` says bytes (`4096B`), and `0` needs none. A value whose key
already names its unit (`memory.dram_budget_bytes=4096`, a file's `available_bytes`) is read with
`parse_bytes(v, unit="bytes")`. `GB` is 10^9 bytes and `GiB` 2^30: outputs say which they print.
"""

from __future__ import annotations

import math
import re

from devices.errors import FlashsimError

_BYTE_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SECOND_UNITS = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "min": 60.0}
_NUM_UNIT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Zµ]*)\s*$")


def parse_bytes(value: str | int | float, what: str = "size", unit: str | None = None) -> int:
    """Parse a byte size such as ``4GiB``, ``512 MB`` or ``4096B``; raise FlashsimError. A number
    without a unit (``"3"``, ``3``) is refused with the fix, unless `unit="bytes"` (the key it came
    from names its unit) or it is zero."""
    if isinstance(value, bool):
        raise FlashsimError(f"{what}: expected a size like '4GiB', got {value!r}")
    if isinstance(value, (int, float)):
        number, suffix = float(value), ""
    else:
        m = _NUM_UNIT.match(str(value))
        if not m or m.group(2).lower() not in _BYTE_UNITS:
            raise FlashsimError(
                f"{what}: cannot parse {value!r} as a size; use e.g. '4GiB', '512MiB', '3.5GB' or '4096B'"
            )
        number, suffix = float(m.group(1)), m.group(2).lower()
    if suffix == "" and unit != "bytes" and number != 0:
        text = str(value).strip()
        raise FlashsimError(f"{what}: {text}: give a unit, e.g. {text}GiB (GiB = 2^30 bytes, GB = 10^9, "
                            "B = bytes)")
    result = number * _BYTE_UNITS[suffix]
    if not math.isfinite(result):
        raise FlashsimError(f"{what}: {value!r} is not a finite size; use e.g. '4GiB' or a number of bytes")
    if result < 0:
        raise FlashsimError(f"{what}: must be >= 0, got {value!r}")
    return int(round(result))


def parse_seconds(value: str | int | float, what: str = "duration") -> float:
    """Parse a duration such as ``50 us``, ``2ms``, ``1.5`` (seconds); raise FlashsimError."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number, unit = float(value), ""
    else:
        m = _NUM_UNIT.match(str(value))
        if not m or m.group(2) not in _SECOND_UNITS:
            raise FlashsimError(f"{what}: cannot parse {value!r} as a duration; use e.g. '50us', '2ms', '1.5s'")
        number, unit = float(m.group(1)), m.group(2)
    if number < 0:
        raise FlashsimError(f"{what}: must be >= 0, got {value!r}")
    return number * _SECOND_UNITS[unit]


# printed under every header that shows sizes (replay, plan): which of the two conventions each figure uses
UNITS_NOTE = "units: sizes in binary KiB/MiB/GiB (2^10/2^20/2^30 bytes); rates in decimal MB/s, GB/s (10^6, 10^9 bytes/s)"


def format_bytes(n: float) -> str:
    """Binary units for display: 1536 -> '1.50 KiB'."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_rate(bytes_per_s: float) -> str:
    """Decimal GB/s or MB/s for display, as storage datasheets print them."""
    if bytes_per_s >= 1e9:
        return f"{bytes_per_s / 1e9:.2f} GB/s"
    return f"{bytes_per_s / 1e6:.0f} MB/s"
