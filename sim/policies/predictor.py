"""Predictor slot: which FFN neurons each step computes.

- `none`: every neuron (dense FFN).
- `oracle`: exactly the trace's active set (the union over the step's tokens).
- `noisy`: the active set seen through a predictor of given recall and precision. Each active
  neuron is kept with probability `recall`; each inactive one is added with the probability that
  makes the expected precision `precision` (false positives cost bytes, false negatives cost
  quality). Its errors have memory (`sim.policies.error_memory`): a real predictor over-predicts
  and misses the SAME neurons on consecutive tokens, which a window then keeps resident.
  `fp_memory`/`fn_memory` say how much more often than chance an error repeats at the next step,
  `*_far` at distant steps; the defaults are measured on a trained low-rank predictor (below).
  All four 0: fresh draws every step (the memoryless predictor, identical sets to `noisy_sets`).
  Draws come from seeded streams per layer, consumed step by step, so a range and the same steps
  one at a time draw identical numbers.
- `recorded`: a real predictor's output stored as a trace directory of the same shape, whose masks
  are the predicted sets (any tool that writes the trace format can provide them).

`rank` (all but `none`) is the cost model of a low-rank predictor (LLM in a flash / Deja Vu):
per layer a d_model x r and an r x d_ff matrix, resident in DRAM and run before each FFN.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from devices.errors import FlashsimError
from sim import bitsets
from sim.params import check, param
from sim.policies.base import Predictor
from sim.policies.error_memory import (
    ErrorMemory,
    Persistence,
    dense_noisy_sets,
    false_positive_rate,
    persistent_noisy_sets,
    sparse_applies,
)
from sim.policies.registry import PREDICTORS
from sim.workload import StepSlice

# `noisy`'s error memory m = (P(error at s+1 | error at s) - rate) / (1 - rate), and its floor at
# distant steps (`sim.policies.error_memory`), measured with `flashsim real predictor-errors`
# (docs/replay.md, "Predictor errors with memory"): SmolLM2-135M, LLM in a flash's low-rank
# predictor of rank 32 (`real train-predictor --sparsity topk:0.25 --threshold 0.25
# --max-new-tokens 32 --holdout 0.5`), its 10 held-out builtin prompts (chat template), consecutive
# generated tokens (320 tokens x 30 layers), far = at 5 tokens (the window's k; flat by then). Mean
# of thresholds 0.25 and 0.15 (false-positive rates 0.34 / 0.71, miss rates 0.44 / 0.16):
# FP 0.402 / 0.406, far 0.359 / 0.363; misses 0.479 / 0.425, far 0.441 / 0.375.
FP_MEMORY = 0.40
FP_MEMORY_FAR = 0.36
FN_MEMORY = 0.45
FN_MEMORY_FAR = 0.41

RANK_HELP = ("rank r of the low-rank predictor whose cost is charged: r*(d_model+d_ff) weights per "
             "layer resident and 2*r*(d_model+d_ff) FLOPs per token and layer (0: free)")


class _RankedPredictor(Predictor):
    def weight_bytes_per_layer(self) -> int:
        assert self.ctx is not None
        spec = self.ctx.spec
        return int(np.ceil(self.params.rank * (spec.d_model + spec.d_ff) * spec.dtype_bytes))

    def flops_per_token_per_layer(self) -> float:
        assert self.ctx is not None
        spec = self.ctx.spec
        return 2.0 * self.params.rank * (spec.d_model + spec.d_ff)


@PREDICTORS.register("none")
class DensePredictor(Predictor):
    """Compute every FFN neuron."""

    def computes_every_neuron(self) -> bool:
        return True

    def sets_from_the_model(self) -> bool:
        return True

    def predict(self, layer: int, steps: StepSlice, needed: np.ndarray) -> np.ndarray:
        assert self.ctx is not None
        return np.broadcast_to(bitsets.full(self.ctx.n_neurons), needed.shape).copy()


@PREDICTORS.register("oracle")
class OraclePredictor(_RankedPredictor):
    """Compute exactly the active neurons."""

    @dataclass(frozen=True)
    class Params:
        rank: int = param(0, RANK_HELP)

        def __post_init__(self) -> None:
            check(self.rank >= 0, f"rank must be >= 0, got {self.rank}")

    def sets_from_the_model(self) -> bool:
        return True

    def predict(self, layer: int, steps: StepSlice, needed: np.ndarray) -> np.ndarray:
        return needed


def noisy_sets(rng: np.random.Generator, truth: np.ndarray, n_bits: int, recall: float,
               precision: float) -> np.ndarray:
    """The sets a memoryless predictor of this recall/precision would output (words [S, W]); one
    uniform draw per neuron per row, in row order: an active neuron is kept below `recall`, an
    inactive one added below the false-positive rate of its row."""
    return persistent_noisy_sets(rng, rng, truth, n_bits, recall, precision, Persistence(), ErrorMemory())


@PREDICTORS.register("noisy")
class NoisyPredictor(_RankedPredictor):
    """The active set through a predictor with the given recall, precision and error persistence
    (seeded)."""

    @dataclass(frozen=True)
    class Params:
        recall: float = param(0.95, "fraction of truly active neurons predicted active")
        precision: float = param(0.5, "fraction of predicted neurons that are truly active")
        fp_memory: float = param(FP_MEMORY, "false positives repeating beyond chance at the next step: "
                                 "(P(FP at s+1 | FP at s, inactive at s+1) - q) / (1 - q), q the FP rate; "
                                 "0: memoryless, 1: the same neurons every step")
        fp_memory_far: float = param(FP_MEMORY_FAR, "the same at distant steps (the neurons' lasting bias; "
                                     "0: a one-step chain)")
        fn_memory: float = param(FN_MEMORY, "misses repeating beyond chance at the next step: (P(miss at s+1 | "
                                 "miss at s, active at s+1) - (1 - recall)) / recall")
        fn_memory_far: float = param(FN_MEMORY_FAR, "the same at distant steps (0: a one-step chain)")
        rank: int = param(128, RANK_HELP)

        def __post_init__(self) -> None:
            check(0.0 <= self.recall <= 1.0, f"recall must be in [0, 1], got {self.recall}")
            check(0.0 < self.precision <= 1.0, f"precision must be in (0, 1], got {self.precision}")
            for kind in ("fp", "fn"):
                near, far = getattr(self, f"{kind}_memory"), getattr(self, f"{kind}_memory_far")
                check(0.0 <= near <= 1.0, f"{kind}_memory must be in [0, 1], got {near}")
                check(0.0 <= far <= near, f"{kind}_memory_far must be in [0, {kind}_memory={near}] "
                                          f"(errors cannot repeat more at distant steps than at the next), got {far}")
            check(self.rank >= 0, f"rank must be >= 0, got {self.rank}")

        @property
        def persistence(self) -> Persistence:
            return Persistence(self.fp_memory, self.fp_memory_far, self.fn_memory, self.fn_memory_far)

    @property
    def rates(self) -> tuple[float, float]:
        return (self.params.recall, self.params.precision)

    def bind(self, ctx) -> None:  # type: ignore[no-untyped-def]
        super().bind(ctx)
        family = _family(ctx.view, self.params.persistence, ctx.rng.seed)
        if family is not None:       # runs bound on this view draw each layer's latents once for all of them
            family.announce(self.rates)

    def predict(self, layer: int, steps: StepSlice, needed: np.ndarray) -> np.ndarray:
        assert self.ctx is not None
        family = _family(self.ctx.view, self.params.persistence, self.ctx.rng.seed)
        rows = None
        if family is not None:
            lock = family.layer_lock(layer)   # one thread draws a layer; runs on other threads share it
            if not lock.acquire(blocking=False):
                self._draw_ahead(family, layer + 1)   # while another run draws this layer: the next one
                lock.acquire()
            try:
                rows = family.get(self.rates, layer)
                if rows is None and steps.start == 0:   # the whole layer once, for every run
                    rows = self._draw_family(family, layer)
            finally:
                lock.release()
        if rows is not None:
            return rows[steps.start:steps.stop]
        return self._draw(layer, needed)

    def _q_cap(self, n_true: np.ndarray, rates: tuple[float, float]) -> float:
        assert self.ctx is not None
        return float(false_positive_rate(n_true, self.ctx.n_neurons, *rates).max(initial=0.0))

    def _draw(self, layer: int, needed: np.ndarray) -> np.ndarray:
        assert self.ctx is not None
        st = self.state.get(layer)
        p = self.params
        if st is None:
            view = self.ctx.view
            q_cap = self._q_cap(bitsets.count(view.needed(layer, 0, view.steps.n)), self.rates)
            st = self.state[layer] = (*self._streams(layer), ErrorMemory(), q_cap)
        return persistent_noisy_sets(st[0], st[1], needed, self.ctx.n_neurons, p.recall, p.precision,
                                     p.persistence, st[2], q_cap=st[3])

    def _streams(self, layer: int) -> tuple[np.random.Generator, np.random.Generator]:
        assert self.ctx is not None
        rng = self.ctx.rng
        return rng.fresh(f"predictor/noisy/layer{layer}"), rng.fresh(f"predictor/noisy-memory/layer{layer}")

    def _draw_ahead(self, family: _Family, layer: int) -> None:
        """Draw `layer` for the family unless it is drawn or being drawn (or past the last layer)."""
        assert self.ctx is not None
        if layer >= self.ctx.view.n_layers:
            return
        lock = family.layer_lock(layer)
        if lock.acquire(blocking=False):
            try:
                if family.get(self.rates, layer) is None:
                    self._draw_family(family, layer)
            finally:
                lock.release()

    def _draw_family(self, family: _Family, layer: int) -> np.ndarray:
        """This layer's whole rows for this predictor, kept in the family with those of every other
        announced (recall, precision) that lacks them and takes the same dense draws."""
        assert self.ctx is not None
        view, p, n = self.ctx.view, self.params, self.ctx.n_neurons
        truth = view.needed(layer, 0, view.steps.n)
        n_true = bitsets.count(truth)
        q_cap = self._q_cap(n_true, self.rates)
        if sparse_applies(p.recall, p.persistence, q_cap):     # its own numbers (sim/policies/sparse_errors.py)
            rates = [self.rates]
            drawn = [persistent_noisy_sets(*self._streams(layer), truth, n, p.recall, p.precision, p.persistence,
                                           ErrorMemory(), q_cap=q_cap)]
        else:
            with family.lock:
                others = [r for r in family.announced if r != self.rates and layer not in family.rows.get(r, {})]
            rates = [self.rates] + [r for r in others if not sparse_applies(r[0], p.persistence, self._q_cap(n_true, r))]
            drawn = dense_noisy_sets(*self._streams(layer), truth, n, rates, p.persistence, ErrorMemory())
        with family.lock:
            for r, rows in zip(rates, drawn):
                family.rows.setdefault(r, {})[layer] = rows
        return drawn[0]


# A noisy predictor's sets depend only on the trace view, its parameters and the seed, never on the
# device or the budget: a sweep or plan replaying one view draws them once per layer. Predictors
# with the same error memory take the same latents from the same streams and differ only in the
# thresholds (recall, precision): one draw serves all those bound to runs on the view. Kept on the
# view (which `sim.set_cache.SetAlgebraCache` shares across runs) for layers of at most this size,
# for the two most recent error memories and, in each, the four most recent (recall, precision).
MEMO_BYTES_PER_LAYER = 8 << 20
MEMO_FAMILIES = 2
MEMO_ENTRIES = 4
_MEMO_LOCK = threading.Lock()   # runs on threads (plan) share views


@dataclass
class _Family:
    """The predicted rows per (recall, precision) and layer of the noisy predictors of one error memory
    and seed on one view; the pairs announced by runs bound to it; the lock a layer is drawn under."""

    rows: dict[tuple[float, float], dict[int, np.ndarray]] = field(default_factory=dict)
    announced: dict[tuple[float, float], None] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    layer_locks: dict[int, threading.Lock] = field(default_factory=dict)

    def announce(self, rates: tuple[float, float]) -> None:
        with self.lock:
            self.announced.pop(rates, None)
            self.announced[rates] = None         # the most recent last
            for old in list(self.announced)[:-MEMO_ENTRIES]:
                del self.announced[old]
                self.rows.pop(old, None)

    def get(self, rates: tuple[float, float], layer: int) -> np.ndarray | None:
        with self.lock:
            return self.rows.get(rates, {}).get(layer)

    def layer_lock(self, layer: int) -> threading.Lock:
        """The lock a layer is drawn under: a run waits only for the layer it needs, so one run can use
        layer l while another draws layer l + 1."""
        with self.lock:
            return self.layer_locks.setdefault(layer, threading.Lock())


def _family(view, persistence: Persistence, seed: int) -> _Family | None:  # type: ignore[no-untyped-def]
    """The view's memo of the noisy predictors with this error memory and seed (None: too large to keep)."""
    if view.steps.n * view.W * 8 > MEMO_BYTES_PER_LAYER:
        return None
    key = (persistence, int(seed))
    with _MEMO_LOCK:
        store = view.__dict__.setdefault("_noisy_memo", {})
        if key not in store:
            while len(store) >= MEMO_FAMILIES:
                store.pop(next(iter(store)))
            store[key] = _Family()
        return store[key]


@PREDICTORS.register("recorded")
class RecordedPredictor(_RankedPredictor):
    """Predicted sets read from a trace directory of the same shape (its masks are predictions)."""

    @dataclass(frozen=True)
    class Params:
        path: str = param("", "trace directory whose masks are the recorded predictions")
        rank: int = param(128, RANK_HELP)

        def __post_init__(self) -> None:
            check(bool(self.path), "path must name a trace directory of recorded predictions")
            check(self.rank >= 0, f"rank must be >= 0, got {self.rank}")

    def sets_from_the_model(self) -> bool:
        return True

    def bind(self, ctx) -> None:  # type: ignore[no-untyped-def]
        from traces.format import open_trace

        super().bind(ctx)
        rec = open_trace(self.params.path)
        src = ctx.view.trace
        if (rec.n_layers, rec.n_tokens, rec.n_neurons) != (src.n_layers, src.n_tokens, src.n_neurons):
            raise FlashsimError(
                f"recorded.path {self.params.path}: {rec.n_layers} layers x {rec.n_tokens} tokens x "
                f"{rec.n_neurons} neurons, but the replayed trace has {src.n_layers} x {src.n_tokens} x "
                f"{src.n_neurons}; record predictions for the same trace")
        self.recorded_view = ctx.view.with_trace(rec)

    def reset(self) -> None:
        self.state = {}

    def predict(self, layer: int, steps: StepSlice, needed: np.ndarray) -> np.ndarray:
        return self.recorded_view.needed(layer, steps.start, steps.stop)
