"""Figures of `flashsim trace stats`: window coverage vs k, the hot-neuron CDF, and per-layer
active fraction / overlap / hot-80% fraction. Input is the JSON object of `TraceStats.to_json()`
(so saved JSON can be re-plotted); output is PNG (150 dpi) and SVG per figure, written atomically."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from devices.errors import FlashsimError
from traces.outputs import replace_output

FIGURES = ("window_coverage", "hot_cdf", "per_layer")


def _figure(width_in: float = 6.4, height_in: float = 4.2):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig, out_dir: Path, name: str) -> list[Path]:
    paths = []
    for ext, kw in (("png", {"dpi": 150}), ("svg", {})):
        path = out_dir / f"{name}.{ext}"
        tmp = out_dir / f".{name}.{ext}.tmp-{os.getpid()}"
        try:
            fig.savefig(tmp, format=ext, **kw)
            replace_output(tmp, path)
        except OSError as e:
            raise FlashsimError(f"{path}: cannot write the figure ({e.strerror})") from None
        finally:
            tmp.unlink(missing_ok=True)
        paths.append(path)
    return paths


def _layer_colors(n: int):
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    return [cmap(i / max(1, n - 1)) for i in range(n)]


def _title(stats: dict[str, Any]) -> str:
    kind = "synthetic" if stats.get("synthetic") else "captured"
    return (f"{stats.get('model', '?')} ({kind}), {stats['n_tokens']} tokens, phase {stats.get('phase', 'all')}")


def draw_window_coverage(stats: dict[str, Any]) -> Any:
    """The window coverage figure (a matplotlib Figure) of one trace's statistics."""
    fig = _figure()
    ax = fig.add_subplot()
    layers = stats["per_layer"]
    for color, lay in zip(_layer_colors(len(layers)), layers):
        ks = [int(k) for k, v in lay["window_coverage"].items() if v is not None]
        ax.plot(ks, [lay["window_coverage"][str(k)] for k in ks], color=color, lw=0.8, alpha=0.8)
    ks = [int(k) for k, v in stats["window_coverage"].items() if v is not None]
    ax.plot(ks, [stats["window_coverage"][str(k)] for k in ks], color="black", lw=2.2, marker="o", ms=3,
            label="all layers")
    ax.set_xlabel("window k (previous tokens in the same prompt)")
    ax.set_ylabel("share of A_t already in the window")
    ax.set_ylim(0, 1)
    ax.set_xlim(1, max(ks) if ks else 16)
    ax.grid(alpha=0.3)
    ax.legend(title="thin: layers (dark = first)", loc="lower right")
    ax.set_title("Window coverage: " + _title(stats), fontsize=9)
    return fig


def draw_hot_cdf(stats: dict[str, Any]) -> Any:
    """The hot cdf figure (a matplotlib Figure) of one trace's statistics."""
    fig = _figure()
    ax = fig.add_subplot()
    grid = [0.0, *stats["hot_cdf_grid"]]
    layers = stats["per_layer"]
    for color, lay in zip(_layer_colors(len(layers)), layers):
        if None not in lay["hot_cdf"]:
            ax.plot(grid, [0.0, *lay["hot_cdf"]], color=color, lw=0.8, alpha=0.8)
    if None not in stats["hot_cdf"]:
        ax.plot(grid, [0.0, *stats["hot_cdf"]], color="black", lw=2.2, label="all layers")
    ax.plot([0, 1], [0, 1], ls="--", color="grey", lw=1, label="no skew")
    ax.axhline(0.8, color="tab:red", lw=0.8, ls=":")
    if stats.get("hot80_fraction") is not None:
        ax.axvline(stats["hot80_fraction"], color="tab:red", lw=0.8, ls=":",
                   label=f"80% of events: {stats['hot80_fraction']:.2f} of neurons")
    ax.set_xlabel("fraction of neurons (most often active first)")
    ax.set_ylabel("share of active events")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title("Hot-neuron CDF: " + _title(stats), fontsize=9)
    return fig


def draw_per_layer(stats: dict[str, Any]) -> Any:
    """The per layer figure (a matplotlib Figure) of one trace's statistics."""
    fig = _figure(7.0, 4.2)
    ax = fig.add_subplot()
    layers = stats["per_layer"]
    x = [lay["layer"] for lay in layers]
    for key, label, color in (("active_fraction", "active fraction", "tab:blue"),
                              ("overlap_prev", "overlap with previous token", "tab:orange"),
                              ("hot80_fraction", "neurons giving 80% of events", "tab:green")):
        ax.plot(x, [lay[key] if lay[key] is not None else float("nan") for lay in layers], marker="o", ms=3,
                color=color, label=label)
    cov8 = [lay["window_coverage"].get("8") for lay in layers]
    if any(v is not None for v in cov8):
        ax.plot(x, [float("nan") if v is None else v for v in cov8], marker="s", ms=3, color="tab:purple",
                label="window coverage, k = 8")
    ax.set_xlabel("layer")
    ax.set_ylabel("fraction")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left", ncols=2, framealpha=0.9)
    ax.set_title("Per layer: " + _title(stats), fontsize=9)
    return fig


def plot_figure(name: str, stats: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Write one figure (`name` of FIGURES) as PNG and SVG into `out_dir`; returns the files."""
    return _save(globals()[f"draw_{name}"](stats), Path(out_dir), name)


def plot_trace_stats(stats: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Write every figure of one trace's statistics into `out_dir`; returns the files written."""
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FlashsimError(f"--plot {out_dir}: cannot create the folder ({e.strerror})") from None
    paths: list[Path] = []
    for name in FIGURES:
        paths += plot_figure(name, stats, out_dir)
    return paths
