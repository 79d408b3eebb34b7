"""Shared pieces of the figure scripts: the Agg canvas, saving PNG+SVG atomically and reproducibly,
colours of the latency components, display units, and grouping rows into panels and series.

Figures plot columns of result tables as they are (converted only to display units: MiB, GiB,
ms); they never recompute physics. Files: `<out>/<kind>.png` (100 dpi) and `<out>/<kind>.svg`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from analysis import tables as T  # noqa: E402
from devices.errors import FlashsimError  # noqa: E402
from devices.units import format_bytes  # noqa: E402
from traces.outputs import replace_output

DPI = 100
MIB = 2**20
GIB = 2**30
# One colour per latency component, the same in every figure.
COLORS = {T.IO_MS: "#4C72B0", T.MEMORY_MGMT_MS: "#DD8452", T.COMPUTE_MS: "#55A868",
          T.STALL_MS: "#C44E52", "other": "#AAAAAA"}
COMPONENT_NAMES = {T.IO_MS: "flash I/O", T.MEMORY_MGMT_MS: "memory management",
                   T.COMPUTE_MS: "compute", T.STALL_MS: "stall (waiting for flash)", "other": "other"}
# The order "naive -> all techniques": baselines first, then the papers' systems, then the bound.
PRESET_ORDER = ("naive", "hybrid", "mmap", "quantized", "predictor", "llm-in-a-flash",
                "neuroprefetcher", "selectinfer", "rap", "dense")
plt.rcParams["svg.hashsalt"] = "flashsim"  # stable SVG ids: same data, same file


class TooCrowded(FlashsimError):
    """The data would make an unreadable figure (too many panels, bars or lines): narrow it with
    --where. The report then draws one figure per device instead."""


def new_figure(width_in: float, height_in: float) -> Figure:
    """A figure on the Agg canvas (no pyplot state, safe in workers and threads)."""
    return Figure(figsize=(width_in, height_in), dpi=DPI, layout="constrained")


def save(fig: Figure, out_dir: str | Path, kind: str) -> list[Path]:
    """Write <kind>.png and <kind>.svg into out_dir (temporary name, then rename)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in ("png", "svg"):
        path = out / f"{kind}.{fmt}"
        tmp = out / f".{kind}.{uuid.uuid4().hex[:8]}.tmp.{fmt}"
        meta = {"Date": None} if fmt == "svg" else {"Software": None}
        fig.savefig(tmp, format=fmt, metadata=meta)
        replace_output(tmp, path)
        paths.append(path)
    return paths


def preset_rank(preset: str) -> int:
    return PRESET_ORDER.index(preset) if preset in PRESET_ORDER else len(PRESET_ORDER)


def varying(df: pd.DataFrame, columns: Sequence[str]) -> list[str]:
    """The columns (of `columns`) that take more than one value in df."""
    return [c for c in columns if c in df and df[c].astype(str).nunique(dropna=False) > 1]


@lru_cache(maxsize=32)
def device_available_bytes(device: str) -> int | None:
    """The DRAM a device profile leaves to the model (the budget a sweep's `null` stands for), or None."""
    from devices import load_profile

    try:
        return load_profile(device).available_bytes
    except (FlashsimError, OSError, ValueError):
        return None


def budget_text(budget: object, device: object = None) -> str:
    """A budget as text: its size, and for the device default (NaN) the device's available DRAM."""
    if not pd.isna(budget):
        return format_bytes(budget)
    avail = device_available_bytes(str(device)) if device is not None and not pd.isna(device) else None
    return "device default" if avail is None else f"{format_bytes(avail)} (device default)"


def describe(row: pd.Series, columns: Sequence[str]) -> str:
    """A short text naming a row by the given columns (trace by folder name, budgets in GiB)."""
    parts = []
    for c in columns:
        v = row[c]
        if c == T.BUDGET:
            parts.append("budget " + budget_text(v, row.get(T.DEVICE)))
        elif c == T.TRACE:
            parts.append(Path(str(v)).name)
        elif c == T.DEVICE:
            parts.append(Path(str(v)).stem)
        elif c == T.MODEL and (v is None or pd.isna(v)):
            parts.append("the trace's model")
        elif c.startswith(T.PARAM_PREFIX):
            parts.append(f"{c[len(T.PARAM_PREFIX):]}={v}")
        else:
            parts.append(str(v))
    return ", ".join(parts)


def context(df: pd.DataFrame) -> str:
    """The dimensions every row shares (trace, model, device, budget), for a figure's title."""
    same = [c for c in (T.TRACE, T.MODEL, T.DEVICE, T.BUDGET) if c in df and len(df)
            and df[c].astype(str).nunique(dropna=False) == 1 and not (c == T.MODEL and df[c].isna().all())]
    return describe(df.iloc[0], same) if same else ""


def title(fig: Figure, text: str, df: pd.DataFrame) -> None:
    ctx = context(df)
    fig.suptitle(f"{text}\n{ctx}" if ctx else text, fontsize=11)


def fmt_ms(v: float) -> str:
    return f"{v:,.0f} ms" if v >= 1000 else f"{v:.3g} ms"


def log_if_wide(ax, values, ratio: float = 20.0) -> bool:
    """Logarithmic y when the positive values span more than `ratio` (so small ones stay visible)."""
    v = np.asarray(values, float)
    v = v[np.isfinite(v) & (v > 0)]
    if len(v) and v.max() / v.min() > ratio:
        ax.set_yscale("log")
        return True
    return False


def panels(df: pd.DataFrame, columns: Sequence[str], max_panels: int, what: str) -> list[tuple[str, pd.DataFrame]]:
    """Split df into one panel per combination of the varying `columns` (in first-seen order)."""
    keys = varying(df, columns)
    if not keys:
        return [("", df)]
    groups = list(df.groupby([df[k].astype(str) for k in keys], sort=False, dropna=False))
    if len(groups) > max_panels:
        raise TooCrowded(f"{what}: the results span {len(groups)} combinations of "
                            f"{', '.join(keys)}; pick at most {max_panels} with --where KEY=VALUE")
    return [(describe(g.iloc[0], keys), g) for _, g in groups]


def filter_rows(df: pd.DataFrame, where: Sequence[str] | None, source: Path | str) -> pd.DataFrame:
    """Keep the rows matching every KEY=VALUE (compared as text; `param.k=4` works for numbers too)."""
    for cond in where or ():
        key, sep, value = cond.partition("=")
        if not sep or key not in df:
            cols = ", ".join(c for c in df.columns if c in T.DIMENSIONS or c.startswith(T.PARAM_PREFIX))
            raise FlashsimError(f"--where {cond!r}: expected KEY=VALUE with KEY one of {cols}")
        col = df[key]
        text = col.map(lambda v: _as_text(v))
        df = df[text == _as_text(_maybe_number(value))]
        if df.empty:
            raise FlashsimError(f"{source}: no rows with {key}={value}")
    return df


def _maybe_number(s: str) -> object:
    try:
        f = float(s)
    except ValueError:
        return s
    return f


def _as_text(v: object) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, (int,)) and not isinstance(v, bool):
        return str(v)
    return "" if v is None or (isinstance(v, float) and v != v) else str(v)


def need_columns(df: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    missing = [c for c in columns if c not in df]
    if missing:
        raise FlashsimError(f"{what}: the results have no column {', '.join(missing)}")


def bar_panels(df: pd.DataFrame, kind: str, max_bars: int, bar_height_in: float, draw: Callable[[Any, pd.DataFrame], None],
               xlabel: str) -> tuple[Figure, Any]:
    """One horizontal-bar panel per (trace, model, device, budget), configurations in preset order:
    `draw(ax, rows)` fills a panel; returns the figure and its axes. Refuses a panel of more than
    `max_bars` configurations (TooCrowded: narrow them with --where)."""
    from analysis import tables as T

    groups = panels(df, (T.TRACE, T.MODEL, T.DEVICE, T.BUDGET), 4, kind)
    heights = []
    for _, g in groups:
        if len(g) > max_bars:
            raise TooCrowded(f"{kind}: {len(g)} configurations in one panel (at most {max_bars}); "
                             "narrow them with --where KEY=VALUE")
        heights.append(len(g))
    fig = new_figure(9.0, 1.2 + bar_height_in * sum(heights) + 0.5 * len(groups))
    axes = fig.subplots(len(groups), 1, squeeze=False, height_ratios=[h + 1.5 for h in heights])[:, 0]
    for ax, (name, g) in zip(axes, groups):
        order = ["_rank", T.POINT_INDEX] if T.POINT_INDEX in g else ["_rank"]
        draw(ax, g.assign(_rank=g[T.PRESET].map(preset_rank)).sort_values(order))
        ax.set_title(name, fontsize=10, loc="left")
    xmax = max(ax.get_xlim()[1] for ax in axes)
    for ax in axes:   # one scale for every panel, so bars compare across panels
        ax.set_xlim(0, xmax)
    axes[-1].set_xlabel(xlabel)
    return fig, axes


def spread(fracs: Sequence[float], gap: float, lo: float = 0.0, hi: float = 1.0) -> list[float]:
    """Positions (axes fraction) for labels wanted at `fracs`, moved apart to at least `gap` from each
    other within [lo, hi] (as little as possible: up from the lowest, then back down from the top)."""
    order = sorted(range(len(fracs)), key=lambda i: fracs[i])
    pos = [min(max(float(fracs[i]), lo), hi) for i in order]
    for k in range(1, len(pos)):
        pos[k] = max(pos[k], pos[k - 1] + gap)
    if pos and pos[-1] > hi:
        pos[-1] = hi
        for k in range(len(pos) - 2, -1, -1):
            pos[k] = min(pos[k], pos[k + 1] - gap)
    out = [0.0] * len(fracs)
    for k, i in enumerate(order):
        out[i] = pos[k]
    return out
