"""The energy figure (analysis/figures/fig_energy.py): its bars are the table's own millijoules,
stacked; points without energy numbers are left out; a table with none is refused (issue 46)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from analysis.figures import draw_figure, make_figure
from analysis.tables import ENERGY_MJ, JOULES_PER_TOKEN, load_results
from devices.errors import FlashsimError
from tests.analysis.sweep_helpers import results_table


def with_energy(tmp_path: Path, blank: int = 0) -> Path:
    df = results_table()
    ok = df["status"] == "ok"
    for j, col in enumerate(ENERGY_MJ):   # flash, dram, compute, static: 1, 2, 3, 4 x the row number
        df[col] = np.where(ok, (j + 1) * (df["point_index"] + 1.0), np.nan)
    df[JOULES_PER_TOKEN] = df[list(ENERGY_MJ)].sum(axis=1, min_count=1) / 1e3
    if blank:
        df.loc[df.index[:blank], [*ENERGY_MJ, JOULES_PER_TOKEN]] = np.nan
    path = tmp_path / "results.parquet"
    df.to_parquet(path)
    return path


def test_bars_are_the_tables_millijoules(tmp_path: Path) -> None:
    path = with_energy(tmp_path)
    rs = load_results(path)
    fig = draw_figure("energy", rs, where=["dram_budget_bytes=2147483648"])
    ax = fig.axes[0]
    bars = ax.patches
    n = len(bars) // 4
    widths = np.array([b.get_width() for b in bars]).reshape(4, n)       # one row per component
    ends = np.array([b.get_x() + b.get_width() for b in bars]).reshape(4, n)
    rows = rs.ok[rs.ok["dram_budget_bytes"] == 2**31].copy()
    assert n == len(rows)
    assert sorted(widths[0]) == sorted(rows[ENERGY_MJ[0]])                # flash, as in the table
    assert sorted(ends[-1]) == pytest.approx(sorted(1e3 * rows[JOULES_PER_TOKEN]))  # the stack's end: the total


def test_points_without_energy_are_left_out_and_said(tmp_path: Path) -> None:
    fig = draw_figure("energy", load_results(with_energy(tmp_path, blank=2)), where=["dram_budget_bytes=2147483648"])
    assert "2 points without energy numbers left out" in fig.texts[0].get_text() + "".join(
        t.get_text() for t in fig.texts)
    assert make_figure("energy", with_energy(tmp_path), tmp_path / "out", where=["dram_budget_bytes=2147483648"])


def test_no_energy_at_all_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "r.parquet"
    results_table().to_parquet(path)
    with pytest.raises(FlashsimError, match="energy"):
        draw_figure("energy", load_results(path))
