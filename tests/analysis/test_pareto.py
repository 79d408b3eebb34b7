"""Pareto fronts: hand-made cases and the defining property."""

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.pareto import pareto_mask


def test_hand_made_front() -> None:
    df = pd.DataFrame({"tps": [10, 8, 12, 12, 5, np.nan], "dram": [4, 2, 6, 6, 2, 1]})
    # (12, 6) twice: ties kept; (5, 2) is beaten by (8, 2); NaN never on the front
    assert pareto_mask(df, maximize=["tps"], minimize=["dram"]).tolist() == [True, True, True, True, False, False]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5), st.integers(0, 5)), min_size=1, max_size=40))
def test_front_is_exactly_the_undominated_rows(rows: list) -> None:
    df = pd.DataFrame(rows, columns=["a", "b", "c"])
    mask = pareto_mask(df, maximize=["a", "c"], minimize=["b"])
    v = np.stack([df.a, -df.b, df.c], axis=1)
    for i in range(len(v)):
        dominated = any(np.all(v[j] >= v[i]) and np.any(v[j] > v[i]) for j in range(len(v)))
        assert mask[i] == (not dominated)
