"""The seam between sweeps and the simulator: evaluate one `SweepPoint` -> flat result columns.

`evaluate_point(point)` opens the point's trace (once per process), loads its model spec and device
profile, runs `sim.engine.simulate` with the point's preset, overrides, DRAM budget and seed, and
returns the run's summary as flat columns: scalars under their own names (`ms_per_token`, ...),
nested mappings flattened with dots (`prefill.ms_per_token`), the resolved configuration as one
canonical JSON string (`config_json`). Units are those of the summary's names.

`check_points(points)` resolves every name a sweep uses (devices, models, presets and parameter
names) before any point runs, so a typo fails in a second instead of after an hour of work.

Any evaluator (`module:function` taking a SweepPoint and returning such a dict) can replace this one
with `analysis.sweep.run_sweep(..., evaluator=...)`; a FlashsimError it raises marks the point as
failed (status "error", message kept) rather than stopping the sweep.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from analysis.sweep_spec import SweepPoint
from devices.errors import FlashsimError

CONFIG_COLUMN = "config_json"
# Summary keys a point already records (as the name or path the sweep file gave).
POINT_KEYS = frozenset({"device"})
# Settings the sweep file has its own keys for (dram_budgets, seed).
RESERVED_KEYS = frozenset({"memory.dram_budget_bytes", "seed", "sim.seed"})


def _simulator() -> Any:
    """The simulator's module; a one-line error when this checkout has none."""
    try:
        import sim.engine as engine
    except ImportError as e:
        if e.name is not None and not e.name.startswith("sim"):
            raise
        raise FlashsimError(
            "the simulator (sim.engine) is not available in this checkout, so sweep points cannot run"
        ) from None
    return engine


@lru_cache(maxsize=8)
def _trace(path: str, sha256: str) -> Any:
    """Open (and fully verify) a trace once per process; the hash keys the cache on its content."""
    from traces.format import open_trace

    return open_trace(path, verify=True)


@lru_cache(maxsize=32)
def _profile(name: str) -> Any:
    from devices import load_profile

    return load_profile(name)


@lru_cache(maxsize=32)
def _model(name: str) -> Any:
    from devices import load_model

    return load_model(name)


def run_config(point: SweepPoint) -> Any:
    """The simulator's RunConfig of a point: its preset, then its overrides, budget and seed."""
    from sim.policies.presets import preset_config

    reserved = sorted(set(point.overrides) & RESERVED_KEYS)
    if reserved:
        raise FlashsimError(f"set: {reserved[0]}: give DRAM budgets with `dram_budgets:` and the seed "
                            "with `seed:` in the sweep file, not under `set:`")
    settings = [f"{k}={_text(v)}" for k, v in point.overrides.items()]
    if point.dram_budget_bytes is not None:
        settings.append(f"memory.dram_budget_bytes={point.dram_budget_bytes}")
    settings.append(f"sim.seed={point.seed}")
    return preset_config(point.preset).with_overrides(settings)


def _text(v: Any) -> str:
    """A spec value as the simulator's `--set key=value` text."""
    if isinstance(v, bool):
        return "true" if v else "false"
    return repr(v) if isinstance(v, float) else str(v)


def evaluate_point(point: SweepPoint) -> dict[str, Any]:
    """Simulate one point and return its summary as flat columns (see the module docstring)."""
    engine = _simulator()
    trace = _trace(point.trace, point.trace_sha256)
    spec = None if point.model is None else _model(point.model)
    result = engine.simulate(trace, spec, _profile(point.device), run_config(point))
    return flatten_summary(result.summary())


def flatten_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """Scalars kept, mappings flattened with dots, `config` as canonical JSON, lists as JSON."""
    out: dict[str, Any] = {}

    def walk(prefix: str, d: dict[str, Any]) -> None:
        for k, v in d.items():
            name = f"{prefix}{k}"
            if name in POINT_KEYS:
                continue
            if name == "config":
                out[CONFIG_COLUMN] = json.dumps(v, sort_keys=True, separators=(",", ":"), default=str)
            elif isinstance(v, dict):
                walk(f"{name}.", v)
            elif isinstance(v, (list, tuple)):
                out[name] = json.dumps(list(v), default=str)
            elif v is None or isinstance(v, (bool, int, float, str)):
                out[name] = v
            elif hasattr(v, "item"):  # numpy scalar
                out[name] = v.item()
            else:
                out[name] = str(v)

    walk("", summary)
    return out


def check_points(points: Sequence[SweepPoint]) -> None:
    """Resolve every device, model, preset and parameter name used by `points`; FlashsimError if not."""
    for device in sorted({p.device for p in points}):
        _profile(device)
    for model in sorted({p.model for p in points if p.model is not None}):
        _model(model)
    _simulator()
    checked: set[tuple] = set()
    for p in points:  # every distinct configuration: a bad value (window.k=-1) fails here, at once
        key = (p.preset, tuple(p.overrides.items()), p.dram_budget_bytes)
        if key not in checked:
            checked.add(key)
            try:
                run_config(p)
            except FlashsimError as e:
                raise FlashsimError(f"point {p.label()}: {e}") from None
