"""Registries of policies, one per slot: register with a decorator, build by name with parameters.

    @RESIDENCY.register("window")
    class WindowResidency(Residency): ...

    RESIDENCY.build("window", {"k": 5})          # -> a WindowResidency with validated Params
    RESIDENCY.build("mypkg.policies:MyCache")    # an out-of-tree policy, loaded by import path

Registering a name twice raises. An unknown name raises `UnknownPolicyError` (a `KeyError` and a
`FlashsimError`) listing the valid names.

Discovery (`discover()`, run before any lookup): every module of the `sim.policies` package is
imported (found by `pkgutil`, so a new module there registers itself: there is no list to edit),
then every module named by an `ENTRY_POINT_GROUP` ("flashsim.policies") entry point of an
installed distribution, which is how a policy kept outside the repository registers its names:

    [project.entry-points."flashsim.policies"]
    mypolicy = "mypkg.mypolicy"

A name not found triggers one more pass over the entry points (a distribution installed or put on
`sys.path` after the first lookup) before the lookup fails.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from devices.errors import FlashsimError
from devices.suggest import hint
from sim.params import build_params
from sim.policies.base import (
    Layout,
    MissingHookError,
    Policy,
    Precision,
    Predictor,
    Prefetcher,
    Residency,
)

P = TypeVar("P", bound=Policy)

PACKAGE = "sim.policies"
ENTRY_POINT_GROUP = "flashsim.policies"


class UnknownPolicyError(FlashsimError, KeyError):
    """An unknown policy name; the message lists the valid names."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Registry(Generic[P]):
    """Name -> policy class for one slot."""

    def __init__(self, slot: str, base: type[P]):
        self.slot, self.base = slot, base
        self._classes: dict[str, type[P]] = {}

    def register(self, name: str) -> Callable[[type[P]], type[P]]:
        def deco(cls: type[P]) -> type[P]:
            if name in self._classes:
                raise ValueError(f"{self.slot} policy {name!r} is already registered "
                                 f"(by {self._classes[name].__qualname__})")
            if not issubclass(cls, self.base):
                raise TypeError(f"{cls.__qualname__} must subclass {self.base.__name__} to be a {self.slot} policy")
            cls.name = name
            self._classes[name] = cls
            return cls
        return deco

    def names(self) -> list[str]:
        discover()
        return sorted(self._classes)

    def get(self, name: str) -> type[P]:
        """The class registered as `name` (or at the import path "pkg.mod:Class"). A class that leaves
        one of its slot's abstract hooks unimplemented is refused (MissingHookError names the hook)."""
        discover()
        if ":" in name:
            return self._complete(self._load_path(name))
        if name not in self._classes:
            discover(entry_points_again=True)
        if name not in self._classes:
            raise UnknownPolicyError(f"unknown {self.slot} policy {name!r}; {hint(name, sorted(self._classes))}")
        return self._complete(self._classes[name])

    def _complete(self, cls: type[P]) -> type[P]:
        missing = sorted(getattr(cls, "__abstractmethods__", ()))
        if missing:
            raise MissingHookError(f"{self.slot} policy {cls.name!r} does not implement {self.base.__name__}."
                                   f"{missing[0]}, which every backend needs; implement it in the policy's module")
        return cls

    def _load_path(self, path: str) -> type[P]:
        # checked before and after import (sim/policies/external.py)
        from sim.policies.external import PolicyLoadError, load_policy_class

        try:
            cls = load_policy_class(path, self.base, self.slot)
        except PolicyLoadError as e:
            raise UnknownPolicyError(str(e)) from None
        if not cls.name:
            cls.name = path
        return cls

    def build(self, name: str, params: Mapping[str, Any] | None = None) -> P:
        """A policy instance with validated parameters (FlashsimError names a bad parameter)."""
        cls = self.get(name)
        return cls(build_params(cls.Params, params, name if ":" not in name else cls.name))

    def params_class(self, name: str) -> type:
        return self.get(name).Params


RESIDENCY: Registry[Residency] = Registry("residency", Residency)
PREDICTORS: Registry[Predictor] = Registry("predictor", Predictor)
LAYOUTS: Registry[Layout] = Registry("layout", Layout)
PREFETCHERS: Registry[Prefetcher] = Registry("prefetch", Prefetcher)
PRECISIONS: Registry[Precision] = Registry("precision", Precision)

REGISTRIES: dict[str, Registry[Any]] = {
    "residency": RESIDENCY, "predictor": PREDICTORS, "layout": LAYOUTS,
    "prefetch": PREFETCHERS, "precision": PRECISIONS,
}
SLOTS = tuple(REGISTRIES)

_discovered = False
_entry_points_seen: set[str] = set()


def discover(entry_points_again: bool = False) -> None:
    """Import every policy module (module doc): the `sim.policies` package's modules once, and the
    `flashsim.policies` entry points not imported yet (again when `entry_points_again`)."""
    global _discovered
    if _discovered and not entry_points_again:
        return
    if not _discovered:
        _discovered = True
        pkg = importlib.import_module(PACKAGE)
        for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
            importlib.import_module(f"{PACKAGE}.{info.name}")
    importlib.invalidate_caches()
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.value in _entry_points_seen:
            continue
        _entry_points_seen.add(ep.value)
        try:
            importlib.import_module(ep.module)
        except ImportError as e:
            raise UnknownPolicyError(f"entry point {ep.name!r} = {ep.value!r} of group {ENTRY_POINT_GROUP!r} "
                                     f"cannot be imported: {e}") from None




def all_policies() -> list[tuple[str, str]]:
    """[(slot, name)] of every registered policy, sorted: for tests and --list-params."""
    discover()
    return [(slot, n) for slot, reg in REGISTRIES.items() for n in reg.names()]


def find_slot(policy_name: str) -> str | None:
    """The slot a policy name belongs to (names are unique across slots), or None."""
    discover()
    hits = [slot for slot, reg in REGISTRIES.items() if policy_name in reg._classes]
    return hits[0] if len(hits) == 1 else None
