"""Out-of-tree policy classes: `pkg.mod:Class` or `path/to/file.py:Class`, loaded only when the
module's source defines `Class` at its top level, checked before use, and named in any error.

- Before anything is executed, the module's source is found (`importlib.util.find_spec`, which
  imports at most the parent packages) and parsed with `ast`: a module with no top-level class or
  assignment named `Class` is refused without being run (`predictor=this:X` must not run `this`).
- After import, the class must subclass the slot's base, implement every abstract hook and carry a
  dataclass `Params`; each problem is one line naming the class.
- An exception raised inside the user's code at run time (in `__init__` or any hook) is reported
  by `policy_error` as one line naming the class and the hook; `--debug` keeps the traceback.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from types import TracebackType
from typing import Any

from devices.errors import FlashsimError

_FILES: dict[str, str] = {}        # source file of a loaded out-of-tree policy module -> its spec string


class PolicyLoadError(FlashsimError, KeyError):
    """An out-of-tree policy that cannot be used (message: the class and why)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _source_defines(source: str, attr: str) -> bool:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == attr:
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.ImportFrom)):
            names = ([t for t in node.targets] if isinstance(node, ast.Assign) else
                     [node.target] if isinstance(node, ast.AnnAssign) else [])
            if any(isinstance(t, ast.Name) and t.id == attr for t in names):
                return True
            if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == attr for a in node.names):
                return True
    return False


def _module_source(mod_name: str, slot: str, path: str) -> tuple[Any, str]:
    """(module spec, source text) of `mod_name` or a .py file, without running the module."""
    if mod_name.endswith(".py") or "/" in mod_name:
        file = Path(mod_name).expanduser()
        if not file.is_file():
            raise PolicyLoadError(f"cannot load {slot} policy {path!r}: no such file {file}")
        spec = importlib.util.spec_from_file_location(f"flashsim_user_policy_{abs(hash(str(file.resolve())))}", file)
    else:
        try:
            spec = importlib.util.find_spec(mod_name)
        except (ImportError, ValueError) as e:
            raise PolicyLoadError(f"cannot load {slot} policy {path!r}: {e}") from None
    if spec is None:
        raise PolicyLoadError(f"cannot load {slot} policy {path!r}: no module named {mod_name!r}")
    try:
        # a loader that cannot give source (an import hook such as pytest's assertion rewriter) is
        # read from the file the spec names
        if spec.loader is not None and hasattr(spec.loader, "get_source"):
            source = spec.loader.get_source(spec.name)
        elif spec.origin and spec.origin.endswith(".py"):
            source = Path(spec.origin).read_text(encoding="utf-8")
        else:
            source = None
    except (ImportError, OSError, UnicodeDecodeError):
        source = None
    if source is None:
        raise PolicyLoadError(f"cannot load {slot} policy {path!r}: module {mod_name!r} has no Python source "
                              "to check (a built-in or compiled module is not a policy)")
    return spec, source


def load_policy_class(path: str, base: type, slot: str) -> type:
    """The class `path` ("pkg.mod:Class" or "file.py:Class") names, checked as a `base` policy."""
    mod_name, _, attr = path.rpartition(":")
    if not mod_name or not attr.isidentifier():
        raise PolicyLoadError(f"{slot} policy {path!r}: expected MODULE:CLASS or FILE.py:CLASS")
    spec, source = _module_source(mod_name, slot, path)
    if not _source_defines(source, attr):
        raise PolicyLoadError(f"cannot load {slot} policy {path!r}: {spec.origin} defines no {attr!r} at its "
                              "top level (the module was not run)")
    try:
        if spec.name in sys.modules:
            module = sys.modules[spec.name]
        elif mod_name.endswith(".py") or "/" in mod_name:
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)  # type: ignore[union-attr]
        else:
            module = importlib.import_module(mod_name)
        cls = getattr(module, attr)
    except Exception as e:  # the user's module raised while importing
        sys.modules.pop(spec.name, None) if (mod_name.endswith(".py") or "/" in mod_name) else None
        raise PolicyLoadError(f"cannot load {slot} policy {path!r}: importing {mod_name} raised "
                              f"{type(e).__name__}: {e}") from None
    if getattr(module, "__file__", None):
        _FILES[str(Path(module.__file__).resolve())] = path
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise PolicyLoadError(f"{slot} policy {path!r} is not a {base.__name__} subclass")
    if inspect.isabstract(cls):
        missing = ", ".join(f"{base.__name__}.{m}" for m in sorted(getattr(cls, "__abstractmethods__", ())))
        raise PolicyLoadError(f"{slot} policy {path!r}: class {cls.__name__} does not implement {missing}, "
                              "which every backend needs")
    params = getattr(cls, "Params", None)
    if not (isinstance(params, type) and dataclasses.is_dataclass(params)):
        raise PolicyLoadError(f"{slot} policy {path!r}: {cls.__name__}.Params must be a dataclass "
                              f"(got {params!r})")
    return cls


def policy_error(exc: BaseException) -> str | None:
    """One line for an exception raised inside an out-of-tree policy's code (the class and the hook,
    from the innermost frame in a loaded policy file), or None when none of its frames is there."""
    tb: TracebackType | None = exc.__traceback__
    hit = None
    while tb is not None:
        file = str(Path(tb.tb_frame.f_code.co_filename).resolve()) if tb.tb_frame.f_code.co_filename else ""
        if file in _FILES:
            hit = tb
        tb = tb.tb_next
    if hit is None:
        return None
    frame = hit.tb_frame
    owner = frame.f_locals.get("self")
    cls = type(owner).__name__ if owner is not None else _FILES[str(Path(frame.f_code.co_filename).resolve())]
    hook = frame.f_code.co_name
    return (f"policy {cls} ({_FILES[str(Path(frame.f_code.co_filename).resolve())]}) raised "
            f"{type(exc).__name__} in {hook}: {str(exc).splitlines()[0] if str(exc) else ''}; "
            "fix the policy (run with --debug for the traceback)")
