"""Expert-cache policies for MoE runs: the base class, its hooks, and a registry of its own.

An expert cache holds whole routed experts (one key per (MoE layer, expert): key = m * E + e). Its
capacity is counted in expert slots, either per MoE layer (`scope="layer"`: every layer owns
`capacity` slots, as mlx-moe's per-layer capacity) or shared by all layers (`scope="global"`: one
pool of `capacity` slots, as a GPU cache of N GB or the OS page cache). The residency engine
(sim/moe/residency.py) walks the trace in decode order (token t, then MoE layer m) and asks the
policy only through these hooks:

- `bind(ctx)`: once, before the walk; ctx holds the shape, the capacity and the whole access
  sequence (offline policies such as Belady and the pinned hot set read it; online ones must not).
- `touch(step, keys)`: the keys the router picked at this step (hits and misses), after the hit
  test; online policies update recency and frequency here.
- `initial() -> keys`: experts loaded before the first token (a pinned set; default none).
- `admit(step, keys) -> bool[len(keys)]`: which missed keys to keep after use (default all). A
  policy that declines streams the expert through the staging buffer without caching it.
- `victims(step, candidates, n) -> keys`: n keys to evict, from `candidates` (resident, in the
  scope's pool, not used at this step). The default evicts the lowest `score`.
- `score(step, keys) -> float[len(keys)]`: keep-priority (higher stays), for the default `victims`.
- `choose(step, missed, pool, keys, room) -> (inserted, evicted)`: the whole decision after a step
  (default: `admit`, then `victims` among the pool's keys not used at this step). Belady overrides
  it: after a step the cache may hold any subset of its residents and this step's experts.
- `reroute(step, keys, weights, resident)`: cache-aware routing only (default: unchanged).

Policies are plain Python (no SimPy); the timing model never reads their state.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from devices.errors import FlashsimError, unknown_name
from sim.params import build_params

Scope = Literal["layer", "global"]


@dataclass(frozen=True)
class CacheContext:
    """What a policy may know before the walk. `steps_keys[s]` are the keys requested at step s
    (s = t * M + m), in router order; `steps_keys` is offline knowledge (Belady, pinned profile)."""

    n_layers: int              # MoE layers (M)
    n_experts: int             # E
    capacity: int              # slots per layer (scope "layer") or in all (scope "global")
    scope: Scope
    steps_keys: np.ndarray     # int64 [S, K]

    @property
    def n_keys(self) -> int:
        return self.n_layers * self.n_experts


class ExpertCache:
    """Base of every expert-cache policy; see the module docstring for the hooks."""

    name: ClassVar[str] = ""
    #: reads of missed experts go through the OS page cache as faults of read-around size, one
    #: at a time, instead of one contiguous read per expert issued together
    page_faults: ClassVar[bool] = False
    #: the scope this policy forces (None: the run's)
    forced_scope: ClassVar[Scope | None] = None
    #: rewrites the router's choice (its quality cost is reported); excluded from the Belady bound
    reroutes: ClassVar[bool] = False
    #: per-layer walks may batch a token's layers (sim/moe/residency_layers.py): the policy defines
    #: `touch_many` and `score_many` and keeps the default `choose` (admit all, evict the lowest score)
    vectorised: ClassVar[bool] = False
    #: False: misses are never kept (a static set); the batched walk skips insertion
    admits_any: ClassVar[bool] = True

    @dataclass(frozen=True)
    class Params:
        pass

    def __init__(self, params: Any = None):
        self.params = params if params is not None else self.Params()
        self.ctx: CacheContext | None = None

    def bind(self, ctx: CacheContext) -> None:
        self.ctx = ctx

    def touch(self, step: int, keys: np.ndarray) -> None:
        """Called with the keys used at `step`."""

    def initial(self) -> np.ndarray:
        return np.zeros(0, np.int64)

    def admit(self, step: int, keys: np.ndarray) -> np.ndarray:
        return np.ones(len(keys), bool)

    def touch_many(self, steps: np.ndarray, keys: np.ndarray) -> None:
        """`touch` for one token's layers at once: keys [M, K] used at steps [M]."""
        for s, k in zip(steps, keys):
            self.touch(int(s), k)

    def score_many(self, steps: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """`score` of keys [M, X] at each layer's step [M] (row m holds layer m's keys)."""
        return np.stack([self.score(int(s), k) for s, k in zip(steps, keys)])

    def score(self, step: int, keys: np.ndarray) -> np.ndarray:
        raise NotImplementedError(f"{type(self).__name__} must define score() or victims()")

    def victims(self, step: int, candidates: np.ndarray, n: int) -> np.ndarray:
        s = self.score(step, candidates)
        order = np.lexsort((candidates, s))      # lowest score first, ties by key: deterministic
        return candidates[order[:n]]

    def choose(self, step: int, missed: np.ndarray, pool: np.ndarray, keys: np.ndarray,
               room: int) -> tuple[np.ndarray, np.ndarray]:
        """Missed keys to insert and pool keys to evict, with len(inserted) - len(evicted) <= room."""
        ins = missed[self.admit(step, missed)]
        need = len(ins) - room
        if need <= 0:
            return ins, np.zeros(0, np.int64)
        cand = pool[~np.isin(pool, keys)]
        v = self.victims(step, cand, min(need, len(cand)))
        return ins[:len(ins) - need + len(v)], v

    def reroute(self, step: int, keys: np.ndarray, weights: np.ndarray,
                resident: np.ndarray) -> tuple[np.ndarray, float]:
        """New keys for this step and the router-weight mass replaced (default: none)."""
        return keys, 0.0

    def describe(self) -> dict[str, Any]:
        from sim.params import params_to_dict

        return {"name": self.name, "params": params_to_dict(self.params)}


# ---- registry ----------------------------------------------------------------------------------------
# Every module of sim/moe/policies/ is found by pkgutil (as sim/policies/registry.py finds the dense
# slots' policies), so a new expert-cache policy is one module there, with no list to edit.
_CLASSES: dict[str, type[ExpertCache]] = {}
_discovered = False


def register(name: str) -> Callable[[type[ExpertCache]], type[ExpertCache]]:
    def deco(cls: type[ExpertCache]) -> type[ExpertCache]:
        if name in _CLASSES:
            raise ValueError(f"expert-cache policy {name!r} is already registered")
        if not issubclass(cls, ExpertCache):
            raise TypeError(f"{cls.__qualname__} must subclass ExpertCache")
        cls.name = name
        _CLASSES[name] = cls
        return cls
    return deco


def _load() -> None:
    global _discovered
    if _discovered:
        return
    import sim.moe.policies as pkg

    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        importlib.import_module(f"{pkg.__name__}.{info.name}")
    _discovered = True


def cache_names() -> list[str]:
    _load()
    return sorted(_CLASSES)


def build_cache(name: str, params: Mapping[str, Any] | None = None) -> ExpertCache:
    """An expert-cache policy by name with validated parameters; FlashsimError lists the names."""
    _load()
    if name not in _CLASSES:
        raise unknown_name("expert-cache policy", name, _CLASSES)
    cls = _CLASSES[name]
    return cls(build_params(cls.Params, params, f"expert cache {name}"))


def parse_cache_arg(text: str) -> tuple[str, dict[str, Any]]:
    """'lru' or 'pinned:profile_tokens=64' -> (name, params) with numbers parsed."""
    name, _, rest = text.partition(":")
    params: dict[str, Any] = {}
    for part in filter(None, rest.split(",")):
        k, eq, v = part.partition("=")
        if not eq:
            raise FlashsimError(f"--expert-cache {text!r}: expected NAME or NAME:key=value,...")
        try:
            params[k.strip()] = int(v) if v.strip().lstrip("-").isdigit() else float(v)
        except ValueError:
            params[k.strip()] = v.strip()
    return name.strip(), params
