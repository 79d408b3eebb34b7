"""Figure: energy per decoded token broken into flash reads, DRAM traffic, compute and static power.

One horizontal bar per configuration (ordered naive -> hybrid -> mmap -> ... -> dense), stacked from
the results' own energy columns (millijoules per token, sim/energy.py): flash (storage active while
reading), DRAM (bytes moved), compute (FLOPs and busy time) and static (the platform's idle power
over the token's time); the total is written at the end of each bar. The numbers behind each
component come from the device profile's energy section, each with its source (docs/energy.md).
Panels: one per device / model / trace / budget combination; points on devices without energy
numbers are left out and the figure says how many.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from analysis import tables as T
from analysis.figures import common as C
from analysis.tables import ResultSet
from devices.errors import FlashsimError

KIND = "energy"
INPUT = "results"
TITLE = "Energy per decoded token by component"
COLORS = {"flash": "#4C72B0", "dram": "#DD8452", "compute": "#55A868", "static": "#AAAAAA"}
NAMES = {"flash": "flash reads", "dram": "DRAM traffic", "compute": "compute", "static": "static power over the token"}
MAX_BARS = 24


def draw(results: ResultSet, where: Sequence[str] | None = None) -> Figure:
    df = C.filter_rows(results.ok, where, results.source)
    if df.empty:
        raise FlashsimError(f"{KIND}: no point of the results ran successfully")
    C.need_columns(df, [T.JOULES_PER_TOKEN, *T.ENERGY_MJ], KIND)
    known = df[T.JOULES_PER_TOKEN].notna()
    if not known.any():
        raise FlashsimError(f"{KIND}: no point has energy numbers (their device profiles have no energy section)")
    left_out = int((~known).sum())
    df = df[known]
    fig, axes = C.bar_panels(df, KIND, MAX_BARS, 0.38, _panel, "millijoules per decoded token")
    handles = [Patch(color=COLORS[c], label=NAMES[c]) for c in T.ENERGY_COMPONENTS]
    fig.legend(handles=handles, loc="outside lower center", ncol=4, fontsize=8, frameon=False)
    C.title(fig, TITLE + (f" ({left_out} points without energy numbers left out)" if left_out else ""), df)
    return fig


def _panel(ax, g) -> None:
    y = np.arange(len(g))
    left = np.zeros(len(g))
    for comp, col in zip(T.ENERGY_COMPONENTS, T.ENERGY_MJ):
        v = np.nan_to_num(g[col].to_numpy(float))
        ax.barh(y, v, left=left, height=0.6, color=COLORS[comp])
        left += v
    xmax = float(np.nanmax(left)) if len(left) else 0.0
    for yi, t in zip(y, left):
        ax.text(t + 0.01 * xmax, yi, f"{t:.3g} mJ", va="center", fontsize=8)
    ax.set_yticks(y, g[T.LABEL].tolist(), fontsize=8)
    ax.set_ylim(len(g) - 0.4, -0.7)
    ax.set_xlim(0, xmax * 1.18 if xmax > 0 else 1)
    ax.grid(axis="x", alpha=0.3)
