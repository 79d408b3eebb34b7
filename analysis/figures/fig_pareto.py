"""Figure: the Pareto front of speed, memory and quality over every configuration in the results.

x: `dram_peak_bytes` (GiB, or MiB below 1 GiB: the most DRAM the run held); y: `tokens_per_s`; colour:
`activation_mass_kept` (the quality proxy: share of |activation| mass computed). Configurations no
other one beats on all three (analysis.pareto) are ringed and labelled; the staircase is the
two-objective front (fastest at no more DRAM). One panel per device / model / trace.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure

from analysis import tables as T
from analysis.figures import common as C
from analysis.pareto import pareto_mask
from analysis.tables import ResultSet
from devices.errors import FlashsimError

KIND = "pareto"
INPUT = "results"
TITLE = "Pareto front: tokens/s x DRAM x quality"
MAX_LABELS = 10


def draw(results: ResultSet, where: Sequence[str] | None = None) -> Figure:
    df = C.filter_rows(results.ok, where, results.source)
    C.need_columns(df, [T.TOKENS_PER_S, T.DRAM_PEAK, T.MASS_KEPT], KIND)
    if len(df) < 2:
        raise FlashsimError(f"{KIND}: needs at least two successful points")
    groups = C.panels(df, (T.TRACE, T.MODEL, T.DEVICE), 4, KIND)
    fig = C.new_figure(8.0, 0.8 + 4.2 * len(groups))
    axes = fig.subplots(len(groups), 1, squeeze=False)[:, 0]
    q = df[T.MASS_KEPT].to_numpy(float)
    vmin, vmax = float(np.nanmin(q)), float(np.nanmax(q))
    if vmax - vmin < 1e-9:
        vmin, vmax = vmin - 0.01, vmax + 0.01
    sc = None
    unit_bytes, unit = (C.GIB, "GiB") if df[T.DRAM_PEAK].max() >= C.GIB else (C.MIB, "MiB")
    for ax, (title, g) in zip(axes, groups):
        front = pareto_mask(g, maximize=[T.TOKENS_PER_S, T.MASS_KEPT], minimize=[T.DRAM_PEAK])
        x = g[T.DRAM_PEAK].to_numpy(float) / unit_bytes
        y = g[T.TOKENS_PER_S].to_numpy(float)
        c = g[T.MASS_KEPT].to_numpy(float)
        ax.scatter(x[~front], y[~front], c=c[~front], cmap="viridis", vmin=vmin, vmax=vmax, s=22,
                   alpha=0.45, linewidths=0)
        sc = ax.scatter(x[front], y[front], c=c[front], cmap="viridis", vmin=vmin, vmax=vmax, s=60,
                   edgecolors="black", linewidths=1.2, zorder=3)
        order = np.argsort(x, kind="stable")  # the 2-D staircase: best speed at <= this DRAM
        best = np.maximum.accumulate(np.nan_to_num(y[order], nan=-np.inf))
        keep = np.r_[True, best[1:] > best[:-1]]
        ax.step(x[order][keep], best[keep], where="post", color="0.3", lw=1, zorder=2)
        labels = g[T.LABEL].to_numpy()
        shown: set[tuple] = set()
        for i in sorted(np.flatnonzero(front), key=lambda j: (x[j], y[j])):
            if (labels[i], x[i], y[i]) in shown or len(shown) >= MAX_LABELS:
                continue  # equal points (say, at two budgets that both suffice) get one label
            shown.add((labels[i], x[i], y[i]))
            below = len(shown) % 2 == 0  # alternate above/below: neighbours on the front stay legible
            ax.annotate(labels[i], (x[i], y[i]), textcoords="offset points", xytext=(6, -11 if below else 4),
                        fontsize=7)
        n_front = len({(a, b, q) for a, b, q in zip(x[front], y[front], c[front])})  # equal runs count once
        ax.set_title(title + f"   ({n_front} distinct point(s) on the front, ringed; {len(g)} runs)",
                     fontsize=10, loc="left")
        ax.set_ylabel("tokens / s")
        ax.set_ylim(bottom=0)
        ax.set_xlim(left=0, right=max(x.max() * 1.12, 1e-3))
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel(f"peak DRAM held ({unit})")
    fig.colorbar(sc, ax=list(axes), label="activation mass kept (quality proxy)", shrink=0.8)
    C.title(fig, TITLE, df)
    return fig
