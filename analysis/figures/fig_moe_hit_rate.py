"""Figure: expert-cache hit rate against cache size, one line per policy (analysis/moe_curves.py
`hit_rate_curve`). x: the cache as a share of all routed experts; y: hit rate; Belady dashed (the bound)."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from analysis.figures import common as C

KIND = "moe_hit_rate"
INPUT = "moe hit-rate curve"
TITLE = "Expert-cache hit rate vs cache size"


def draw(df: pd.DataFrame, title: str = TITLE) -> Figure:
    fig = C.new_figure(7.0, 4.2)
    ax = fig.subplots()
    for pol, g in df.groupby("policy", sort=True):
        g = g.sort_values("cache_share")
        style = {"ls": "--", "color": "black"} if pol == "belady" else {}
        ax.plot(g["cache_share"] * 100, g["hit_rate"], marker="o", ms=3, label=str(pol), **style)
    ax.set_xlabel("cache size (% of routed experts)")
    ax.set_ylabel("hit rate")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    return fig
