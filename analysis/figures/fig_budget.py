"""Figure: decode speed (tokens/s) against the DRAM budget, one line per preset configuration.

x: `dram_budget_bytes` in GiB (a point swept at the device default is placed at the device's
available DRAM, read from its profile); y: `tokens_per_s`. Points that failed (a budget too small
for what must stay resident) are marked with an x on the axis in their configuration's colour, side by
side when several fail at one budget, so the smallest DRAM that works can be read off. Panels: one per
device / model / trace, each with its own budgets on its x axis (a device's budgets only).
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from analysis import tables as T
from analysis.figures import common as C
from analysis.tables import ResultSet
from devices.errors import FlashsimError
from devices.units import format_bytes

KIND = "budget"
INPUT = "results"
TITLE = "Decode speed vs DRAM budget"
MAX_SERIES = 20  # tab20 colours
DODGE = 0.6   # share of the gap between two budgets that the x marks of one budget spread over


def _color(i: int, n: int) -> object:
    """Matplotlib's default cycle for up to 10 lines, tab20 beyond."""
    return f"C{i}" if n <= 10 else plt.get_cmap("tab20")(i % 20)


def draw(results: ResultSet, where: Sequence[str] | None = None) -> Figure:
    df = C.filter_rows(results.table, where, results.source)
    C.need_columns(df, [T.TOKENS_PER_S, T.BUDGET, T.DEVICE], KIND)
    budget = [b if pd.notna(b) else C.device_available_bytes(str(d)) for b, d in zip(df[T.BUDGET], df[T.DEVICE])]
    df = df.assign(_budget_gib=pd.Series(budget, index=df.index, dtype=float) / C.GIB)
    if df["_budget_gib"].nunique() < 2:
        raise FlashsimError(f"{KIND}: needs results at two or more DRAM budgets "
                            "(e.g. `dram_budgets: [2GiB, 4GiB, 6GiB]`)")
    groups = C.panels(df, (T.TRACE, T.MODEL, T.DEVICE), 4, KIND)
    fig = C.new_figure(9.5, 1.0 + 3.4 * len(groups))
    axes = fig.subplots(len(groups), 1, squeeze=False)[:, 0]
    notes = []
    for ax, (title, g) in zip(axes, groups):
        notes.append(_panel(ax, title, g))
    axes[-1].set_xlabel("DRAM budget" + (" (evenly spaced: the budgets span more than 8x)" if any(notes) else " (GiB)"))
    C.title(fig, TITLE, df)
    return fig


def _panel(ax, title: str, g: pd.DataFrame) -> bool:
    """One panel, on the budgets of its own rows; True when they are evenly spaced (categorical)."""
    levels = sorted(g["_budget_gib"].unique())
    # Budgets spanning more than 8x (a device's whole DRAM next to a few hundred MiB) would crowd
    # the small ones into a corner: then each distinct budget gets an evenly spaced position.
    categorical = len(levels) > 1 and levels[-1] / levels[0] > 8
    pos = {b: (i if categorical else b) for i, b in enumerate(levels)}
    g = g.assign(_x=g["_budget_gib"].map(pos))
    step = 1.0 if categorical else (min(b - a for a, b in zip(levels, levels[1:])) if len(levels) > 1 else 1.0)
    order = g.assign(_r=g[T.PRESET].map(C.preset_rank)).sort_values("_r", kind="stable")
    labels = list(dict.fromkeys(order[T.LABEL]))
    if len(labels) > MAX_SERIES:
        raise C.TooCrowded(f"{KIND}: {len(labels)} configurations (at most {MAX_SERIES}); "
                           "narrow with --where KEY=VALUE")
    failed = g[g[T.STATUS] != "ok"] if T.STATUS in g else g.iloc[:0]
    # the configurations failing at each budget, in legend order: each gets its own slot beside the tick
    slots = {b: [lb for lb in labels if lb in set(failed.loc[failed["_budget_gib"] == b, T.LABEL])] for b in levels}
    for i, label in enumerate(labels):
        s = g[g[T.LABEL] == label].sort_values("_budget_gib")
        ok = s[s[T.STATUS] == "ok"] if T.STATUS in s else s
        bad = s[s[T.STATUS] != "ok"] if T.STATUS in s else s.iloc[:0]
        ax.plot(ok["_x"], ok[T.TOKENS_PER_S], "o-", color=_color(i, len(labels)), label=label)
        if len(bad):
            xs = []
            for b, x in zip(bad["_budget_gib"], bad["_x"]):
                n, k = len(slots[b]), slots[b].index(label)
                xs.append(x + (k - (n - 1) / 2) * (DODGE * step / max(n, 1)))
            ax.plot(xs, [0] * len(xs), "x", color=_color(i, len(labels)), ms=7, mew=2, clip_on=False)
    n_bad = len(failed)
    ax.set_title(title + (f"   (x: does not fit, {n_bad} points)" if n_bad else ""), fontsize=10, loc="left")
    ax.set_ylabel("tokens / s")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    if categorical:
        ax.set_xticks(range(len(levels)), [format_bytes(b * C.GIB) for b in levels], fontsize=8)
        ax.set_xlim(-0.5, len(levels) - 0.5)
    else:
        pad = 0.5 * step
        ax.set_xlim(levels[0] - pad, levels[-1] + pad)
    return categorical
