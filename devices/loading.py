"""Reading YAML/JSON data files into validated pydantic models with one-line, file-and-field errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar, get_args

from pydantic import BaseModel, ValidationError

from devices.errors import FlashsimError
from devices.safe_load import load_data_file, parse_json, read_text_file
from devices.suggest import did_you_mean

M = TypeVar("M", bound=BaseModel)


def read_mapping(path: Path) -> dict[str, Any]:
    """Parse a YAML or JSON file that must hold a mapping (duplicate keys, alias bombs, FIFOs refused:
    devices/safe_load.py); FlashsimError names the file and line."""
    data = load_data_file(path)
    if not isinstance(data, dict):
        raise FlashsimError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def read_versioned_json(path: Path, format_name: str, schema_version: int, *, kind: str, remedy: str) -> dict[str, Any]:
    """Parse a JSON manifest that names its `format` and `schema_version` (traces, weight stores);
    FlashsimError names the file and field, and says what to do (`remedy`) for an old version."""
    data = parse_json(read_text_file(path, kind + " manifest"), str(path))
    if not isinstance(data, dict) or data.get("format") != format_name:
        raise FlashsimError(f"{path}: field 'format': expected {format_name!r}; not a flashsim {kind}")
    if data.get("schema_version") != schema_version:
        raise FlashsimError(
            f"{path}: field 'schema_version': {data.get('schema_version')!r} is not supported "
            f"(this flashsim reads version {schema_version}); {remedy}"
        )
    return data


def validation_message(err: ValidationError, model: type[BaseModel] | None = None) -> str:
    """The first pydantic error as 'field a.b.c: message' (one line). An unknown key comes before the
    errors it causes (a misspelt required key is also reported missing) and is named with the close
    matches among the keys valid at its place (`model`'s fields, and the missing ones)."""
    errors = err.errors()
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    first = unknown[0] if unknown else errors[0]
    loc = ".".join(str(p) for p in first["loc"]) or "(top level)"
    msg = first["msg"]
    if first["type"] == "extra_forbidden":
        suggestion = did_you_mean(str(first["loc"][-1]), _keys_beside(first["loc"], errors, model))
        msg = "unknown key; " + (suggestion or "check its spelling; see the bundled files for the schema")
    elif first["type"] == "missing":
        msg = "required field is missing"
    elif first["type"] == "value_error":
        msg = msg.removeprefix("Value error, ")
    more = len(errors) - 1
    return f"field '{loc}': {msg}" + (f" (and {more} more problem(s))" if more else "")


def _keys_beside(loc: tuple[Any, ...], errors: list[Any], model: type[BaseModel] | None) -> list[str]:
    """The keys valid beside the one at `loc`: the missing ones at the same place, and the fields of
    the model found by walking `model` along the path (dict keys and list indices are stepped over)."""
    parent = tuple(loc[:-1])
    keys = [str(e["loc"][-1]) for e in errors if e["type"] == "missing" and tuple(e["loc"][:-1]) == parent]
    cls: Any = model
    for part in parent:
        fields = getattr(cls, "model_fields", None)
        if fields is None or cls is None:
            return keys
        if part in fields:
            cls = _model_in(fields[part].annotation)
    fields = getattr(cls, "model_fields", None) or {}
    return keys + [a for name, f in fields.items() for a in (name, f.alias) if a]


def _model_in(annotation: Any) -> Any:
    """The pydantic model inside an annotation (X, X | None, list[X], dict[str, X]), or None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def validate_file(model: type[M], path: Path, data: dict[str, Any] | None = None) -> M:
    """Validate a file's mapping against `model`; FlashsimError names the file and the field."""
    data = read_mapping(path) if data is None else data
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise FlashsimError(f"{path}: {validation_message(e, model)}") from None
