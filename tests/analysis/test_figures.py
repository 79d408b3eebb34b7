"""Figures: each kind draws the table's own numbers, writes PNG+SVG reproducibly, and refuses data
it cannot draw with a one-line reason."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import figures
from analysis.figures import FIGURES, draw_figure, figure_module, make_figure
from analysis.figures.fig_sim_vs_real import relative_errors
from analysis.pareto import pareto_mask
from analysis.tables import load_memory_records, load_results, load_validation
from devices import load_profile
from devices.errors import FlashsimError
from flashsim.main import main
from tests.analysis.sweep_helpers import results_table

MIB, GIB = 2**20, 2**30


@pytest.fixture
def results_file(tmp_path: Path) -> Path:
    path = tmp_path / "results.parquet"
    results_table().to_parquet(path)
    return path


def test_registry_agrees_with_the_modules() -> None:
    for kind, (module, inp) in FIGURES.items():
        if module == figures.TRACE_STATS:
            continue  # another helper's module, with its own protocol (tested below)
        mod = figure_module(kind)
        assert mod.__name__ == module and mod.KIND == kind and mod.INPUT == inp in figures.INPUTS
        assert mod.__doc__ and callable(mod.draw)


def test_breakdown_bars_are_the_table_columns(results_file: Path) -> None:
    fig = draw_figure("breakdown", load_results(results_file), where=["dram_budget_bytes=2147483648"])
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["naive", "hybrid", "llm-in-a-flash[window.k=1]", "llm-in-a-flash[window.k=2]",
                      "llm-in-a-flash[window.k=4]", "llm-in-a-flash[window.k=8]", "dense"]  # failed 'dense' kept
    widths = np.array([p.get_width() for p in ax.patches]).reshape(5, 7)[:, :6]  # compute, mm, stall, other, io
    assert not np.array([p.get_width() for p in ax.patches]).reshape(5, 7)[:, 6].any()  # no bar for 'dense'
    t = results_table().iloc[:6]
    np.testing.assert_allclose(widths[0], t["compute_ms_per_token"])
    np.testing.assert_allclose(widths[1], t["memory_mgmt_ms_per_token"])
    np.testing.assert_allclose(widths[2], t["stall_ms_per_token"])
    np.testing.assert_allclose(widths[:4].sum(axis=0), t["ms_per_token"])  # 'other' closes the gap
    np.testing.assert_allclose(widths[4], t["io_ms_per_token"])
    # Two budgets -> two panels when not filtered.
    assert len(draw_figure("breakdown", load_results(results_file)).axes) == 2


def two_device_table() -> pd.DataFrame:
    """results_table() on the M1 Max (2 and 4 GiB) plus a copy on the Orin Nano at 256 MiB and 4 GiB with
    1.5x the latency (the same bytes: the trace decides them), hybrid reading nearly what naive reads, and
    five configurations that do not fit 256 MiB."""
    a = results_table()
    a.loc[a["preset"] == "hybrid", "flash_bytes_per_token"] = 390.0 * MIB
    b = a.copy()
    b["device"], b["point_id"] = "jetson-orin-nano-8gb", [f"q{i:03d}" for i in range(len(b))]
    b["point_index"] = b["point_index"] + len(a)
    b["ms_per_token"] *= 1.5
    b["tokens_per_s"] = 1e3 / b["ms_per_token"]
    b.loc[b["dram_budget_bytes"] == 2 * GIB, "dram_budget_bytes"] = 256 * MIB
    small = (b["dram_budget_bytes"] == 256 * MIB) & b["preset"].isin(["llm-in-a-flash", "dense"])
    b.loc[small, ["status", "error", "ms_per_token", "tokens_per_s"]] = ["error", "DRAM budget too small", None, None]
    return pd.concat([a, b], ignore_index=True)


@pytest.fixture
def two_devices(tmp_path: Path) -> Path:
    path = tmp_path / "two.parquet"
    two_device_table().to_parquet(path)
    return path


def _solid(ax) -> list:
    return [ln for ln in ax.get_lines() if ln.get_linestyle() == "-"]


def test_window_merges_equal_series_and_keeps_labels_apart(two_devices: Path) -> None:
    from analysis.figures.fig_window import LABEL_GAP

    fig = draw_figure("window", load_results(two_devices))
    ax_bytes, ax_ms = fig.axes[:2]
    # bytes per token: the same for every device and budget (one line); latency: one line per device
    assert [ln.get_label() for ln in _solid(ax_bytes)] == ["2 devices, 2 budgets (same numbers)"]
    assert sorted(ln.get_label() for ln in _solid(ax_ms)) == ["apple-m1-max, 2 budgets (same numbers)",
                                                              "jetson-orin-nano-8gb, budget 4.00 GiB"]
    for ax, n_refs in ((ax_bytes, 2), (ax_ms, 4)):   # naive and hybrid, per device where they differ
        dashed = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
        assert len(dashed) == n_refs
        labels = [t for t in ax.texts if t.get_text().startswith(("naive", "hybrid"))]
        assert len(labels) == n_refs
        ys = sorted(t.xyann[1] for t in labels)
        assert all(b - a >= LABEL_GAP - 1e-9 for a, b in zip(ys, ys[1:]))  # none on top of another
    texts = [t.get_text() for ax in fig.axes for t in ax.texts] + [ln.get_label() for ln in ax_ms.get_lines()]
    assert not any("budget device" in t for t in texts)


def test_budget_panels_have_their_own_budgets_and_every_failure_marked(two_devices: Path) -> None:
    fig = draw_figure("budget", load_results(two_devices))
    m1, nano = fig.axes[:2]
    assert m1.get_title(loc="left").startswith("apple-m1-max")
    assert nano.get_title(loc="left").startswith("jetson-orin-nano-8gb")
    lo, hi = m1.get_xlim()   # 2 and 4 GiB in GiB: the Orin Nano's 256 MiB is not on it
    assert 1.0 <= lo < 2.0 and 4.0 < hi <= 5.0
    assert [t.get_text() for t in nano.get_xticklabels()] == ["256.00 MiB", "4.00 GiB"]  # 16x: evenly spaced
    marks = [ln for ln in nano.get_lines() if ln.get_marker() == "x"]
    xs = [x for ln in marks for x in ln.get_xdata()]
    at_small = [x for x in xs if abs(x - 0) < 0.5]              # beside the 256 MiB tick (position 0)
    assert len(at_small) == 5 and len(set(np.round(at_small, 6))) == 5   # five configurations, five marks
    assert [x for x in xs if x not in at_small] == [1.0]         # dense fails at 4 GiB as well
    assert "6 points" in nano.get_title(loc="left")
    m1_marks = [x for ln in m1.get_lines() if ln.get_marker() == "x" for x in ln.get_xdata()]
    assert sorted(m1_marks) == [2.0, 4.0]   # dense fails at both M1 budgets


def test_breakdown_keeps_failed_configurations_on_one_scale(two_devices: Path) -> None:
    fig = draw_figure("breakdown", load_results(two_devices), where=["device=jetson-orin-nano-8gb"])
    panels = [ax for ax in fig.axes if ax.get_yticklabels()]
    assert len(panels) == 2 and panels[0].get_title(loc="left") == "budget 256.00 MiB"
    labels = [t.get_text() for t in panels[0].get_yticklabels()]
    assert len(labels) == 7 and labels[-1] == "dense"
    red = [t.get_text() for t in panels[0].texts if t.get_text().strip().startswith("does not fit")]
    assert len(red) == 5
    assert panels[0].get_xlim() == panels[1].get_xlim()   # one scale for both panels


def test_window_lines_follow_k(results_file: Path) -> None:
    fig = draw_figure("window", load_results(results_file), where=["dram_budget_bytes=4294967296"])
    ax_bytes, ax_ms = fig.axes
    line = ax_bytes.get_lines()[0]
    assert list(line.get_xdata()) == [1, 2, 4, 8]
    assert list(line.get_ydata()) == [40.0, 30.0, 20.0, 15.0]
    assert list(ax_ms.get_lines()[0].get_ydata()) == [20.0, 16.0, 12.0, 10.0]
    refs = [ln.get_ydata()[0] for ln in ax_bytes.get_lines()[1:]]
    assert refs == [400.0, 200.0]  # naive and hybrid as dashed references


def test_budget_marks_points_that_do_not_fit(results_file: Path) -> None:
    fig = draw_figure("budget", load_results(results_file), where=["preset=dense"])
    xs = fig.axes[0].get_lines()[1]  # line 0: the (empty) successful series; line 1: the x markers
    assert list(xs.get_xdata()) == [2.0, 4.0] and list(xs.get_ydata()) == [0, 0]
    fig = draw_figure("budget", load_results(results_file), where=["preset=naive"])
    assert list(fig.axes[0].get_lines()[0].get_ydata()) == [10.0, 10.0]


def test_pareto_rings_the_undominated_points(results_file: Path) -> None:
    rs = load_results(results_file)
    fig = draw_figure("pareto", rs)
    ok = rs.ok
    front = pareto_mask(ok, maximize=["tokens_per_s", "activation_mass_kept"], minimize=["dram_peak_bytes"])
    ringed = fig.axes[0].collections[1].get_offsets()
    assert len(ringed) == front.sum()
    np.testing.assert_allclose(np.asarray(ringed)[:, 1], ok["tokens_per_s"][front])


def test_sim_vs_real_errors_and_points(tmp_path: Path) -> None:
    df = pd.DataFrame({"config": ["a", "b", "c", "a"], "metric": ["ms_per_token"] * 3 + ["io_ms_per_token"],
                       "sim": [11.0, 20.0, 27.0, 5.0], "real": [10.0, 20.0, 30.0, 4.0]})
    e = relative_errors(df).set_index("metric")
    assert e.loc["ms_per_token", "median_rel_error"] == pytest.approx(0.1)
    assert e.loc["ms_per_token", "max_rel_error"] == pytest.approx(0.1)
    assert e.loc["io_ms_per_token", "max_rel_error"] == pytest.approx(0.25)
    path = tmp_path / "v.csv"
    df.to_csv(path, index=False)
    paths = make_figure("sim-vs-real", path, tmp_path / "f")
    assert [p.name for p in paths] == ["sim-vs-real.png", "sim-vs-real.svg"]
    bad = tmp_path / "bad.csv"
    bad.write_text("config,metric,sim\na,ms_per_token,1\n")
    with pytest.raises(FlashsimError, match="column\\(s\\) real missing"):
        make_figure("sim-vs-real", bad, tmp_path / "f")


def test_read_curve_cells_are_the_profile_model() -> None:
    prof = load_profile("this-host")
    fig = draw_figure("read-curve", prof)
    img = fig.axes[0].get_images()[0].get_array()
    from analysis.figures.fig_read_curve import CHUNKS, in_flight_grid

    qs = in_flight_grid(prof)
    assert img.shape == (len(CHUNKS), len(qs))
    assert img[0, 0] == pytest.approx(prof.flash.bytes_per_s(4096, 1) / 1e9)
    assert img[-1, -1] == pytest.approx(prof.flash.bytes_per_s(CHUNKS[-1], qs[-1]) / 1e9)


def test_memory_over_time(tmp_path: Path) -> None:
    df = pd.DataFrame({"t_s": [0.0, 0.1, 0.2, 0.3], "resident_bytes": [1 * GIB, 2 * GIB, 3 * GIB, 2 * GIB],
                       "budget_bytes": [4 * GIB, 4 * GIB, 2.5 * GIB, 2.5 * GIB]})
    path = tmp_path / "mem.parquet"
    df.to_parquet(path)
    fig = draw_figure("memory", load_memory_records(path))
    ax = fig.axes[0]
    assert list(ax.get_lines()[0].get_ydata()) == [1, 2, 3, 2]
    assert list(ax.get_lines()[0].get_xdata()) == pytest.approx([0, 100, 200, 300])  # ms: short run
    assert len(ax.collections) == 1  # the over-budget fill


def test_memory_from_per_step_records(tmp_path: Path) -> None:
    """`flashsim replay --records` tables: each step's bytes hold from its start to its end."""
    df = pd.DataFrame({"t_start_s": [0.0, 2.0], "t_end_s": [2.0, 3.0], "resident_bytes": [GIB, 2 * GIB],
                       "budget_bytes": [4 * GIB, 4 * GIB], "phase": ["prefill", "decode"]})
    path = tmp_path / "records.parquet"
    df.to_parquet(path)
    rec = load_memory_records(path)
    assert rec["t_s"].tolist() == [0.0, 2.0, 3.0] and rec["resident_bytes"].tolist() == [GIB, 2 * GIB, 2 * GIB]
    line = draw_figure("memory", rec).axes[0].get_lines()[0]
    assert list(line.get_xdata()) == [0.0, 2.0, 3.0]  # seconds: the run lasts 3 s


def test_files_are_reproducible(results_file: Path, tmp_path: Path) -> None:
    a = make_figure("breakdown", results_file, tmp_path / "a", where=["dram_budget_bytes=2147483648"])
    b = make_figure("breakdown", results_file, tmp_path / "b", where=["dram_budget_bytes=2147483648"])
    for pa, pb in zip(a, b):
        assert pa.read_bytes() == pb.read_bytes()
    assert a[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and b"<svg" in a[1].read_bytes()[:400]


@pytest.mark.parametrize(("kind", "where", "expect"), [
    ("window", ["preset=naive"], "needs a sweep over a window size"),
    ("budget", ["dram_budget_bytes=2147483648"], "needs results at two or more DRAM budgets"),
    ("breakdown", ["preset=nothing"], "no rows with preset=nothing"),
    ("breakdown", ["colour=red"], "--where 'colour=red': expected KEY=VALUE with KEY one of"),
])
def test_figures_refuse_data_they_cannot_draw(results_file: Path, kind: str, where: list, expect: str) -> None:
    with pytest.raises(FlashsimError, match=expect.replace("(", "\\(").replace("[", "\\[")):
        draw_figure(kind, load_results(results_file), where=where)


def test_plot_cli(results_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "figs"
    assert main(["plot", "window", str(results_file), "--out", str(out), "--where",
                 "dram_budget_bytes=2147483648", "--json"]) == 0
    files = json.loads(capsys.readouterr().out)["files"]
    assert [Path(f).name for f in files] == ["window.png", "window.svg"]
    assert main(["plot", "read-curve", "apple-m1-max", "--out", str(out)]) == 0
    assert (out / "read-curve.png").is_file()
    capsys.readouterr()
    for argv, expect in [
        (["plot", "pareto", str(tmp_path / "none.parquet"), "--out", str(out)], "no such sweep directory or results file"),
        (["plot", "read-curve", "no-such-device", "--out", str(out)], "unknown device 'no-such-device'"),
        (["plot", "read-curve", "apple-m1-max", "--out", str(out), "--param", "k"], "takes no option --param"),
        (["plot", "breakdown", str(results_file), "--out", str(out), "--where", "x"], "expected KEY=VALUE"),
    ]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert expect in err and err.count("\n") == 1, err
    empty = tmp_path / "empty.parquet"
    results_table().iloc[:0].to_parquet(empty)
    assert main(["plot", "pareto", str(empty), "--out", str(out)]) == 2
    assert "the results table is empty" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["plot", "nonsense", str(results_file), "--out", str(out)])
    assert e.value.code == 2


def test_trace_statistics_figures(tiny_trace_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    if "trace-window-coverage" not in FIGURES:
        pytest.skip("analysis/figures/trace_stats.py is not in this checkout")
    assert main(["plot", "trace-window-coverage", str(tiny_trace_dir), "--out", str(tmp_path), "--json"]) == 0
    files = json.loads(capsys.readouterr().out)["files"]
    assert [Path(f).name for f in files] == ["window_coverage.png", "window_coverage.svg"]
    from traces.format import open_trace
    from traces.stats import trace_stats

    saved = tmp_path / "stats.json"
    saved.write_text(json.dumps(trace_stats(open_trace(tiny_trace_dir)).to_json()))
    assert [p.name for p in make_figure("trace-hot-cdf", saved, tmp_path / "b")] == ["hot_cdf.png", "hot_cdf.svg"]
    assert main(["plot", "trace-hot-cdf", str(results_table_path(tmp_path)), "--out", str(tmp_path)]) == 2
    assert "not a trace directory" in capsys.readouterr().err


def results_table_path(tmp_path: Path) -> Path:
    path = tmp_path / "r.parquet"
    results_table().to_parquet(path)
    return path


def test_sim_vs_real_reads_the_json_of_flashsim_validate(tmp_path: Path) -> None:
    report = {"n_configs": 2, "configs": [
        {"config": "k=0", "metrics": {"latency_s": {"real": 0.02, "sim": 0.01, "error": 0.5},
                                      "bytes_read": {"real": 4096.0, "sim": 4096.0, "error": 0.0}}},
        {"config": "k=2", "metrics": {"latency_s": {"real": 0.01, "sim": 0.011, "error": 0.1},
                                      "bytes_read": {"real": 0.0, "sim": 0.0, "error": 0.0}}}]}
    path = tmp_path / "v.json"
    path.write_text(json.dumps(report))
    df = load_validation(path)
    assert df.values.tolist() == [["k=0", "latency_s", 0.01, 0.02], ["k=0", "bytes_read", 4096.0, 4096.0],
                                  ["k=2", "latency_s", 0.011, 0.01], ["k=2", "bytes_read", 0.0, 0.0]]
    e = relative_errors(df).set_index("metric")
    assert e.loc["latency_s", "median_rel_error"] == pytest.approx(0.3)  # (0.5 + 0.1) / 2
    assert e.loc["bytes_read", "n"] == 2 and e.loc["bytes_read", "max_rel_error"] == 0.0  # real 0 left out
    assert len(make_figure("sim-vs-real", path, tmp_path / "f")) == 2
    path.write_text(json.dumps({"configs": [{"config": "x"}]}))
    with pytest.raises(FlashsimError, match=r"configs\[0\] has no 'metrics' mapping"):
        load_validation(path)


def test_sim_vs_real_draws_one_point_per_configuration_and_metric() -> None:
    df = pd.DataFrame({"config": ["a", "b", "c", "a", "b"], "metric": ["ms_per_token"] * 3 + ["io_ms_per_token"] * 2,
                       "sim": [11.0, 20.0, 27.0, 5.0, 6.0], "real": [10.0, 20.0, 30.0, 4.0, 6.0]})
    fig = draw_figure("sim-vs-real", df)
    panels = [ax for ax in fig.axes if ax.collections]
    assert len(panels) == 2   # one panel per metric
    for ax, metric in zip(panels, ("ms_per_token", "io_ms_per_token")):
        want = df[df["metric"] == metric][["real", "sim"]].to_numpy()
        np.testing.assert_allclose(np.asarray(ax.collections[-1].get_offsets()), want)  # [0]: the ±20% band


def test_adapt_draws_budget_footprints_actions_and_overruns() -> None:
    """Two controllers on one timeline: the budget line, one footprint line each, a drop and a restore
    mark where the actions say, red shading where a footprint exceeds the budget."""
    mib = 2**20
    df = pd.DataFrame({"t_s": [0.0, 0.1, 0.2, 0.0, 0.1, 0.2], "controller": ["a"] * 3 + ["b"] * 3,
                       "timeline": ["drop"] * 6, "resident_bytes": [300 * mib, 200 * mib, 250 * mib,
                                                                    300 * mib, 300 * mib, 300 * mib],
                       "budget_bytes": [320 * mib, 220 * mib, 320 * mib] * 2, "n_dropped": [0, 2, 1, 0, 0, 0],
                       "action": ["", "drop ffn:2", "restore ffn:1", "", "", ""]})
    fig = draw_figure("adapt", df)
    ax = fig.axes[0]
    steps = [ln for ln in ax.get_lines() if ln.get_drawstyle() == "steps-post"]
    assert [ln.get_label() for ln in steps] == ["available", "a", "b"]
    np.testing.assert_allclose(steps[1].get_ydata(), [300, 200, 250])   # MiB
    marks = {ln.get_marker(): list(ln.get_xdata()) for ln in ax.get_lines()
             if ln.get_linestyle() == "None" and len(ln.get_xdata())}
    assert marks == {"v": [100.0], "^": [200.0]}                         # ms: drop at 0.1 s, restore at 0.2 s
    assert len(ax.collections) == 1                                      # b over budget at 0.1 s only


def test_trace_statistics_figures_draw_one_line_per_layer_and_the_aggregate(tiny_trace_dir: Path) -> None:
    from analysis.figures.trace_stats import draw_hot_cdf, draw_per_layer, draw_window_coverage
    from traces.format import open_trace
    from traces.stats import trace_stats

    stats = trace_stats(open_trace(tiny_trace_dir)).to_json()
    n = len(stats["per_layer"])
    cov = draw_window_coverage(stats).axes[0].get_lines()
    assert len(cov) == n + 1 and cov[-1].get_label() == "all layers"   # thin per-layer lines, then the whole
    ks = [int(k) for k, v in stats["window_coverage"].items() if v is not None]
    np.testing.assert_allclose(cov[-1].get_ydata(), [stats["window_coverage"][str(k)] for k in ks])
    hot = draw_hot_cdf(stats).axes[0]
    assert [ln.get_label() for ln in hot.get_lines()][n:n + 2] == ["all layers", "no skew"]
    per = draw_per_layer(stats).axes[0]
    assert all(list(ln.get_xdata()) == list(range(n)) for ln in per.get_lines())
    assert per.get_ylim() == (0, 1)
