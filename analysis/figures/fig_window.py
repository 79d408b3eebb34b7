"""Figure: flash bytes and latency per token as the window size k grows (LLM in a flash, sec. 3.1).

x: the swept window parameter (`param.<key>`, found automatically or given with `param=`);
top: `flash_bytes_per_token` in MiB; bottom: `ms_per_token`. One line per other varying dimension
(device, budget, preset, other parameters). Points without the parameter (a naive baseline in the
same sweep) are drawn as dashed horizontal reference lines.
"""

from __future__ import annotations

from collections.abc import Sequence

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
    fig = C.new_figure(7.5, 6.5)
    ax_b, ax_t = fig.subplots(2, 1, sharex=True)
    colors: dict[tuple, str] = {}
    ref_keys = [k for k in keys if k != T.PRESET]  # a reference belongs to the line it shares these with
    for i, (_, g) in enumerate(series):
        g = g.sort_values(x)
        name = C.describe(g.iloc[0], keys) if keys else g[T.PRESET].iloc[0]
        color = f"C{i % 10}"
        colors.setdefault(tuple(str(g.iloc[0][k]) for k in ref_keys), color)
        ax_b.plot(g[x], g[T.FLASH_BYTES] / C.MIB, "o-", color=color, label=name)
        ax_t.plot(g[x], g[T.MS_PER_TOKEN], "o-", color=color, label=name)
    ref_labels = list(dict.fromkeys(refs[T.LABEL])) if len(refs) else []
    if len(ref_labels) > MAX_REFS:  # too many baselines bury the lines: keep the first few presets
        keep = sorted(ref_labels, key=lambda s: C.preset_rank(s.split("[")[0]))[:MAX_REFS]
        refs = refs[refs[T.LABEL].isin(keep)]
    logs = {}
    for ax, col, scale in ((ax_b, T.FLASH_BYTES, 1 / C.MIB), (ax_t, T.MS_PER_TOKEN, 1.0)):
        logs[id(ax)] = C.log_if_wide(ax, pd.concat([swept[col], refs[col]]) * scale)
        if not logs[id(ax)]:
            ax.set_ylim(bottom=0)
    labelled: set[tuple[str, float, int]] = set()
    for _, r in refs.iterrows():
        color = colors.get(tuple(str(r[k]) for k in ref_keys), "0.4")
        for ax, v in ((ax_b, r[T.FLASH_BYTES] / C.MIB), (ax_t, r[T.MS_PER_TOKEN])):
            if not v > 0 and logs[id(ax)]:
                continue  # zero (a baseline that reads nothing) has no place on a log axis
            ax.axhline(v, ls="--", lw=1, color=color)
            key = (r[T.LABEL], round(float(v), 6), id(ax))
            if key not in labelled:  # one label per configuration and value
                labelled.add(key)
                ax.annotate(r[T.LABEL], (1, v), xycoords=("axes fraction", "data"), ha="right",
                            va="bottom", fontsize=8, color="0.3", annotation_clip=True)
    ax_b.set_ylabel("flash MiB read per token")
    ax_t.set_ylabel("ms per token")
    ax_t.set_xlabel(f"{x[len(T.PARAM_PREFIX):]} (window size, tokens)")
    xs = swept[x].to_numpy(float)
    if xs.min() > 0 and xs.max() / xs.min() >= 8:  # window sizes are usually powers of two
        ax_t.set_xscale("log", base=2)
        ticks = sorted(set(xs))
        ax_t.set_xticks(ticks, [f"{v:g}" for v in ticks])
    for ax in (ax_b, ax_t):
        ax.grid(alpha=0.3)
    if len(series) > 1 or keys:
        ax_b.legend(fontsize=8)
    C.title(fig, TITLE, df)
    return fig
