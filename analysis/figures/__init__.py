"""Figures: one module per figure (`fig_<name>.py`, matplotlib Agg), registered here by kind.

Each figure module defines `KIND`, `INPUT` (what it is drawn from: "results" = a sweep directory
or results table, "validation" = a sim-vs-real table, "device" = a device profile name or file,
"records" = a memory-over-time table) and `draw(data, **options) -> Figure`, which raises
FlashsimError saying why when the data cannot make that figure. `make_figure` loads the input,
draws, and writes `<out>/<kind>.png` and `.svg`. Trace statistics figures (window coverage vs k,
hot-neuron CDF, per-layer statistics) come from `analysis.figures.trace_stats` and are registered
as `trace-<name>` (input "trace": a trace directory or the JSON of `flashsim trace stats --json`).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from pathlib import Path
from types import ModuleType
from typing import Any

from devices.errors import FlashsimError, unknown_name

# kind -> (module, input). The input is listed here so the CLI can describe kinds without
# importing matplotlib; each module's INPUT must agree (a test checks).
FIGURES = {
    "breakdown": ("analysis.figures.fig_breakdown", "results"),
    "energy": ("analysis.figures.fig_energy", "results"),
    "window": ("analysis.figures.fig_window", "results"),
    "budget": ("analysis.figures.fig_budget", "results"),
    "pareto": ("analysis.figures.fig_pareto", "results"),
    "sim-vs-real": ("analysis.figures.fig_sim_vs_real", "validation"),
    "read-curve": ("analysis.figures.fig_read_curve", "device"),
    "memory": ("analysis.figures.fig_memory", "records"),
    "adapt": ("analysis.figures.fig_adapt", "records"),
}
INPUTS = ("results", "validation", "device", "records", "trace")
TRACE_STATS = "analysis.figures.trace_stats"  # another helper's module: trace statistics figures


def figure_module(kind: str) -> ModuleType:
    if kind not in FIGURES:
        raise unknown_name("figure", kind, FIGURES)
    return importlib.import_module(FIGURES[kind][0])


def load_input(kind_input: str, source: str | Path) -> Any:
    """Load what a figure is drawn from; FlashsimError names the file and the problem."""
    from analysis import tables

    if kind_input == "results":
        return tables.load_results(source)
    if kind_input == "validation":
        return tables.load_validation(source)
    if kind_input == "records":
        return tables.load_memory_records(source)
    if kind_input == "device":
        from devices import load_profile

        return load_profile(str(source))
    if kind_input == "trace":
        return trace_statistics(source)
    raise ValueError(f"unknown figure input {kind_input!r}")


def trace_statistics(source: str | Path) -> dict[str, Any]:
    """Statistics of a trace directory (traces.stats), or a saved `flashsim trace stats --json`."""
    import json

    path = Path(source)
    if path.is_file() and path.suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise FlashsimError(f"{path}: not a trace statistics JSON ({e})") from None
        if not isinstance(data, dict) or "per_layer" not in data or "window_coverage" not in data:
            raise FlashsimError(f"{path}: not the JSON of `flashsim trace stats --json`")
        return data
    from traces.format import open_trace
    from traces.stats import trace_stats

    return trace_stats(open_trace(path)).to_json()


def draw_figure(kind: str, data: Any, **options: Any):
    """Draw `kind` from already loaded data, passing only the options its draw() takes."""
    mod = figure_module(kind)
    accepted = inspect.signature(mod.draw).parameters
    unused = [k for k, v in options.items() if v not in (None, [], ()) and k not in accepted]
    if unused:
        raise FlashsimError(f"figure {kind!r} takes no option {', '.join('--' + u for u in unused)}")
    return mod.draw(data, **{k: v for k, v in options.items() if k in accepted})


def make_figure(kind: str, source: str | Path, out_dir: str | Path, **options: Any) -> list[Path]:
    """Load `source`, draw figure `kind`, write <out_dir>/<kind>.png and .svg; return the paths."""
    from analysis.figures.common import save

    module, inp = FIGURES[kind]
    if module == TRACE_STATS:  # that module draws and saves its own figures
        unused = [k for k, v in options.items() if v not in (None, [], ())]
        if unused:
            raise FlashsimError(f"figure {kind!r} takes no option {', '.join('--' + u for u in unused)}")
        return trace_stats_figure(kind, load_input(inp, source), out_dir)
    fig = draw_figure(kind, load_input(inp, source), **options)
    return save(fig, out_dir, kind)


def trace_stats_figure(kind: str, stats: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Draw one trace statistics figure with `analysis.figures.trace_stats` (its own files)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    mod = importlib.import_module(TRACE_STATS)
    return mod.plot_figure(kind.removeprefix("trace-").replace("-", "_"), stats, out)


def _register_trace_stats() -> None:
    """Trace statistics figures (that module's `FIGURES` names, each drawn by `draw_<name>(stats)` and
    written by `plot_figure(name, stats, out_dir)`) join the registry as `trace-<name>`."""
    if importlib.util.find_spec(TRACE_STATS) is None:
        return
    mod = importlib.import_module(TRACE_STATS)
    for name in getattr(mod, "FIGURES", ()):
        if callable(getattr(mod, f"draw_{name}", None)):
            FIGURES.setdefault("trace-" + name.replace("_", "-"), (TRACE_STATS, "trace"))


_register_trace_stats()
