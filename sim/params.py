"""Parameter dataclasses: declaration with help text, strict building from mappings, string coercion.

Every configurable thing (each policy's `Params`, and the workload / memory / flash / simulation
sections of a run) is a frozen dataclass whose fields are declared with `param(default, help)`.
`build_params(cls, mapping, where)` rejects unknown keys (naming them and listing the valid ones),
coerces strings such as those from `--set k=v` to the field's type (int, float, bool, str, byte
sizes, Literal choices, `X | None`), and turns the dataclass's own `ValueError`s into one-line
`FlashsimError`s that name the parameter (`window.k must be >= 0, got -1`).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, get_args, get_origin

from devices.errors import FlashsimError
from devices.limits import check_param
from devices.suggest import did_you_mean, hint
from devices.units import parse_bytes


def param(default: Any, help: str, *, unit: str | None = None) -> Any:
    """A dataclass field with its documentation (shown by `flashsim replay --list-params`).

    unit="bytes" lets the value be written as a size ('4GiB')."""
    return dataclasses.field(default=default, metadata={"help": help, "unit": unit})


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """A Params class's resolved annotations (classes are defined once: resolved once)."""
    return typing.get_type_hints(cls)


def fields_of(cls: type) -> list[dataclasses.Field]:
    return list(dataclasses.fields(cls))


_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def coerce(value: Any, tp: Any, where: str, unit: str | None = None) -> Any:
    """Convert `value` (often a string from the command line) to type `tp`; FlashsimError if it cannot."""
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = get_args(tp)
        is_none = value is None or (isinstance(value, str) and value.lower() in ("none", "null"))
        if is_none and type(None) in args:
            return None
        errors = []
        for a in (a for a in args if a is not type(None)):
            try:
                return coerce(value, a, where, unit)
            except FlashsimError as e:
                errors.append(str(e))
        raise FlashsimError(errors[0] if len(errors) == 1 else f"{where}: cannot use {value!r}; "
                            + "; ".join(e.split(": ", 1)[-1] for e in errors))
    if origin is Literal:
        choices = get_args(tp)
        for c in choices:
            if value == c or (isinstance(value, str) and str(c) == value):
                return c
        suggestion = did_you_mean(str(value), [str(c) for c in choices])
        raise FlashsimError(f"{where}: {value!r} is not one of {', '.join(repr(c) for c in choices)}"
                            + (f"; {suggestion}" if suggestion else ""))
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
            return value.lower() in _TRUE
        raise FlashsimError(f"{where}: expected true or false, got {value!r}")
    if tp is int:
        if unit == "bytes" and not isinstance(value, bool):
            return parse_bytes(value, where, unit="bytes")
        if isinstance(value, bool):
            raise FlashsimError(f"{where}: expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        raise FlashsimError(f"{where}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, bool):
            raise FlashsimError(f"{where}: expected a number, got {value!r}")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                pass
        raise FlashsimError(f"{where}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise FlashsimError(f"{where}: expected a string, got {value!r}")
    if origin in (tuple,) or tp is tuple:
        if isinstance(value, (list, tuple)):
            return tuple(value)
        raise FlashsimError(f"{where}: expected a list, got {value!r}")
    if tp is typing.Any:
        return value
    raise TypeError(f"{where}: unsupported parameter type {tp!r}")  # a bug in a Params class


def build_params(cls: type, mapping: Mapping[str, Any] | None, where: str) -> Any:
    """Instantiate `cls` from `mapping` strictly (unknown keys, bad types and values -> FlashsimError)."""
    mapping = dict(mapping or {})
    hints = _hints(cls)
    names = [f.name for f in fields_of(cls)]
    unknown = sorted(set(mapping) - set(names))
    if unknown:
        raise FlashsimError(f"{where}: unknown parameter {unknown[0]!r}; "
                            f"{hint(unknown[0], names, 'valid parameters')}")
    kwargs = {}
    for f in fields_of(cls):
        if f.name in mapping:
            kwargs[f.name] = coerce(mapping[f.name], hints[f.name], f"{where}.{f.name}", f.metadata.get("unit"))
    try:
        obj = cls(**kwargs)
    except ValueError as e:
        msg = str(e)
        raise FlashsimError(msg if msg.startswith(where) else f"{where}.{msg}") from None
    for name, value in kwargs.items():      # the class's own checks first, then the physical ranges
        check_param(f"{where}.{name}", value)
    return obj


def params_to_dict(obj: Any) -> dict[str, Any]:
    """Field values as plain JSON-able Python values (tuples become lists)."""
    out = {}
    for f in fields_of(type(obj)):
        v = getattr(obj, f.name)
        out[f.name] = list(v) if isinstance(v, tuple) else v
    return out


def describe_params(cls: type) -> list[dict[str, Any]]:
    """[{name, type, default, help}] for documentation."""
    hints = _hints(cls)
    rows = []
    for f in fields_of(cls):
        tp = hints[f.name]
        rows.append({"name": f.name, "type": _type_name(tp), "default": f.default,
                     "help": f.metadata.get("help", ""), "unit": f.metadata.get("unit")})
    return rows


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "|".join(str(a) for a in get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if tp is type(None):
        return "none"
    return getattr(tp, "__name__", str(tp))


def check(cond: bool, message: str) -> None:
    """Raise ValueError(message) unless cond: for Params.__post_init__ (message starts 'name ...')."""
    if not cond:
        raise ValueError(message)
