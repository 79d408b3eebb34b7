"""Figure: flash bytes and latency per token as the window size k grows (LLM in a flash, sec. 3.1).

x: the swept window parameter (`param.<key>`, found automatically or given with `param=`);
top: `flash_bytes_per_token` in MiB; bottom: `ms_per_token`. One line per other varying dimension
(device, budget, preset, other parameters); series that draw the same numbers on a panel are one line
whose label counts them (bytes read per token depend on the trace and the window, not on the device,
so six device/budget series are one line on top). Points without the parameter (a naive baseline in
the same sweep) are dashed horizontal reference lines, one per distinct value, labelled at the right
edge with the labels moved apart so none covers another.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from analysis import tables as T
from analysis.figures import common as C
from analysis.tables import ResultSet
from devices.errors import FlashsimError

KIND = "window"
INPUT = "results"
TITLE = "Flash bytes and latency per token vs window size k"
MAX_SERIES = 10
MAX_REFS = 4  # baseline configurations drawn as dashed lines
LABEL_GAP = 0.06  # axes fraction between two reference labels (8-point text on a 3-inch panel)
PLURAL = {T.TRACE: "traces", T.MODEL: "models", T.DEVICE: "devices", T.BUDGET: "budgets", T.PRESET: "presets"}


def find_param(df: pd.DataFrame, param: str | None) -> str:
    """The param.* column to use as x: the given one, or the window-like numeric one."""
    numeric = [c for c in df.columns if c.startswith(T.PARAM_PREFIX)
               and pd.api.types.is_numeric_dtype(df[c]) and df[c].nunique() >= 2]
    if param is not None:
        col = param if param.startswith(T.PARAM_PREFIX) else T.PARAM_PREFIX + param
        if col not in numeric:
            raise FlashsimError(f"{KIND}: parameter {param!r} is not a swept number in the results; "
                                f"swept: {', '.join(c[len(T.PARAM_PREFIX):] for c in numeric) or 'none'}")
        return col
    windowish = [c for c in numeric if "window" in c or c.rsplit(".", 1)[-1] in ("k", "window_k")]
    if len(windowish) == 1:
        return windowish[0]
    if len(numeric) == 1:
        return numeric[0]
    if not numeric:
        raise FlashsimError(f"{KIND}: needs a sweep over a window size (e.g. `set: {{window.k: [1, 2, 4, 8]}}`); "
                            "these results sweep no numeric parameter")
    raise FlashsimError(f"{KIND}: several swept parameters ({', '.join(c[len(T.PARAM_PREFIX):] for c in numeric)}); "
                        "choose one with --param KEY")


def _merged_label(members: list[pd.Series], keys: list[str]) -> str:
    """A line standing for several series: the values they share, and how many of the rest."""
    if len(members) == 1:
        return C.describe(members[0], keys)
    parts = []
    for k in keys:
        vals = list(dict.fromkeys(C.describe(m, [k]) for m in members))
        if len(vals) == 1:
            parts.append(vals[0])
        else:
            parts.append(f"{len(vals)} " + PLURAL.get(k, f"values of {k[len(T.PARAM_PREFIX):]}"))
    return ", ".join(parts) + " (same numbers)"


def _curves(series: list[tuple[Any, pd.DataFrame]], x: str, col: str, scale: float,
            keys: list[str]) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(label, xs, ys) per distinct curve: series with equal numbers on this panel become one line."""
    groups: dict[tuple, list] = {}
    for _, g in series:
        g = g.sort_values(x)
        xs, ys = g[x].to_numpy(float), g[col].to_numpy(float) * scale
        key = (tuple(xs), tuple(np.round(ys, 9)))
        groups.setdefault(key, [xs, ys, []])[2].append(g.iloc[0])
    return [(_merged_label(m, keys) if keys else str(m[0][T.PRESET]), xs, ys) for xs, ys, m in groups.values()]


def _references(ax, refs: pd.DataFrame, col: str, scale: float, log: bool, ref_keys: list[str]) -> None:
    """Dashed lines for the baselines, one per (configuration, value), labelled at the right edge."""
    lines: dict[tuple[str, float], list[pd.Series]] = {}
    for _, r in refs.iterrows():
        v = float(r[col]) * scale
        if not v > 0 and log:
            continue  # zero (a baseline that reads nothing) has no place on a log axis
        lines.setdefault((str(r[T.LABEL]), round(v, 9)), []).append(r)
    per_label = {lbl: sum(1 for (l2, _) in lines if l2 == lbl) for lbl, _ in lines}
    texts = []
    for (lbl, v), members in lines.items():
        ax.axhline(v, ls="--", lw=1, color="0.45")
        ctx = _merged_label(members, ref_keys).replace(" (same numbers)", "") if ref_keys and per_label[lbl] > 1 else ""
        texts.append((lbl + (f" ({ctx})" if ctx else ""), v))
    ax.autoscale_view()
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo if log else 0, hi)   # frozen: label positions are computed in axes fraction
    to_axes = ax.transData + ax.transAxes.inverted()
    wanted = [float(to_axes.transform((0, v))[1]) for _, v in texts]
    for (text, v), y in zip(texts, C.spread(wanted, LABEL_GAP)):
        ax.annotate(text, (1, v), xycoords=("axes fraction", "data"), xytext=(1.01, y),
                    textcoords="axes fraction", va="center", ha="left", fontsize=7, color="0.3",
                    arrowprops={"arrowstyle": "-", "color": "0.6", "lw": 0.5}, annotation_clip=False)


def draw(results: ResultSet, where: Sequence[str] | None = None, param: str | None = None) -> Figure:
    df = C.filter_rows(results.ok, where, results.source)
    C.need_columns(df, [T.FLASH_BYTES, T.MS_PER_TOKEN], KIND)
    x = find_param(df, param)
    swept, refs = df[df[x].notna()], df[df[x].isna()]
    others = [c for c in df.columns if c.startswith(T.PARAM_PREFIX) and c != x]
    keys = C.varying(swept, (T.TRACE, T.MODEL, T.DEVICE, T.BUDGET, T.PRESET, *others))
    series = (list(swept.groupby([swept[k].astype(str) for k in keys], sort=False, dropna=False)) if keys
              else [("", swept)])
    if len(series) > MAX_SERIES:
        raise C.TooCrowded(f"{KIND}: {len(series)} lines (at most {MAX_SERIES}); narrow with --where KEY=VALUE")
    ref_labels = list(dict.fromkeys(refs[T.LABEL])) if len(refs) else []
    if len(ref_labels) > MAX_REFS:  # too many baselines bury the lines: keep the first few presets
        keep = sorted(ref_labels, key=lambda s: C.preset_rank(s.split("[")[0]))[:MAX_REFS]
        refs = refs[refs[T.LABEL].isin(keep)]
    ref_keys = [k for k in C.varying(refs, (T.TRACE, T.MODEL, T.DEVICE, T.BUDGET))]
    fig = C.new_figure(8.5, 6.5)
    ax_b, ax_t = fig.subplots(2, 1, sharex=True)
    for ax, col, scale in ((ax_b, T.FLASH_BYTES, 1 / C.MIB), (ax_t, T.MS_PER_TOKEN, 1.0)):
        curves = _curves(series, x, col, scale, keys)
        for i, (name, xs, ys) in enumerate(curves):
            ax.plot(xs, ys, "o-", color=f"C{i % 10}", label=name)
        log = C.log_if_wide(ax, pd.concat([swept[col], refs[col]]) * scale)
        ax.grid(alpha=0.3)
        if keys:
            ax.legend(fontsize=7, loc="best")
        if len(refs):
            _references(ax, refs, col, scale, log, ref_keys)
        elif not log:
            ax.set_ylim(bottom=0)
    ax_b.set_ylabel("flash MiB read per token")
    ax_t.set_ylabel("ms per token")
    ax_t.set_xlabel(f"{x[len(T.PARAM_PREFIX):]} (window size, tokens)")
    xs = swept[x].to_numpy(float)
    if xs.min() > 0 and xs.max() / xs.min() >= 8:  # window sizes are usually powers of two
        ax_t.set_xscale("log", base=2)
        ticks = sorted(set(xs))
        ax_t.set_xticks(ticks, [f"{v:g}" for v in ticks])
    C.title(fig, TITLE, df)
    return fig
