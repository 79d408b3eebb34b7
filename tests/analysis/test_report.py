"""The HTML report: self-contained (no external resource), figures embedded, tables and
configuration present; bad inputs are one-line errors. The browser check is marked `browser`."""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from analysis.report import build_report
from analysis.sweep import run_sweep
from flashsim.main import main
from tests.analysis.sweep_helpers import results_table

H = "tests.analysis.sweep_helpers:"


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag, attrs) -> None:
        self.tags.append(tag)
        self.refs += [v for k, v in attrs if k in ("src", "href", "srcset", "data", "poster") and v]


def _parse(page: str) -> _Collect:
    p = _Collect()
    p.feed(page)
    return p


@pytest.fixture(scope="module")
def results_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("results") / "results.parquet"
    results_table().to_parquet(path)
    return path


@pytest.fixture(scope="module")
def built(results_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One report of the results table with a plan section (drawing its figures takes seconds), shared
    by the tests that only read it."""
    tmp = tmp_path_factory.mktemp("report")
    return build_report(results_file, tmp / "rep", title="unit test", plan=_plan_json(tmp / "plan.json"))


def test_report_is_self_contained_with_figures_and_tables(built: Path) -> None:
    page = built.read_text()
    p = _parse(page)
    assert p.refs and all(r.startswith("data:image/png;base64,") for r in p.refs)
    assert not re.search(r"https?://", page) and "<script" not in page and "@import" not in page
    for ref in p.refs:  # every embedded image is a real PNG
        assert base64.b64decode(ref.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    # breakdown (2 budgets: one figure, 2 panels), budget, window, pareto, and the device's read curve
    assert len(p.refs) == 5
    assert "<title>flashsim report: unit test</title>" in page
    assert "Failed points (2)" in page and "does not fit" in page[page.index("Failed points (2)"):]
    best = page[page.index("Fastest configuration (any quality)"):page.index("Fastest configuration keeping")]
    assert "llm-in-a-flash[window.k=8]" in best and "<td class=n>100</td>" in best  # 1e3 / 10 ms
    full = page[page.index("Fastest configuration keeping"):page.index("<h2>Figures")]
    assert "hybrid" in full and "<td class=n>20</td>" in full  # mass kept 1.0: 1e3 / 50 ms
    figs = sorted(f.name for f in (built.parent / "figures").iterdir())
    assert "breakdown.png" in figs and "breakdown.svg" in figs and "read-curve-0.png" in figs


def test_report_of_a_sweep_directory_notes_what_it_cannot_draw(write_spec, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture) -> None:
    spec = write_spec("devices: [apple-m1-max]\npresets: [naive, {name: w, set: {k: [1, 2]}}]\n")
    out = tmp_path / "sweep"
    run_sweep(spec, out, workers=1, evaluator=H + "fake_point", progress=False)
    assert main(["report", str(out), "--out", str(tmp_path / "rep")]) == 0
    assert "report:" in capsys.readouterr().out
    page = (tmp_path / "rep" / "report.html").read_text()
    # the stand-in evaluator has no latency parts: that figure says why it is missing
    assert "Figure <b>breakdown</b> not drawn: breakdown: the results have no column io_ms_per_token" in page
    assert "tests.analysis.sweep_helpers:fake_point" in page  # provenance
    assert "Sweep specification" in page and "apple-m1-max" in page


def test_report_bad_inputs_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for argv, expect in [
        (["report", str(tmp_path / "nothing"), "--out", str(tmp_path / "r")], "no such sweep directory or results file"),
        (["report", str(tmp_path), "--out", str(tmp_path / "r")], "not a sweep directory"),
    ]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert expect in err and err.count("\n") == 1, err


def _chromium() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


@pytest.mark.browser
def test_report_renders_in_headless_chromium(results_file: Path, tmp_path: Path) -> None:
    exe = _chromium()
    if exe is None:
        pytest.skip("no chromium on PATH (Debian: apt-get install -y chromium)")
    page = build_report(results_file, tmp_path / "rep")
    shot = tmp_path / "shot.png"
    with tempfile.TemporaryDirectory() as profile:
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={profile}", "--window-size=1280,2000"]
        subprocess.run([exe, *flags, f"--screenshot={shot}", page.as_uri()], check=True,
                       capture_output=True, timeout=120)
        dom = subprocess.run([exe, *flags, "--dump-dom", page.as_uri()], check=True, capture_output=True,
                             text=True, timeout=120).stdout
    assert "flashsim report" in dom and dom.count("<img") == 5
    from matplotlib.image import imread

    img = imread(shot)
    assert img.shape[:2] == (2000, 1280)
    # Not a blank page: the embedded figures put colour (the bars, the heatmap) on the screen.
    rgb = img[..., :3]
    colourful = np.abs(rgb - rgb.mean(axis=2, keepdims=True)).max(axis=2) > 0.15
    assert colourful.mean() > 0.01


def _plan_json(path: Path) -> Path:
    """A minimal `flashsim plan --json` output with one feasible and one refused configuration."""
    import json

    row = dict(label="llm-in-a-flash window.k=5", feasible=True, tokens_per_s=12.5, dram_peak_bytes=2**31,
               activation_mass_kept=0.9, binding_constraint="flash bandwidth", reasons=[])
    bad = dict(row, label="dense", feasible=False, tokens_per_s=None, dram_peak_bytes=None,
               activation_mass_kept=None, binding_constraint="memory capacity",
               reasons=["does not fit: 3.00 GiB more"])
    path.write_text(json.dumps({
        "model": "llama-3.2-3b", "device": "jetson-orin-nano-8gb", "feasible": True, "best": row,
        "configurations": [row, bad], "min_dram_bytes": 3 * 2**30,
        "trace": {"description": "synthetic, fitted to smollm2-135m"}, "notes": ["quality is a proxy"]}))
    return path


def test_report_shows_the_plan(built: Path) -> None:
    page = built.read_text()
    assert "What-if plan: llama-3.2-3b on jetson-orin-nano-8gb" in page
    assert "feasible: best <b>llm-in-a-flash window.k=5</b>, 12.50 tok/s, 2.00 GiB" in page
    assert "smallest DRAM meeting the target: 3.00 GiB" in page
    assert "does not fit: 3.00 GiB more" in page and "quality is a proxy" in page


def test_report_bad_plan_is_a_one_line_error(results_file: Path, tmp_path: Path, capsys) -> None:
    bad = tmp_path / "plan.json"
    bad.write_text('{"model": "x"}')
    assert main(["report", str(results_file), "--out", str(tmp_path / "r"), "--plan", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing device, feasible" in err
