"""Figure: per-token latency broken into its parts, from naive loading to all techniques.

One horizontal bar per configuration (ordered naive -> hybrid -> mmap -> ... -> dense), stacked
from the results' own columns: compute, memory management (moving neurons in DRAM) and stall (time
the decoder waited for flash); whatever of `ms_per_token` the three leave unexplained is drawn grey
as "other". Flash I/O busy time is drawn as a thin bar under each one: it is not stacked because
with prefetching it overlaps compute, and only its unhidden part (the stall) adds to latency.
A configuration that did not run (a budget too small for it) keeps its row, with no bar and the
reason in red, so every panel lists the same configurations. Panels: one per device / model / trace /
budget combination present in the results, all on one x scale (ms are comparable across panels).
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

KIND = "breakdown"
INPUT = "results"
TITLE = "Per-token latency breakdown, naive to all techniques"
STACK = (T.COMPUTE_MS, T.MEMORY_MGMT_MS, T.STALL_MS)
MAX_BARS = 24


def draw(results: ResultSet, where: Sequence[str] | None = None) -> Figure:
    df = C.filter_rows(results.table, where, results.source)
    if T.STATUS in df and not (df[T.STATUS] == "ok").any():
        raise FlashsimError(f"{KIND}: no point of the results ran successfully")
    C.need_columns(df, [T.MS_PER_TOKEN, T.IO_MS, *STACK], KIND)
    fig, axes = C.bar_panels(df, KIND, MAX_BARS, 0.42, _panel, "milliseconds per decoded token")
    handles = [Patch(color=C.COLORS[c], label=C.COMPONENT_NAMES[c]) for c in (*STACK, "other")]
    handles.append(Patch(facecolor="white", edgecolor=C.COLORS[T.IO_MS], hatch="////",
                         label="flash I/O busy (overlaps the rest when prefetching)"))
    fig.legend(handles=handles, loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    C.title(fig, TITLE, df)
    return fig


def _panel(ax, g) -> None:
    y = np.arange(len(g))
    left = np.zeros(len(g))
    total = g[T.MS_PER_TOKEN].to_numpy(float)
    for col in STACK:
        v = np.nan_to_num(g[col].to_numpy(float))
        ax.barh(y - 0.1, v, left=left, height=0.55, color=C.COLORS[col])
        left += v
    other = np.nan_to_num(np.clip(total - left, 0, None))
    other[other < 0.005 * total] = 0  # rounding, not a component
    ax.barh(y - 0.1, other, left=left, height=0.55, color=C.COLORS["other"])
    io = np.nan_to_num(g[T.IO_MS].to_numpy(float))
    ax.barh(y + 0.32, io, height=0.18, facecolor="white", edgecolor=C.COLORS[T.IO_MS], hatch="////",
            linewidth=0.6)
    xmax = max(float(np.nanmax(total)) if np.isfinite(total).any() else 0.0, float(np.nanmax(io)) if len(io) else 0.0)
    failed = (g[T.STATUS] != "ok").to_numpy() if T.STATUS in g else np.zeros(len(g), bool)
    errors = g[T.ERROR].tolist() if T.ERROR in g else [None] * len(g)
    for yi, t, bad, err in zip(y, total, failed, errors):
        if bad:
            ax.text(0, yi, " " + _short(err), va="center", fontsize=8, color="#C44E52")
        else:
            ax.text(t + 0.01 * xmax, yi - 0.1, C.fmt_ms(t), va="center", fontsize=8)
    ax.set_yticks(y, g[T.LABEL].tolist(), fontsize=8)
    ax.set_ylim(len(g) - 0.4, -0.7)
    ax.set_xlim(0, xmax * 1.15 if xmax > 0 else 1)
    ax.grid(axis="x", alpha=0.3)


def _short(err: object, n: int = 60) -> str:
    """A failed point's reason in a few words: 'does not fit: ...' for a budget refusal."""
    text = "" if err is None or err != err else str(err)
    head = "does not fit" if "budget" in text.lower() or "fit" in text.lower() else "did not run"
    if not text or text.lower().startswith(head):
        return text[:n] or head
    return f"{head}: {text[:n]}" + ("..." if len(text) > n else "")
