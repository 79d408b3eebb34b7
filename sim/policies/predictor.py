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
from dataclasses import dataclass

import numpy as np

from devices.errors import FlashsimError
from sim import bitsets
from sim.params import check, param
from sim.policies.base import Predictor
from sim.policies.error_memory import (
    ErrorMemory,
    Persistence,
    false_positive_rate,
    persistent_noisy_sets,
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

    def predict(self, layer: int, steps: StepSlice, needed: np.ndarray) -> np.ndarray:
        assert self.ctx is not None
        memo = _memo(self.ctx.view, self.describe(), self.ctx.rng.seed)
        rows = None
        if memo is not None:
            with memo.lock:       # one thread draws a layer; runs on other threads wait and share it
                rows = memo.rows.get(layer)
                if rows is None and steps.start == 0:   # the whole layer once, for every run
                    rows = memo.rows[layer] = self._draw(layer, self.ctx.view.needed(layer, 0, self.ctx.view.steps.n))
        if rows is not None:
            return rows[steps.start:steps.stop]
        return self._draw(layer, needed)

    def _draw(self, layer: int, needed: np.ndarray) -> np.ndarray:
        assert self.ctx is not None
        st = self.state.get(layer)
        p = self.params
        if st is None:
            view = self.ctx.view
            n_true = bitsets.count(view.needed(layer, 0, view.steps.n))
            q_cap = float(false_positive_rate(n_true, self.ctx.n_neurons, p.recall, p.precision).max(initial=0.0))
            st = self.state[layer] = (self.ctx.rng.fresh(f"predictor/noisy/layer{layer}"),
                                      self.ctx.rng.fresh(f"predictor/noisy-memory/layer{layer}"), ErrorMemory(), q_cap)
        return persistent_noisy_sets(st[0], st[1], needed, self.ctx.n_neurons, p.recall, p.precision,
                                     p.persistence, st[2], q_cap=st[3])


# A noisy predictor's sets depend only on the trace view, its parameters and the seed, never on the
# device or the budget: a sweep or plan replaying one view draws them once per layer. Kept on the
# view (which `sim.engine.SetAlgebraCache` shares across runs) for layers of at most this size, for
# the most recent few parameter sets.
MEMO_BYTES_PER_LAYER = 8 << 20
MEMO_ENTRIES = 4
_MEMO_LOCK = threading.Lock()   # runs on threads (plan) share views


@dataclass
class _LayerMemo:
    """One parameter set's predicted rows per layer, and the lock a layer is drawn under."""

    rows: dict[int, np.ndarray]
    lock: threading.Lock


def _memo(view, describe: dict, seed: int) -> _LayerMemo | None:  # type: ignore[no-untyped-def]
    """The view's memo of one parameter set's predicted rows per layer (None: too large to keep)."""
    if view.steps.n * view.W * 8 > MEMO_BYTES_PER_LAYER:
        return None
    import json

    key = (json.dumps(describe, sort_keys=True, default=str), int(seed))
    with _MEMO_LOCK:
        store = view.__dict__.setdefault("_noisy_memo", {})
        if key not in store:
            while len(store) >= MEMO_ENTRIES:
                store.pop(next(iter(store)))
            store[key] = _LayerMemo({}, threading.Lock())
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
