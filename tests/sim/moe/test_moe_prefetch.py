"""Speculative prefetch: the realised accuracy is the configured one, and errors persist with `memory`."""

from __future__ import annotations

import numpy as np
import pytest

from devices.errors import FlashsimError
from devices.moe_prefetch import family_accuracy
from sim.moe.prefetch import realised_accuracy, speculative_sets
from tests.sim.moe.routing_fixture import zipf_routing


@pytest.mark.parametrize("acc", [0.0, 0.6, 0.9, 1.0])
def test_accuracy_is_as_configured(acc) -> None:
    e, _ = zipf_routing(250, 3, 32, 4, reuse=0.0, seed=1)
    pred = speculative_sets(e, 32, acc, 0.5, np.random.default_rng(0))
    assert (pred[:, 0] == -1).all()
    # a kept wrong guess can become right when a later token picks it: at most (1 - acc) * K / E more
    assert acc - 0.04 <= realised_accuracy(pred, e) <= acc + 0.04 + (1 - acc) * 4 / 32


def test_errors_persist_with_memory() -> None:
    e, _ = zipf_routing(600, 2, 32, 2, reuse=0.0, seed=2)

    def repeat(mem: float) -> float:
        pred = speculative_sets(e, 32, 0.7, mem, np.random.default_rng(3))
        err = pred[:, 1] != e[:, 1]                 # per rank: the slot's guess is not the true expert
        prev, cur = err[:-1], err[1:]
        return float((prev & cur).sum() / max(prev.sum(), 1))

    assert repeat(0.0) == pytest.approx(0.3, abs=0.06)      # memoryless: P(error | error) = 1 - accuracy
    assert repeat(0.8) > repeat(0.0) + 0.3


def test_bad_inputs() -> None:
    e, _ = zipf_routing(4, 2, 8, 2, seed=0)
    with pytest.raises(FlashsimError, match="accuracy"):
        speculative_sets(e, 8, 1.5, 0.0, np.random.default_rng(0))
    with pytest.raises(FlashsimError, match="memory"):
        speculative_sets(e, 8, 0.5, 1.0, np.random.default_rng(0))


def test_default_accuracy_is_what_a_run_realises() -> None:
    """Hand-computed: n = 400 tokens x 2 predicted layers x K 4 = 3200 slots at p = 0.797, so the realised
    recall is within 4 standard errors (4 * sqrt(p (1 - p) / n) = 0.028) of p, plus at most (1 - p) K / E =
    0.025 from wrong guesses that a token happens to pick anyway."""
    p = family_accuracy("qwen3_moe").accuracy
    e, _ = zipf_routing(400, 3, 32, 4, reuse=0.0, seed=5)
    got = realised_accuracy(speculative_sets(e, 32, p, 0.0, np.random.default_rng(1)), e)
    se = np.sqrt(p * (1 - p) / (400 * 2 * 4))
    assert p - 4 * se <= got <= p + 4 * se + (1 - p) * 4 / 32
