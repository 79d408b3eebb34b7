"""RAPL energy counters (Linux powercap): joules the CPU packages (and DRAM, where exposed) used
while a real run ran, to compare with the simulated energy per token.

Linux exposes Intel RAPL (and AMD's RAPL-compatible counters, also as `intel-rapl`) under
/sys/class/powercap/intel-rapl:N[:M]/energy_uj: a cumulative count in microjoules per zone (a
package, its cores, its DRAM) that wraps at max_energy_range_uj. `RaplMeter.start()` reads every
top-level zone and its subzones, `stop()` reads them again and returns the joules per zone (a wrap
between the two reads is added back). Where the files are absent (most VMs and containers: the
hypervisor does not pass the MSRs through) or unreadable (recent kernels make energy_uj readable by
root only), `RaplMeter.unavailable()` says why in one line and nothing is measured.

What the counters cover: the whole package (every process, not just this one) and, where a
`dram` subzone exists, the DRAM; never the storage. Units: joules, seconds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

POWERCAP = Path("/sys/class/powercap")


@dataclass
class RaplZone:
    name: str            # e.g. "package-0", "package-0/dram"
    path: Path
    max_range_uj: int


def _read_int(p: Path) -> int:
    return int(p.read_text().strip())


def find_zones(root: Path = POWERCAP) -> tuple[list[RaplZone], str | None]:
    """(zones, None), or ([], the reason none can be read)."""
    if not root.is_dir():
        return [], f"{root} does not exist: this kernel or VM exposes no RAPL energy counters"
    tops = sorted(p for p in root.glob("intel-rapl:*") if p.name.count(":") == 1)
    if not tops:
        return [], f"no intel-rapl zones under {root}: the CPU's energy counters are not exposed here"
    zones = []
    for top in tops:
        for z in [top, *sorted(top.glob(f"{top.name}:*"))]:
            try:
                name = z.joinpath("name").read_text().strip()
                _read_int(z / "energy_uj")
                rng = _read_int(z / "max_energy_range_uj")
            except PermissionError:
                return [], f"{z / 'energy_uj'} is not readable by this user (run as root to measure energy)"
            except (OSError, ValueError) as e:
                return [], f"{z / 'energy_uj'}: cannot read it ({e})"
            label = name if z == top else f"{top.joinpath('name').read_text().strip()}/{name}"
            zones.append(RaplZone(label, z, rng))
    return zones, None


@dataclass
class RaplMeter:
    """Reads every RAPL zone at start() and stop(); joules per zone in between."""

    root: Path = POWERCAP
    zones: list[RaplZone] = field(default_factory=list)
    reason: str | None = None
    _start: dict[str, int] = field(default_factory=dict)
    _t0: float = 0.0

    def __post_init__(self) -> None:
        self.zones, self.reason = find_zones(self.root)

    def unavailable(self) -> str | None:
        """Why nothing can be measured here (None: the counters are readable)."""
        return self.reason

    def start(self) -> None:
        self._start = {z.name: _read_int(z.path / "energy_uj") for z in self.zones}
        self._t0 = time.perf_counter()

    def stop(self) -> dict[str, float]:
        """{zone: joules since start()} plus "seconds" (wall time of the window)."""
        out: dict[str, float] = {}
        for z in self.zones:
            d = _read_int(z.path / "energy_uj") - self._start[z.name]
            if d < 0:                          # the counter wrapped once
                d += z.max_range_uj
            out[z.name] = d * 1e-6
        out["seconds"] = time.perf_counter() - self._t0
        return out


def measured_energy(meter: RaplMeter, joules: dict[str, float] | None, token_s: float, tokens: int) -> dict:
    """The `energy_measured` object of `real run --json`: per zone joules and watts over the window,
    and the package (+DRAM) joules per decode token at the window's mean power x the mean token time
    (the window also holds the run's setup; its power is taken as the decode's)."""
    if joules is None:
        return {"available": False, "reason": meter.unavailable()}
    secs = joules["seconds"]
    zones = {k: v for k, v in joules.items() if k != "seconds"}
    watts = {k: v / secs for k, v in zones.items()} if secs > 0 else {}
    top = {k: v for k, v in watts.items() if "/" not in k}
    dram = {k: v for k, v in watts.items() if k.endswith("/dram")}
    if "psys" in top:          # the platform zone holds the packages and DRAM: count it alone
        w, covers = top["psys"], "the platform (psys: packages, DRAM and more)"
    else:
        w = sum(v for k, v in top.items()) + sum(dram.values())
        covers = "CPU packages (all processes)" + (" and DRAM" if dram else "")
    return {"available": True, "reason": None, "window_s": secs, "joules": zones, "watts": watts,
            "decode_tokens": tokens, "joules_per_token": w * token_s if tokens else None,
            "covers": covers + "; not the storage"}
