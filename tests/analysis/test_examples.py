"""The example sweep files load, expand and name only real devices, presets and parameters."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis.sweep_spec import expand, load_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "sweeps"
pytest.importorskip("sim.engine", reason="the simulator is not in this checkout yet")


def test_smollm2_example_resolves() -> None:
    from analysis.sweep_point import check_points

    points = expand(load_spec(EXAMPLES / "smollm2-window-budget.yaml"))
    assert len(points) == 2 * 4 * (6 + 5)
    check_points(points)


def test_llama2_toml_example_resolves(tmp_path: Path) -> None:
    from analysis.sweep_point import check_points
    from devices import load_model
    from traces.synthetic import synthesize

    synthesize(tmp_path / "llama2-7b-synth", load_model("llama-2-7b"), 8, seed=0, active_fraction=0.1,
               overlap=0.6, hot_skew=0.3, magnitudes=False)  # a short trace: the example's shape only
    text = (EXAMPLES / "llama2-7b-synthetic.toml").read_text()
    copy = tmp_path / "examples" / "sweeps" / "x.toml"
    copy.parent.mkdir(parents=True)
    copy.write_text(text.replace('"../../traces/llama2-7b-synth"', f'"{tmp_path / "llama2-7b-synth"}"'))
    points = expand(load_spec(copy))
    assert len(points) == 2 * 4 * (3 + 4 + 2 + 3)
    check_points(points)


@pytest.mark.slow
def test_smollm2_example_runs(tmp_path: Path) -> None:
    from analysis.sweep import run_sweep
    from analysis.tables import load_results

    o = run_sweep(EXAMPLES / "smollm2-window-budget.yaml", tmp_path / "out", workers=2, progress=False)
    assert o.n_run == o.n_points == 88
    assert len(load_results(tmp_path / "out").table) == 88
