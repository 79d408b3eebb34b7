"""Figure: memory footprint and budget over time under runtime adaptation, with the controllers' actions.

Input: a memory records table (`t_s`, `resident_bytes`, `budget_bytes`) as written by
`flashsim adapt eval --plot DIR` (DIR/adapt_records.csv), which adds `controller`, `timeline`,
`n_dropped` and `action` ("drop mha:5", "restore ffn:3", "" when nothing changed) per decode step.
One panel per timeline: the budget (black, dashed step line) and each controller's footprint (a
coloured step line); actions are marked on the footprint line (a down triangle where the controller
dropped blocks, an up triangle where it restored some); steps over budget are shaded red. A lower
strip shows the number of dropped blocks. Time in ms (or s for episodes of a second or more), sizes
in MiB (GiB above 1 GiB).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from analysis import tables as T
from analysis.figures import common as C
from devices.errors import FlashsimError

KIND = "adapt"
INPUT = "records"
TITLE = "Footprint and budget over time, with the controllers' actions"


def draw(records: pd.DataFrame, timeline: str | None = None) -> Figure:
    df = records.copy()
    for col, default in (("controller", "run"), ("timeline", ""), ("action", ""), ("n_dropped", np.nan)):
        if col not in df:
            df[col] = default
    df["action"] = df["action"].fillna("").astype(str)
    if timeline is not None:
        df = df[df["timeline"].astype(str) == timeline]
        if df.empty:
            raise FlashsimError(f"adapt figure: no rows for timeline {timeline!r}")
    timelines = list(dict.fromkeys(df["timeline"].astype(str)))
    controllers = list(dict.fromkeys(df["controller"].astype(str)))
    t_all = df[T.T_S].to_numpy(float)
    scale, tunit = (1.0, "s") if np.nanmax(t_all) >= 1.0 else (1e3, "ms")
    peak = max(df[T.RESIDENT_BYTES].max(), df[T.BUDGET_BYTES].max())
    ubytes, uname = (C.GIB, "GiB") if peak >= C.GIB else (C.MIB, "MiB")
    fig = C.new_figure(8.5, 3.2 * len(timelines) + 0.6)
    grid = fig.add_gridspec(2 * len(timelines), 1, height_ratios=[3, 1] * len(timelines))
    palette = ["C0", "C1", "C2", "C4", "C5", "C6", "C7", "C8", "C9"]   # C3 (red) marks over-budget steps
    colors = {c: palette[i % len(palette)] for i, c in enumerate(controllers)}
    for k, tl in enumerate(timelines):
        ax = fig.add_subplot(grid[2 * k])
        ax2 = fig.add_subplot(grid[2 * k + 1], sharex=ax)
        sub = df[df["timeline"].astype(str) == tl]
        # the budget is the same function of time for every controller: draw it from the longest episode
        longest = sub.loc[sub[T.T_S].idxmax(), "controller"]
        lg = sub[sub["controller"] == longest].sort_values(T.T_S, kind="stable")
        ax.step(lg[T.T_S].to_numpy(float) * scale, lg[T.BUDGET_BYTES].to_numpy(float) / ubytes, where="post",
                color="black", ls="--", lw=1.2, label="available")
        for c in controllers:
            g = sub[sub["controller"].astype(str) == c].sort_values(T.T_S, kind="stable")
            if g.empty:
                continue
            x = g[T.T_S].to_numpy(float) * scale
            fp = g[T.RESIDENT_BYTES].to_numpy(float) / ubytes
            bud = g[T.BUDGET_BYTES].to_numpy(float) / ubytes
            ax.step(x, fp, where="post", color=colors[c], lw=1.3, label=c)
            over = fp > bud
            if over.any():
                ax.fill_between(x, bud, fp, where=over, step="post", color="C3", alpha=0.3)
            act = g["action"].to_numpy(str)
            drop = np.array(["drop" in a for a in act])
            back = np.array(["restore" in a for a in act])
            ax.plot(x[drop], fp[drop], "v", color=colors[c], ms=5, ls="none")
            ax.plot(x[back], fp[back], "^", color=colors[c], ms=5, ls="none", mfc="white")
            ax2.step(x, g["n_dropped"].to_numpy(float), where="post", color=colors[c], lw=1.1)
        ax.set_title(f"timeline {tl}" if tl else TITLE, fontsize=9)
        ax.set_ylabel(uname)
        ax.grid(alpha=0.3)
        ax2.set_ylabel("dropped")
        ax2.grid(alpha=0.3)
        if k == 0:
            ax.plot([], [], "kv", ls="none", label="drop")
            ax.plot([], [], "k^", ls="none", mfc="white", label="restore")
            ax.legend(fontsize=7, ncol=3, loc="lower left")
        if k == len(timelines) - 1:
            ax2.set_xlabel(f"simulated time ({tunit})")
    return fig
