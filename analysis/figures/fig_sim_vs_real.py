"""Figure: simulated against measured values, one panel per metric (the validation table).

Each point is one configuration (`config`) of a validation table (analysis.tables: config, metric,
sim, real; or the JSON of `flashsim validate --json`). The diagonal is perfect agreement; the band is +-20%. Each panel's title gives the
relative error |sim - real| / real: median, p90 and max over its points. Axes are logarithmic when
the values span more than a decade.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

from analysis.figures import common as C
from devices.errors import FlashsimError

KIND = "sim-vs-real"
INPUT = "validation"
TITLE = "Simulator vs real backend"
BAND = 0.20
MAX_METRICS = 8


def relative_errors(df: pd.DataFrame) -> pd.DataFrame:
    """Per metric: n, median, p90 and max of |sim - real| / |real| (rows with real == 0 left out)."""
    rows = []
    for metric, g in df.groupby("metric", sort=False):
        real = g["real"].to_numpy(float)
        err = np.abs(g["sim"].to_numpy(float) - real)[real != 0] / np.abs(real[real != 0])
        rows.append({"metric": metric, "n": int(len(g)),
                     "median_rel_error": float(np.median(err)) if len(err) else math.nan,
                     "p90_rel_error": float(np.quantile(err, 0.9)) if len(err) else math.nan,
                     "max_rel_error": float(err.max()) if len(err) else math.nan})
    return pd.DataFrame(rows)


def draw(validation: pd.DataFrame) -> Figure:
    metrics = list(dict.fromkeys(validation["metric"]))
    if len(metrics) > MAX_METRICS:
        raise FlashsimError(f"{KIND}: {len(metrics)} metrics in the validation table (at most {MAX_METRICS})")
    errors = relative_errors(validation).set_index("metric")
    ncols = min(2, len(metrics))
    nrows = math.ceil(len(metrics) / ncols)
    fig = C.new_figure(4.2 * ncols + 0.4, 0.7 + 3.8 * nrows)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, metric in zip(axes, metrics):
        g = validation[validation["metric"] == metric]
        real, sim = g["real"].to_numpy(float), g["sim"].to_numpy(float)
        both = np.concatenate([real, sim])
        pos = both[both > 0]
        log = len(pos) == len(both) and pos.max() / pos.min() > 10
        lo, hi = (pos.min() / 1.5, pos.max() * 1.5) if log else (min(0.0, both.min()), both.max() * 1.1 or 1)
        line = np.geomspace(lo, hi, 50) if log else np.linspace(lo, hi, 50)
        ax.fill_between(line, line * (1 - BAND), line * (1 + BAND), color="0.9", label=f"±{BAND:.0%}")
        ax.plot(line, line, color="0.4", lw=1, label="sim = real")
        ax.scatter(real, sim, s=24, color="C0", zorder=3)
        if log:
            ax.set_xscale("log")
            ax.set_yscale("log")
            for axis in (ax.xaxis, ax.yaxis):  # ticks at 1, 2, 5 x 10^n, written plainly
                axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
                axis.set_major_formatter(FormatStrFormatter("%g"))
                axis.set_minor_formatter(NullFormatter())
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        e = errors.loc[metric]
        ax.set_title(f"{metric}\nerror median {e.median_rel_error:.1%}, p90 {e.p90_rel_error:.1%}, "
                     f"max {e.max_rel_error:.1%} (n={int(e.n)})", fontsize=9, pad=12)
        ax.set_xlabel("real (measured)")
        ax.set_ylabel("simulated")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="upper left")
    for ax in axes[len(metrics):]:
        ax.set_visible(False)
    fig.suptitle(TITLE, fontsize=11)
    return fig
