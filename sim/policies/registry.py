"""Registries of policies, one per slot: register with a decorator, build by name with parameters.

    @RESIDENCY.register("window")
    class WindowResidency(Residency): ...

    RESIDENCY.build("window", {"k": 5})          # -> a WindowResidency with validated Params
    RESIDENCY.build("mypkg.policies:MyCache")    # an out-of-tree policy, loaded by import path

Registering a name twice raises. An unknown name raises `UnknownPolicyError` (a `KeyError` and a
`FlashsimError`) listing the valid names. Modules of the built-in policies are imported by
`load_builtin()` so the registries are complete before any lookup.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from devices.errors import FlashsimError
from sim.params import build_params
from sim.policies.base import Layout, Policy, Precision, Predictor, Prefetcher, Residency

P = TypeVar("P", bound=Policy)

BUILTIN_MODULES = (
    "sim.policies.naive", "sim.policies.hybrid", "sim.policies.window", "sim.policies.dense",
    "sim.policies.mmap", "sim.policies.selective", "sim.policies.predictor", "sim.policies.bundling",
    "sim.policies.prefetch", "sim.policies.quantized",
)


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
        load_builtin()
        return sorted(self._classes)

    def get(self, name: str) -> type[P]:
        load_builtin()
        if ":" in name:
            return self._load_path(name)
        if name not in self._classes:
            raise UnknownPolicyError(
                f"unknown {self.slot} policy {name!r}; valid: {', '.join(sorted(self._classes))}")
        return self._classes[name]

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

_loaded = False


def load_builtin() -> None:
    """Import the built-in policy modules (idempotent)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for m in BUILTIN_MODULES:
        importlib.import_module(m)


def all_policies() -> list[tuple[str, str]]:
    """[(slot, name)] of every registered policy, sorted: for tests and --list-params."""
    load_builtin()
    return [(slot, n) for slot, reg in REGISTRIES.items() for n in reg.names()]


def find_slot(policy_name: str) -> str | None:
    """The slot a built-in policy name belongs to (names are unique across slots), or None."""
    load_builtin()
    hits = [slot for slot, reg in REGISTRIES.items() if policy_name in reg._classes]
    return hits[0] if len(hits) == 1 else None
