"""Figure: expected decode tok/s against the DRAM the model may use, one line per device, with the
device's peak-bound as a thin dashed line of the same colour (analysis/moe_curves.py `tps_vs_dram`)."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from analysis.figures import common as C

KIND = "moe_dram"
INPUT = "moe tok/s vs DRAM"
TITLE = "MoE decode speed vs DRAM"


def draw(df: pd.DataFrame, title: str = TITLE) -> Figure:
    fig = C.new_figure(7.0, 4.2)
    ax = fig.subplots()
    for i, (dev, g) in enumerate(df.groupby("device", sort=True)):
        g = g.sort_values("dram_bytes")
        x = g["dram_bytes"] / C.GIB
        ax.plot(x, g["tokens_per_s"], marker="o", ms=3, color=f"C{i}", label=f"{dev} (expected)")
        ax.plot(x, g["peak_tokens_per_s"], ls="--", lw=0.8, color=f"C{i}", label=f"{dev} (peak-bound)")
    ax.set_xlabel("DRAM used by the model (GiB)")
    ax.set_ylabel("decode tok/s")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=10)
    return fig
