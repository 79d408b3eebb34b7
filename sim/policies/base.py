"""Policy interfaces: the hooks every policy slot offers, when they are called, and what they return.

A run is configured by filling five orthogonal **slots**, each with one registered policy:

    residency   what stays in DRAM across tokens, what is read from flash   naive, hybrid, window, dense,
                                                                           mmap, selective
    predictor   which FFN neurons each step computes                       none, oracle, noisy, recorded
    layout      how neurons lie on flash and become reads                  bundling
    prefetch    what is read ahead of need, and when                       none, lookahead, delta
    precision   the stored weight format                                   native, quantized

Policies are plain Python (no SimPy, no `yield`): the simulator calls them vectorised over a
range of steps of ONE layer, the real backend calls the very same objects with ranges of length 1,
one token at a time. State that must survive between calls (a window's last k computed sets, an
LRU's recency, a noisy predictor's random stream) lives in `self.state`, per layer, so running a
range in one call or step by step gives identical results (tested for every policy).

Units and representations: neuron sets are packed bit rows (`sim.bitsets`): words [S, W] for S steps
of one layer. Steps are described by `sim.workload.StepSlice` (absolute step indices, phase, tokens per step).
Sizes are bytes, times seconds.

Hook reference. Every question a backend (the DES engine `sim.engine`, its analytic fast path
`sim.fastpath`, the real executor `real.runtime.backend`) asks a policy is a method or a class
attribute declared on the slot's base class below, documented there; no backend reads a policy's
`state`, compares its name or looks its parameters up. Planning hooks, called by
`sim.policies.stack.PolicyStack` in this order for each layer and range of steps:

1. `Precision.transform(spec)` once before binding: the ModelSpec all other policies see.
2. `Policy.bind(ctx)` once per run: receives the `PolicyContext`; resets state.
3. `Residency.static_mask(layer)` once per layer: neurons resident for the whole run (loaded
   before the first token; counted as fixed memory). Default: none.
4. `Residency.allowed(layer, steps)`: neurons each step MAY compute (SelectInfer's static+dynamic
   sets), or None for no restriction.
5. `Predictor.predict(layer, steps, needed)` -> words [S, W]: the neurons each step computes,
   given the true active sets `needed` (the union over the step's tokens). Called exactly once per
   step, in step order.
6. `Prefetcher.predict(layer, steps, computed)` -> words [S, W]: the prediction, made before each
   step, of that step's computed set (what to read ahead); `Prefetcher.issue_point()` says whether
   and when the read is issued (`IssuePoint`).
7. `Residency.advance(layer, steps, computed, next_hint, cap_neurons)` -> `CacheSteps`: the
   demand reads, prefetch reads, hits, evictions and cache sizes of each step (cap_neurons has
   one entry per step plus one for the following step).
8. `Residency.on_budget_change(cap_neurons)` when the DRAM budget changes during a run (the
   simulator's budget timeline): shrink caches to fit at least.

Hooks the backends ask besides planning (each documented on its method): the residency's
`window_k`, `kept`, `copies_on_insert`, `params_for_in_place_reads`, `dynamic_bytes`, the page-granular
`advance_pages` / `miss_cost` / `shrink_bytes`, and its flags `manages_cache`, `page_granular`,
`gathers` / `gathers_at`; the predictor's `computes_every_neuron`, `weight_bytes_per_layer`,
`flops_per_token_per_layer`; the layout's `read_counts`, `chunk_sizes`, `read_units`,
`staged_reads`, `segmented_reads`, `dram_bytes_per_neuron`, `bundled`, `max_coalesced_bytes`,
`alignment_bytes`, `params_aligned_to`; every policy's `timing_feedback`. A hook whose base
implementation is marked `@optional_hook` raises `MissingHookError` (one line naming the hook) when
a policy that does not implement it is asked; `require_hooks(policy, backend, *hooks)` lets a
backend refuse such a policy before it starts.

Policy output is checked in one place, `PolicyStack` (`PolicyOutputError`): shapes and dtypes,
no neuron outside the layer, every demand read a computed neuron.
"""

from __future__ import annotations

import copy
import enum
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn, TypeVar

import numpy as np

from devices.errors import FlashsimError
from sim import bitsets
from sim.params import params_to_dict

if TYPE_CHECKING:
    from devices.curves import ReadCurve
    from devices.model_spec import ModelSpec
    from devices.schema import DeviceProfile
    from sim.rng import RngStreams
    from sim.workload import StepSlice, TraceView


class MissingHookError(FlashsimError):
    """A backend asked a policy a question (a hook) the policy does not answer."""


F = TypeVar("F", bound=Callable[..., Any])


def optional_hook(fn: F) -> F:
    """Marks a base-class hook whose default only refuses: a policy that needs it overrides it."""
    fn.__optional_hook__ = True  # type: ignore[attr-defined]
    return fn


def implements(policy: Policy, hook: str) -> bool:
    """True when `policy` answers `hook` (its class overrides the refusing default)."""
    return not getattr(getattr(type(policy), hook, None), "__optional_hook__", False)


def require_hooks(policy: Policy, backend: str, *hooks: str) -> None:
    """Refuse `policy` before a run when it does not implement one of `hooks` that `backend` asks."""
    for hook in hooks:
        if not implements(policy, hook):
            policy.missing_hook(hook, backend)


@dataclass
class PolicyContext:
    """Everything a policy may look at. Built by the engine (or the real backend) once per run."""

    spec: ModelSpec                 # the model as stored (after the precision policy)
    profile: DeviceProfile
    budget_bytes: int               # DRAM budget at the start of the run
    rng: RngStreams
    view: TraceView                 # activations as the run sees them (workload and rescale applied)
    notes: list[str] = field(default_factory=list)   # things results must say (e.g. self-profiled)

    @property
    def n_layers(self) -> int:
        return self.spec.n_layers

    @property
    def n_neurons(self) -> int:
        return self.spec.d_ff


class Policy(ABC):  # noqa: B024 (the slot classes below declare the abstract hooks)
    """A plug-in: its `Params` dataclass, a name given by the registry, and per-layer state."""

    slot: ClassVar[str] = ""
    name: ClassVar[str] = ""                 # set by Registry.register
    timing_feedback: ClassVar[bool] = False  # True: its effect depends on simulated time (no fast path)

    @dataclass(frozen=True)
    class Params:
        """No parameters."""

    def __init__(self, params: Any = None):
        self.params = params if params is not None else type(self).Params()
        self.ctx: PolicyContext | None = None
        self.state: dict[Any, Any] = {}

    def bind(self, ctx: PolicyContext) -> None:
        """Attach to a run's context and start from empty state."""
        self.ctx = ctx
        self.reset()

    def reset(self) -> None:
        self.state = {}

    def snapshot(self) -> Any:
        return copy.deepcopy(self.state)

    def restore(self, snap: Any) -> None:
        self.state = copy.deepcopy(snap)

    @property
    def W(self) -> int:
        assert self.ctx is not None, f"{self.name}: bind() first"
        return bitsets.n_words(self.ctx.n_neurons)

    def describe(self) -> dict[str, Any]:
        """Name and resolved parameters, for the results' `config`."""
        return {"name": self.name, **params_to_dict(self.params)}

    def missing_hook(self, hook: str, backend: str = "this run") -> NoReturn:
        """Raise the one-line MissingHookError naming the slot's hook `hook`."""
        base = next(c for c in type(self).__mro__ if c.__dict__.get("slot"))
        raise MissingHookError(f"{self.slot} policy {self.name or type(self).__name__!r} does not implement "
                               f"{base.__name__}.{hook}, which {backend} needs; implement it in the policy's module "
                               f"or choose another {self.slot} policy")


# ---- slot interfaces ---------------------------------------------------------------------------
class Precision(Policy):
    """Stored weight format. `transform` returns the ModelSpec every other part of the run uses."""

    slot = "precision"

    @abstractmethod
    def transform(self, spec: ModelSpec) -> ModelSpec: ...


class Predictor(Policy):
    """Chooses the neurons each step computes."""

    slot = "predictor"

    @abstractmethod
    def predict(self, layer: int, steps: StepSlice, needed: np.ndarray) -> np.ndarray:
        """words [S, W]: computed neurons of `layer` at each step; `needed` is the true active union."""

    def weight_bytes_per_layer(self) -> int:
        """DRAM held by the predictor's own weights for one layer (0 for oracles)."""
        return 0

    def flops_per_token_per_layer(self) -> float:
        """Compute the predictor itself costs per token and layer."""
        return 0.0

    def computes_every_neuron(self) -> bool:
        """True when every step computes every FFN neuron (no prediction): what a page-granular
        residency (mmap, dense compute over mapped weights) can run with."""
        return False

    def sets_from_the_model(self) -> bool:
        """True when the real backend's model mode can compute exactly this predictor's sets from the
        model it runs (the true active sets, or a recorded mask trace); a predictor simulated from
        statistics (recall, precision, error persistence) cannot be executed on a real model."""
        return False


class Layout(Policy):
    """How FFN neurons lie on flash and how a set of neurons becomes reads."""

    slot = "layout"

    @abstractmethod
    def staged_reads(self) -> bool:
        """Reads land in a staging buffer and are copied out (priced by the profile's
        `flash.staged_s_per_read`); layouts that do not say so read in place."""
        return False

    def segmented_reads(self) -> bool:
        """A read of a run of r units lands in place in r discontiguous buffers (one iovec per unit),
        paying r - 1 extra segments (the profile's `flash.segment_s`); layouts that do not say so
        land each read in one buffer."""
        return False

    def read_units(self) -> tuple[int, int]:
        """(unit_bytes, units_per_neuron): one neuron is `units_per_neuron` reads of `unit_bytes`
        when nothing coalesces (bundled: 1 x bundle; unbundled: one row per FFN matrix)."""

    @abstractmethod
    def read_counts(self, layer: int, words: np.ndarray) -> np.ndarray:
        """int64 [S, G]: reads of each chunk size `chunk_sizes()[g]` needed to fetch each row's set."""

    @abstractmethod
    def chunk_sizes(self) -> np.ndarray:
        """int64 [G]: the chunk sizes `read_counts` counts, in bytes."""

    def max_chunk_bytes(self) -> int:
        """Largest single read: also used to stream large contiguous tensors (attention, lm_head)."""
        return int(self.chunk_sizes()[-1])

    @optional_hook
    def dram_bytes_per_neuron(self, spec: ModelSpec) -> int:
        """Bytes one cached neuron takes in DRAM (the memory model's `neuron_bytes`); `spec` as stored."""
        self.missing_hook("dram_bytes_per_neuron")

    @optional_hook
    def bundled(self) -> bool:
        """True when a neuron's rows of every FFN matrix lie together on flash (one unit per neuron),
        False when each matrix lies apart (one unit per matrix row). The real backend reads the
        store's file of that layout."""
        self.missing_hook("bundled")

    @optional_hook
    def max_coalesced_bytes(self) -> int:
        """Largest single read that units adjacent on flash are merged into (0: never merged); the
        real backend's reader cuts its reads at this size so they are the chunks `read_counts` counts."""
        self.missing_hook("max_coalesced_bytes")

    def alignment_bytes(self) -> int:
        """Each unit occupies its size rounded up to a multiple of this on flash (0: packed). May be
        called before `bind`."""
        return 0

    @optional_hook
    def params_aligned_to(self, align_bytes: int) -> Any:
        """This layout's Params with units aligned to `align_bytes` (a store's padding), for the run
        the real backend builds on that store. May be called before `bind`."""
        if align_bytes == self.alignment_bytes():
            return self.params
        self.missing_hook("params_aligned_to")


class IssuePoint(enum.Enum):
    """When a prefetcher's reads for (step s, layer l) are issued."""

    NONE = "none"                      # nothing is read ahead
    PREVIOUS_STEP = "previous-step"    # at the end of layer l of step s - 1 (delta prefetch)
    PREVIOUS_LAYER = "previous-layer"  # at the FFN start of layer l - 1 of step s (lookahead)


class Prefetcher(Policy):
    """Predicts each step's computed set ahead of time so its reads overlap earlier compute.

    `trigger` (an IssuePoint, or its value as a string) says when: PREVIOUS_STEP (issued while the
    previous step computes this layer: delta prefetch), PREVIOUS_LAYER (issued while this step
    computes the previous layer: lookahead), or NONE. Backends ask `issue_point()`."""

    slot = "prefetch"
    trigger: ClassVar[IssuePoint | str] = IssuePoint.NONE

    def issue_point(self) -> IssuePoint:
        """Whether and when this prefetcher's reads are issued (see IssuePoint)."""
        try:
            return IssuePoint(self.trigger)
        except ValueError:
            raise MissingHookError(f"prefetch policy {self.name!r}: trigger {self.trigger!r} is not one of "
                                   f"{', '.join(p.value for p in IssuePoint)} (Prefetcher.issue_point)") from None

    def fires(self) -> bool:
        """True when anything is read ahead (`issue_point()` is not NONE)."""
        return self.issue_point() is not IssuePoint.NONE

    @abstractmethod
    def predict(self, layer: int, steps: StepSlice, computed: np.ndarray) -> np.ndarray:
        """words [S, W]: predicted computed set of each step in `steps`, made before the step."""


@dataclass
class CacheSteps:
    """What a residency policy decided for S steps of one layer (dynamic part; static excluded).

    demand     words [S, W]  read on demand before the step's FFN (computed, not resident)
    prefetch   words [S, W]  read ahead DURING step s for step s+1 (or for step s itself when the
                             prefetcher's trigger is previous-layer: the engine re-labels)
    hits       int [S]       computed neurons already resident (static included by the stack)
    before     int [S]       dynamic cache size when the step reaches this layer (incl. prefetched)
    after      int [S]       dynamic cache size kept for the next step (incl. its prefetch)
    peak       int [S]       largest dynamic size of this layer during the step
    inserted   int [S]       neurons written into the cache (demand + prefetch)
    evicted    int [S]       neurons removed from the cache
    """

    demand: np.ndarray
    prefetch: np.ndarray
    hits: np.ndarray
    before: np.ndarray
    after: np.ndarray
    peak: np.ndarray
    inserted: np.ndarray
    evicted: np.ndarray

    @staticmethod
    def concat(parts: list[CacheSteps]) -> CacheSteps:
        return CacheSteps(*(np.concatenate([getattr(p, f) for p in parts])
                            for f in ("demand", "prefetch", "hits", "before", "after", "peak",
                                      "inserted", "evicted")))


class CapacityError(Exception):
    """A step's computed set does not fit the layer's cache share (converted to FlashsimError)."""

    def __init__(self, layer: int, step: int, need_neurons: int, cap_neurons: int):
        super().__init__(f"step {step}, layer {layer}: {need_neurons} neurons computed, cache holds {cap_neurons}")
        self.layer, self.step, self.need, self.cap = layer, step, need_neurons, cap_neurons


class Residency(Policy):
    """Decides what stays resident and what is read. Subclasses set the static set and the cache."""

    slot = "residency"
    #: True when demand reads go into a managed cache matrix (insert/evict rows: memory-management
    #: cost), False when they stream through a buffer and are dropped after the layer.
    manages_cache: ClassVar[bool] = False
    #: True for page-granular policies (mmap) that plan the whole model's reads themselves.
    page_granular: ClassVar[bool] = False
    #: True when the FFN gathers its computed rows out of the cache matrix every step (the set
    #: changes per token and the rows sit in arrival order), every neuron computed included: a
    #: window run that keeps every neuron gathers all of them, as real.runtime.backend does. False when
    #: computed rows are already contiguous: streamed into a fresh buffer (naive), or a set fixed
    #: for the whole decode that is compacted once (SelectInfer's static + dynamic neurons).
    gathers: ClassVar[bool] = True

    def gathers_at(self, n_computed: np.ndarray) -> np.ndarray:
        """bool like n_computed [S, ...]: where a step's FFN gathers its computed rows (`gathers`)."""
        return np.full(np.shape(n_computed), self.gathers)

    def static_mask(self, layer: int) -> np.ndarray:
        """words [W]: neurons resident for the whole run (default: none)."""
        return np.zeros(self.W, bitsets.WORD)

    def allowed(self, layer: int, steps: StepSlice) -> np.ndarray | None:
        """words [S, W] of neurons each step may compute, or None (no restriction)."""
        return None

    @abstractmethod
    def advance(self, layer: int, steps: StepSlice, computed: np.ndarray, next_hint: np.ndarray | None,
                cap_neurons: np.ndarray) -> CacheSteps:
        """Cache decisions for `steps` of `layer`.

        computed   words [S, W] dynamic computed sets (static neurons already removed)
        next_hint  words [S, W] prefetcher's prediction for step s+1 (None: no prefetch)
        cap_neurons int [S+1]   this layer's share of the DRAM left for caches, in neurons, during
                                each step and (last entry) during the step after the range: what
                                is kept at the end of a step must fit the next step's share
        """

    def on_budget_change(self, cap_neurons: int | np.ndarray) -> np.ndarray:
        """Shrink every layer's cache to at most `cap_neurons` (one int, or int [L] per layer);
        returns the evicted count per layer."""
        return np.zeros(self.ctx.n_layers if self.ctx else 0, np.int64)

    def dynamic_bytes(self, neuron_bytes: int | None = None) -> int:
        """Bytes held right now by this policy's caches (beyond its static set); `neuron_bytes`: DRAM
        per cached neuron (the layout's `dram_bytes_per_neuron`; None: the packed bundle)."""
        return 0

    @optional_hook
    def window_k(self) -> int | None:
        """Steps a computed neuron stays resident in the managed cache (None: unbounded, an LRU under
        the cap; 0: nothing kept across steps). Asked of residencies that `manages_cache` (the
        cache split between layers, `memory.cache_split`)."""
        self.missing_hook("window_k")

    @optional_hook
    def kept(self, layer: int) -> np.ndarray:
        """words [W]: the dynamic neurons of `layer` kept resident after the last step `advance`
        planned (its prefetch for the next step included, static set excluded). The real backend
        deletes every other row of the layer's cache matrix."""
        self.missing_hook("kept")

    def copies_on_insert(self) -> bool:
        """True when new neurons are read into a staging buffer and copied into the cache matrix
        (memory management moves them a second time); False when reads land in their rows."""
        return False

    def params_for_in_place_reads(self) -> Any:
        """This residency's Params for a backend whose reads land straight in the cache rows (the
        real backend's reader): `copies_on_insert()` false. May be called before `bind`."""
        return self.params

    # page-granular residencies (`page_granular = True`) plan whole steps instead of `advance`
    @optional_hook
    def advance_pages(self, start: int, stop: int, cap_bytes: np.ndarray) -> dict[str, np.ndarray]:
        """Misses of steps [start, stop): {"attn", "ffn"}: int [S, L] read-ahead windows missed,
        "head": int [S], "ffn_hit_neurons": int [S, L], "cached_bytes": int [S]."""
        self.missing_hook("advance_pages")

    @optional_hook
    def miss_cost(self, misses: np.ndarray, curve: ReadCurve) -> tuple[np.ndarray, np.ndarray]:
        """(seconds, bytes) to serve `misses` windows issued together, on the flash read `curve`."""
        self.missing_hook("miss_cost")

    @optional_hook
    def shrink_bytes(self, cap_bytes: int) -> None:
        """A budget drop: evict until the page cache holds at most `cap_bytes`."""
        self.missing_hook("shrink_bytes")
