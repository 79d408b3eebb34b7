"""Shared fixtures. Global RNGs are forbidden: flashsim owns its generators (sim/rng.py)."""

from __future__ import annotations

import numpy as np
import pytest

from devices.curves import TableReadCurve


@pytest.fixture(autouse=True)
def _no_global_rng(monkeypatch: pytest.MonkeyPatch) -> None:
    """Code under test must use named np.random.Generator streams, never NumPy's global one.

    (Python's `random` is left alone: hypothesis seeds it itself.)"""

    def _forbidden(*_a, **_k):
        raise AssertionError("global RNG used: use a seeded np.random.Generator instead")

    for name in ("random", "rand", "randn", "randint", "choice", "shuffle", "permutation"):
        monkeypatch.setattr(np.random, name, _forbidden)


@pytest.fixture
def tiny_curve() -> TableReadCurve:
    """A round-number read table: 4 KiB and 64 KiB chunks at 1 and 4 reads in flight."""
    return TableReadCurve((4096, 65536), (1, 4), ((1e8, 4e8), (1e9, 2e9)))
