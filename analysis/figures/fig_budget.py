"""Figure: decode speed (tokens/s) against the DRAM budget, one line per preset configuration.

x: `dram_budget_bytes` in GiB (a point swept at the device default is placed at the device's
available DRAM, read from its profile); y: `tokens_per_s`. Points that failed (a budget too small
for what must stay resident) are marked with an x on the axis, so the smallest DRAM that works can
be read off. Panels: one per device / model / trace.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from analysis import tables as T
from analysis.figures import common as C
from analysis.tables import ResultSet
from devices import load_profile
from devices.errors import FlashsimError
from devices.units import format_bytes

KIND = "budget"
INPUT = "results"
TITLE = "Decode speed vs DRAM budget"
MAX_SERIES = 20  # tab20 colours


@lru_cache(maxsize=32)
def _available_bytes(device: str) -> int:
    return load_profile(device).available_bytes


def _color(i: int, n: int) -> object:
    """Matplotlib's default cycle for up to 10 lines, tab20 beyond."""
    return f"C{i}" if n <= 10 else plt.get_cmap("tab20")(i % 20)


def draw(results: ResultSet, where: Sequence[str] | None = None) -> Figure:
    df = C.filter_rows(results.table, where, results.source)
    C.need_columns(df, [T.TOKENS_PER_S, T.BUDGET, T.DEVICE], KIND)
    budget = [b if pd.notna(b) else _available_bytes(d) for b, d in zip(df[T.BUDGET], df[T.DEVICE])]
    df = df.assign(_budget_gib=pd.Series(budget, index=df.index, dtype=float) / C.GIB)
    if df["_budget_gib"].nunique() < 2:
        raise FlashsimError(f"{KIND}: needs results at two or more DRAM budgets "
                            "(e.g. `dram_budgets: [2GiB, 4GiB, 6GiB]`)")
    levels = sorted(df["_budget_gib"].unique())
    # Budgets spanning more than 8x (a device's whole DRAM next to a few hundred MiB) would crowd
    # the small ones into a corner: then each distinct budget gets an evenly spaced position.
    categorical = levels[-1] / levels[0] > 8
    df = df.assign(_x=df["_budget_gib"].map({b: i for i, b in enumerate(levels)}) if categorical
                   else df["_budget_gib"])
    groups = C.panels(df, (T.TRACE, T.MODEL, T.DEVICE), 4, KIND)
    fig = C.new_figure(9.5, 1.0 + 3.4 * len(groups))
    axes = fig.subplots(len(groups), 1, squeeze=False)[:, 0]
    for ax, (title, g) in zip(axes, groups):
        order = g.assign(_r=g[T.PRESET].map(C.preset_rank)).sort_values("_r", kind="stable")
        labels = list(dict.fromkeys(order[T.LABEL]))
        if len(labels) > MAX_SERIES:
            raise C.TooCrowded(f"{KIND}: {len(labels)} configurations (at most {MAX_SERIES}); "
                                "narrow with --where KEY=VALUE")
        for i, label in enumerate(labels):
            s = g[g[T.LABEL] == label].sort_values("_budget_gib")
            ok = s[s[T.STATUS] == "ok"] if T.STATUS in s else s
            bad = s[s[T.STATUS] != "ok"] if T.STATUS in s else s.iloc[:0]
            ax.plot(ok["_x"], ok[T.TOKENS_PER_S], "o-", color=_color(i, len(labels)), label=label)
            if len(bad):
                ax.plot(bad["_x"], [0] * len(bad), "x", color=_color(i, len(labels)), ms=8, mew=2,
                        clip_on=False)
        ax.set_title(title + ("   (x: does not fit)" if (g.get(T.STATUS, "ok") != "ok").any() else ""),
                     fontsize=10, loc="left")
        ax.set_ylabel("tokens / s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    if categorical:
        for ax in axes:
            ax.set_xticks(range(len(levels)), [format_bytes(b * C.GIB) for b in levels], fontsize=8)
        axes[-1].set_xlabel("DRAM budget (evenly spaced: the budgets span more than 8x)")
    else:
        axes[-1].set_xlabel("DRAM budget (GiB)")
    C.title(fig, TITLE, df)
    return fig
