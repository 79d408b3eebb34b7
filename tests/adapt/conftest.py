"""Fixtures for the adaptation tests: a tiny block model, a hand-made GSI document, a fake step timer."""

from __future__ import annotations

import math

import numpy as np
import pytest

from adapt.importance import make_gsi_document
from sim.blocks import BlockMemory, block_names


def tiny_blocks() -> BlockMemory:
    """2 layers: mha 100 B + 10 B/token of KV, ffn 300 B; always-resident 50 B."""
    return BlockMemory(names=block_names(2), weight_bytes=np.array([100, 300, 100, 300], np.int64),
                       kv_bytes_per_token=np.array([10, 0, 10, 0], np.int64), always_bytes=50)


def tiny_doc(steps: int = 2) -> dict:
    """GSI of a 2-layer model: dense 10; GSI removes mha:1 (ppl 11), then ffn:0 (ppl 15), mha:0 (40),
    ffn:1 (1000); one-shot: mha:1 11, mha:0 12, ffn:0 14, ffn:1 900 (ascending)."""
    gsi = [("mha:1", 11.0), ("ffn:0", 15.0), ("mha:0", 40.0), ("ffn:1", 1000.0)][:steps]
    one = [("mha:1", 11.0), ("mha:0", 12.0), ("ffn:0", 14.0), ("ffn:1", 900.0)]
    return make_gsi_document(dense_ppl=10.0, gsi=gsi, one_shot=one, model_name="tiny", n_layers=2,
                             text_sha256="0" * 64, text_source="builtin", n_tokens=8)


class FakeTimer:
    """A StepTimer stand-in: every decode step takes 1 ms + 0.25 ms per kept block (no simulator)."""

    def __init__(self, n_steps: int):
        self.n_steps, self.runs = n_steps, 0

    def steps(self, dropped: np.ndarray, settings: tuple[str, ...] = ()) -> tuple[np.ndarray, np.ndarray]:
        t = 1e-3 + 0.25e-3 * float((~np.asarray(dropped)).sum())
        return np.full(self.n_steps, t), np.zeros(self.n_steps, np.int64)


@pytest.fixture
def blocks() -> BlockMemory:
    return tiny_blocks()


@pytest.fixture
def doc() -> dict:
    return tiny_doc()


def log(x: float) -> float:
    return math.log(x)
