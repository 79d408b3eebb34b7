"""Named random streams depend only on (seed, name)."""

from __future__ import annotations

import numpy as np
import pytest

from sim.rng import RngStreams


def test_streams_are_named_and_reproducible() -> None:
    a, b = RngStreams(7), RngStreams(7)
    x = a.get("predictor/layer0").random(4)
    b.get("other").random(100)                      # another consumer first: no effect
    assert np.array_equal(b.get("predictor/layer0").random(4), x)
    assert not np.array_equal(a.get("predictor/layer1").random(4), RngStreams(7).get("predictor/layer0").random(4))
    assert not np.array_equal(RngStreams(8).get("predictor/layer0").random(4), x)
    assert np.array_equal(a.fresh("predictor/layer0").random(4), x)


def test_bad_seed() -> None:
    with pytest.raises(ValueError, match="seed"):
        RngStreams(-1)
