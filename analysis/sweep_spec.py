"""Sweep specifications: the grid file (YAML or TOML), its validation, and its expansion into points.

A spec is a grid over traces x models x devices x DRAM budgets x presets x parameter values, plus
one seed shared by every point (common random numbers: points differ only by their configuration):

    seed: 0
    traces: [../../traces/data/smollm2-builtin]       # trace directories (relative to this file)
    models: [null]                                     # null: the trace's own model (default)
    devices: [jetson-orin-nano-8gb, apple-m1-max]      # bundled names or profile files
    dram_budgets: [null, 2GiB, 4GiB]                   # null: the device's available DRAM (default)
    presets:
      - naive
      - {name: llm-in-a-flash, set: {window.k: [1, 2, 4, 8]}}
    set: {tokens: 64}                                  # applied to every preset; lists are swept

`load_spec(path)` validates (unknown keys rejected; errors name the file, the key and, for YAML, the
line); `expand(spec)` returns every `SweepPoint` in a fixed order, each with a stable id: the first
16 hex digits of the SHA-256 of the resolved point (trace content hash, model, device, budget in
bytes, preset, sorted overrides, seed). Two points with the same id are an error. Sizes are bytes
(int) once parsed; the trace hash is the SHA-256 of the trace's manifest.json, which itself holds
the checksum of every array.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
)

from analysis.spec_lines import parse_toml, parse_yaml
from devices.errors import FlashsimError
from devices.limits import MAX_GRID_POINTS, check_size
from devices.suggest import did_you_mean
from devices.units import parse_bytes

Scalar = StrictBool | StrictInt | StrictFloat | StrictStr
SetValues = Scalar | list[Scalar]
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
POINT_ID_HEX = 16  # 64 bits of SHA-256: a collision among 10^6 points has probability ~3e-8


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _scalar(x: Any) -> bool:
    return isinstance(x, (bool, int, float, str))


def _set_shape(v: Any) -> Any:
    """Before type checks: one clear message instead of one per member of the value union."""
    if not isinstance(v, dict):
        raise ValueError("expected a mapping of parameter name -> value or list of values")
    for key, values in v.items():
        ok = _scalar(values) or (isinstance(values, list) and all(_scalar(x) for x in values))
        if not ok:
            raise ValueError(f"{key}: expected a value (number, string, true/false) or a list of "
                             f"values, got {values!r}")
    return v


def _check_set(v: dict[str, Any]) -> dict[str, Any]:
    for key, values in v.items():
        if not _KEY.match(key):
            raise ValueError(f"parameter name {key!r} is not a name like 'window.k'")
        if isinstance(values, list) and not values:
            raise ValueError(f"{key}: give at least one value")
        if isinstance(values, list) and len(set(map(_canon, values))) != len(values):
            raise ValueError(f"{key}: a value is listed twice")
    return v


class PresetEntry(_Strict):
    """A preset with parameter values swept for it alone."""

    name: str = Field(min_length=1)
    set: dict[str, SetValues] = Field(default_factory=dict)

    _v_set_shape = field_validator("set", mode="before")(_set_shape)
    _v_set = field_validator("set")(_check_set)


class SweepSpec(_Strict):
    """The validated contents of a sweep file (see the module docstring)."""

    name: str | None = None
    seed: int = Field(default=0, ge=0)
    traces: list[str] = Field(min_length=1)
    models: list[str | None] = Field(default_factory=lambda: [None], min_length=1)
    devices: list[str] = Field(min_length=1)
    dram_budgets: list[StrictStr | StrictInt | None] = Field(default_factory=lambda: [None], min_length=1)
    presets: list[str | PresetEntry] = Field(min_length=1)
    set: dict[str, SetValues] = Field(default_factory=dict)

    _v_set_shape = field_validator("set", mode="before")(_set_shape)
    _v_set = field_validator("set")(_check_set)

    @field_validator("presets", mode="before")
    @classmethod
    def _preset_shape(cls, v: Any) -> Any:
        if isinstance(v, list):
            for i, p in enumerate(v):
                if not isinstance(p, (str, dict)):
                    raise ValueError(f"presets[{i}]: expected a preset name or a mapping "
                                     f"{{name: ..., set: {{...}}}}, got {p!r}")
        return v

    @field_validator("models")
    @classmethod
    def _trace_model(cls, v: list[Any]) -> list[Any]:
        return [None if m == "trace" else m for m in v]  # TOML has no null: "trace" says the same

    @field_validator("dram_budgets")
    @classmethod
    def _sizes(cls, v: list[Any]) -> list[Any]:
        v = [None if b == "device" else b for b in v]  # TOML has no null: "device" says the same
        for i, b in enumerate(v):
            if b is not None:
                try:
                    if parse_bytes(b, f"dram_budgets[{i}]") <= 0:
                        raise ValueError(f"dram_budgets[{i}]: must be > 0, got {b!r}")
                except FlashsimError as e:
                    raise ValueError(str(e)) from None
        return v


@dataclass(frozen=True)
class SweepPoint:
    """One resolved configuration of a sweep. Plain data: it travels to workers as a dict."""

    index: int                       # position in expand()'s order (results are sorted by it)
    trace: str                       # absolute path of the trace directory
    trace_sha256: str                # SHA-256 of its manifest.json
    model: str | None                # None: the trace's own model
    device: str
    dram_budget_bytes: int | None    # None: the device's available DRAM
    preset: str
    overrides: dict[str, Any] = field(default_factory=dict)  # sorted by key
    seed: int = 0

    @cached_property
    def point_id(self) -> str:
        return hashlib.sha256(_canon(self.identity()).encode()).hexdigest()[:POINT_ID_HEX]

    def identity(self) -> dict[str, Any]:
        """What the id hashes: everything that decides the result, nothing that names a place."""
        return {"v": 1, "trace_sha256": self.trace_sha256, "model": self.model, "device": self.device,
                "dram_budget_bytes": self.dram_budget_bytes, "preset": self.preset,
                "overrides": self.overrides, "seed": self.seed}

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "trace": self.trace, "trace_sha256": self.trace_sha256,
                "model": self.model, "device": self.device, "dram_budget_bytes": self.dram_budget_bytes,
                "preset": self.preset, "overrides": dict(self.overrides), "seed": self.seed}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SweepPoint:
        return cls(**d)

    def label(self) -> str:
        """A short human label: preset and overrides."""
        extra = ",".join(f"{k}={v}" for k, v in self.overrides.items())
        return f"{self.preset}[{extra}]" if extra else self.preset


@dataclass(frozen=True)
class LoadedSpec:
    """A validated spec with the file it came from (relative paths resolve against its folder)."""

    spec: SweepSpec
    path: Path
    text: str

    @property
    def base_dir(self) -> Path:
        return self.path.parent

    @property
    def spec_sha256(self) -> str:
        return hashlib.sha256(_canon(self.spec.model_dump(mode="json")).encode()).hexdigest()


def _canon(obj: Any) -> str:
    """Canonical JSON (sorted keys, no spaces): the input of every hash here."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


# ---- loading with key and line in the error ----------------------------------------------------

def load_spec(path: str | Path) -> LoadedSpec:
    """Read and validate a sweep file (.yaml/.yml or .toml); FlashsimError names file, key and line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FlashsimError(f"{path}: sweep file not found") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as e:
        raise FlashsimError(f"{path}: cannot read the sweep file ({e.__class__.__name__})") from None
    if path.suffix == ".toml":
        data, lines = parse_toml(path, text)
    elif path.suffix in (".yaml", ".yml"):
        data, lines = parse_yaml(path, text)
    else:
        raise FlashsimError(f"{path}: a sweep file must end in .yaml, .yml or .toml")
    if not isinstance(data, dict):
        raise FlashsimError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as e:
        raise FlashsimError(f"{path}: {_describe(e, lines)}") from None
    _check_set_conflicts(path, spec, lines)
    return LoadedSpec(spec, path.resolve(), text)


def _describe(err: ValidationError, lines: dict[tuple, int]) -> str:
    errors = err.errors()
    first = max(errors, key=lambda e: len([p for p in e["loc"] if not _is_union_tag(p)]))
    loc = tuple(p for p in first["loc"] if not _is_union_tag(p))
    key = ".".join(str(p) for p in loc) or "(top level)"
    line = None
    for n in range(len(loc), -1, -1):
        line = lines.get(loc[:n])
        if line is not None:
            break
    msg = first["msg"]
    if first["type"] == "extra_forbidden" and loc[:1] == ("presets",):
        msg = _unknown_key(loc, ("name", "set"), "a preset entry has the keys name and set")
    elif first["type"] == "extra_forbidden":
        msg = _unknown_key(loc, ("name", "seed", "traces", "models", "devices", "dram_budgets", "presets", "set"),
                           "the keys are name, seed, traces, models, devices, dram_budgets, presets and set")
    elif first["type"] == "missing":
        msg = "required key is missing"
    msg = msg.removeprefix("Value error, ")
    # A missing key has no line of its own (the nearest would be its parent's first line).
    where = f" (line {line})" if line is not None and first["type"] != "missing" else ""
    return f"key '{key}'{where}: {msg}"


def _unknown_key(loc: tuple, keys: tuple[str, ...], listing: str) -> str:
    suggestion = did_you_mean(str(loc[-1]), keys) if loc else ""
    return f"unknown key; {suggestion + ' ' if suggestion else ''}{listing}"


def _is_union_tag(p: Any) -> bool:
    """pydantic puts the union member's type name into `loc` (e.g. 'str', 'PresetEntry', 'list[...]')."""
    return isinstance(p, str) and (p in ("str", "int", "float", "bool", "PresetEntry", "none")
                                   or p.startswith(("list[", "union[", "function-", "constrained-")))


def _check_set_conflicts(path: Path, spec: SweepSpec, lines: dict[tuple, int]) -> None:
    for i, p in enumerate(spec.presets):
        if isinstance(p, PresetEntry):
            both = sorted(set(p.set) & set(spec.set))
            if both:
                line = lines.get(("presets", i, "set", both[0]))
                where = f" (line {line})" if line else ""
                raise FlashsimError(
                    f"{path}: key 'presets.{i}.set.{both[0]}'{where}: also given in the top-level 'set'; "
                    "give each parameter in one place"
                )


# ---- expansion ---------------------------------------------------------------------------------

def _values(v: Any) -> list[Any]:
    return list(v) if isinstance(v, list) else [v]


def trace_sha256(trace_dir: Path) -> str:
    """SHA-256 of a trace's manifest.json (which holds every array's checksum)."""
    m = trace_dir / "manifest.json"
    if not m.is_file():
        raise FlashsimError(f"{trace_dir}: not a trace directory (manifest.json is missing)")
    return hashlib.sha256(m.read_bytes()).hexdigest()


def resolve_trace(loaded: LoadedSpec, entry: str) -> Path:
    p = Path(entry).expanduser()
    return (p if p.is_absolute() else loaded.base_dir / p).resolve()


def resolve_device(loaded: LoadedSpec, entry: str) -> str:
    """A bundled device name stays a name; a profile file becomes an absolute path."""
    p = Path(entry).expanduser()
    if p.suffix in (".yaml", ".yml", ".json"):
        return str((p if p.is_absolute() else loaded.base_dir / p).resolve())
    return entry


def resolve_model(loaded: LoadedSpec, entry: str | None) -> str | None:
    if entry is None:
        return None
    p = Path(entry).expanduser()
    if p.suffix in (".yaml", ".yml", ".json") or "/" in entry:
        return str((p if p.is_absolute() else loaded.base_dir / p).resolve())
    return entry


def grid_size(loaded: LoadedSpec) -> int:
    """Points of the grid, counted without building them (traces x models x devices x budgets x the
    presets' value combinations)."""
    spec = loaded.spec
    per_preset = 0
    for preset in spec.presets:
        entry = preset if isinstance(preset, PresetEntry) else PresetEntry(name=preset)
        grid = {**spec.set, **entry.set}
        per_preset += math.prod(len(_values(v)) for v in grid.values())
    return len(spec.traces) * len(spec.models) * len(spec.devices) * len(spec.dram_budgets) * per_preset


def check_grid_size(loaded: LoadedSpec) -> int:
    """The grid's size; FlashsimError above MAX_GRID_POINTS (devices/limits.py), before any point is built."""
    n = grid_size(loaded)
    check_size(f"{loaded.path}: the grid's size (points)", n, MAX_GRID_POINTS,
               "split the sweep into several files or give fewer values per parameter")
    return n


def iter_points(loaded: LoadedSpec) -> Iterator[SweepPoint]:
    """Every point of the grid, lazily, in a fixed order (traces, models, devices, budgets, presets,
    values); duplicates are not checked here (`expand` does)."""
    spec = loaded.spec
    traces = []
    for i, t in enumerate(spec.traces):
        path = resolve_trace(loaded, t)
        try:
            traces.append((str(path), trace_sha256(path)))
        except FlashsimError as e:
            raise FlashsimError(f"{loaded.path}: traces[{i}]: {e}") from None
    budgets = [None if b is None else parse_bytes(b) for b in spec.dram_budgets]
    index = itertools.count()
    combos = itertools.product(traces, spec.models, spec.devices, budgets, spec.presets)
    for (trace, sha), model, device, budget, preset in combos:
        entry = preset if isinstance(preset, PresetEntry) else PresetEntry(name=preset)
        grid = {**spec.set, **entry.set}
        keys = sorted(grid)
        for values in itertools.product(*(_values(grid[k]) for k in keys)):
            yield SweepPoint(index=next(index), trace=trace, trace_sha256=sha,
                             model=resolve_model(loaded, model), device=resolve_device(loaded, device),
                             dram_budget_bytes=budget, preset=entry.name,
                             overrides=dict(zip(keys, values)), seed=spec.seed)


def expand(loaded: LoadedSpec) -> list[SweepPoint]:
    """Every point of the grid, in a fixed order (traces, models, devices, budgets, presets, values).

    Raises FlashsimError when the grid is larger than MAX_GRID_POINTS, a trace is missing or two
    points resolve to the same configuration.
    """
    check_grid_size(loaded)
    points: list[SweepPoint] = []
    seen: dict[str, SweepPoint] = {}
    for p in iter_points(loaded):
        if p.point_id in seen:
            raise FlashsimError(
                f"{loaded.path}: two grid entries give the same point ({p.label()} on {p.device}, "
                f"budget {p.dram_budget_bytes}, trace {Path(p.trace).name}); remove the duplicate"
            )
        seen[p.point_id] = p
        points.append(p)
    return points


def probe_points(loaded: LoadedSpec) -> list[SweepPoint]:
    """A few points that use every device, model, budget, preset and parameter value of the grid at
    least once (each value with the other keys at their first value): what `--dry-run` checks
    without enumerating the product."""
    spec = loaded.spec
    first = next(iter_points(loaded))
    out: list[SweepPoint] = []
    for model, device, budget in itertools.product(spec.models, spec.devices, spec.dram_budgets):
        out.append(replace(first, model=resolve_model(loaded, model), device=resolve_device(loaded, device),
                           dram_budget_bytes=None if budget is None else parse_bytes(budget)))
    for preset in spec.presets:
        entry = preset if isinstance(preset, PresetEntry) else PresetEntry(name=preset)
        grid = {k: _values(v) for k, v in {**spec.set, **entry.set}.items()}
        base = {k: v[0] for k, v in grid.items()}
        out.append(replace(first, preset=entry.name, overrides=dict(sorted(base.items()))))
        for k, values in grid.items():
            for v in values[1:]:
                out.append(replace(first, preset=entry.name, overrides=dict(sorted({**base, k: v}.items()))))
    return out
