"""Predictor slot: which FFN neurons each step computes.

- `none`: every neuron (dense FFN).
- `oracle`: exactly the trace's active set (the union over the step's tokens).
- `noisy`: the active set seen through a predictor of given recall and precision. Each active
  neuron is kept with probability `recall`; each inactive one is added with the probability that
  makes the expected precision `precision` (false positives cost bytes, false negatives cost
  quality). Draws come from one seeded stream per layer, consumed step by step, so a range and
  the same steps one at a time draw identical numbers.
- `recorded`: a real predictor's output stored as a trace directory of the same shape, whose masks
  are the predicted sets (any tool that writes the trace format can provide them).

`rank` (all but `none`) is the cost model of a low-rank predictor (LLM in a flash / Deja Vu):
per layer a d_model x r and an r x d_ff matrix, resident in DRAM and run before each FFN.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from devices.errors import FlashsimError
from sim import bitsets
from sim.params import check, param
from sim.policies.base import Predictor, StepSlice
from sim.policies.registry import PREDICTORS

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

    def predict(self, layer: int, steps: StepSlice, needed: np.ndarray) -> np.ndarray:
        return needed


def noisy_sets(rng: np.random.Generator, truth: np.ndarray, n_bits: int, recall: float,
               precision: float) -> np.ndarray:
    """The sets a predictor of this recall/precision would output (words [S, W]); one uniform
    draw per neuron per row, in row order."""
    t = bitsets.unpack(truth, n_bits)
    u = rng.random(t.shape, dtype=np.float32)
    keep = t & (u < recall)
    n_true = t.sum(axis=1)
    tp = recall * n_true
    fp = tp * (1.0 - precision) / precision
    q = np.where(n_bits - n_true > 0, fp / np.maximum(n_bits - n_true, 1), 0.0)
    add = ~t & (u < q[:, None].astype(np.float32))
    return bitsets.pack(keep | add)


@PREDICTORS.register("noisy")
class NoisyPredictor(_RankedPredictor):
    """The active set through a predictor with the given recall and precision (seeded)."""

    @dataclass(frozen=True)
    class Params:
        recall: float = param(0.95, "fraction of truly active neurons predicted active")
        precision: float = param(0.5, "fraction of predicted neurons that are truly active")
        rank: int = param(128, RANK_HELP)

        def __post_init__(self) -> None:
            check(0.0 <= self.recall <= 1.0, f"recall must be in [0, 1], got {self.recall}")
            check(0.0 < self.precision <= 1.0, f"precision must be in (0, 1], got {self.precision}")
            check(self.rank >= 0, f"rank must be >= 0, got {self.rank}")

    def predict(self, layer: int, steps: StepSlice, needed: np.ndarray) -> np.ndarray:
        assert self.ctx is not None
        rng = self.state.get(layer)
        if rng is None:
            rng = self.state[layer] = self.ctx.rng.fresh(f"predictor/noisy/layer{layer}")
        return noisy_sets(rng, needed, self.ctx.n_neurons, self.params.recall, self.params.precision)


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
