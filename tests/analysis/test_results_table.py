"""Issue 55: `load_results` reads as a pandas table (`r.shape`, `r.to_pandas()`), the route
docs/sweep-plot-report.md shows."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.tables import ResultSet, load_results
from sim.metric_names import MS_PER_TOKEN, TOKENS_PER_S


@pytest.fixture
def results_file(tmp_path):
    path = tmp_path / "results.csv"
    pd.DataFrame({"preset": ["naive", "llm-in-a-flash", "llm-in-a-flash"], "status": ["ok", "ok", "error"],
                  "overrides_json": ["{}", '{"window.k": 2}', '{"window.k": 4}'],
                  MS_PER_TOKEN: [100.0, 20.0, None], TOKENS_PER_S: [10.0, 50.0, None]}).to_csv(path, index=False)
    return path


def test_issue55_results_are_a_dataframe(results_file) -> None:
    r = load_results(results_file)
    df = r.to_pandas()
    assert isinstance(df, pd.DataFrame) and df is r.table
    assert r.shape == df.shape == (3, 7)          # five columns, plus param.window.k and label
    assert list(r.columns) == list(df.columns) and len(r) == 3
    assert r[TOKENS_PER_S].max() == 50.0
    assert r.groupby("preset")[MS_PER_TOKEN].min().to_dict() == {"llm-in-a-flash": 20.0, "naive": 100.0}
    assert list(r.ok["label"]) == ["naive", "llm-in-a-flash[window.k=2]"]   # ResultSet's own view stays


def test_missing_attributes_still_raise(results_file) -> None:
    r = load_results(results_file)
    with pytest.raises(AttributeError):
        r.no_such_column_or_method   # noqa: B018
    with pytest.raises(AttributeError):
        r.__no_such_dunder__   # noqa: B018
    assert isinstance(r, ResultSet) and r.n_expected is None
