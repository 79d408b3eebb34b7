"""`flashsim trace stats|synth|profile` end to end through `flashsim.main.main`, including bad input
(one line on stderr, exit 2, nothing half-written)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from flashsim.main import main
from tests.traces.test_format import random_trace
from traces.format import open_trace


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def trace(tmp_path) -> Path:
    return random_trace(tmp_path / "trace", n_layers=2, n_tokens=30, n=24, top_k=6)


def test_stats_json_has_the_documented_keys(capsys, trace):
    code, out, _ = run(capsys, "trace", "stats", str(trace), "--json")
    assert code == 0
    s = json.loads(out)
    keys = {"n_tokens", "n_layers", "n_neurons", "active_fraction", "overlap_prev", "window_coverage",
            "hot80_fraction", "hot80_mass_fraction", "task_hot_overlap", "hot_cdf", "per_layer"}
    assert keys <= set(s)
    assert (s["n_tokens"], s["n_layers"], s["n_neurons"]) == (30, 2, 24)
    assert list(s["window_coverage"]) == [str(k) for k in range(1, 17)]
    assert len(s["per_layer"]) == 2
    assert keys - {"n_tokens", "n_layers", "n_neurons", "per_layer"} <= set(s["per_layer"][0])
    assert len(s["task_hot_overlap"]) == 3                       # qa, code, story: three pairs
    assert len(s["hot_cdf"]) == len(s["hot_cdf_grid"])


def test_stats_table_and_phase(capsys, trace):
    code, out, _ = run(capsys, "trace", "stats", str(trace), "--phase", "decode")
    assert code == 0
    assert "layer  active  overlap" in out and "\n  all " in out and "phase decode" in out
    assert "Jaccard" in out


def test_stats_plots(capsys, trace, tmp_path):
    code, out, _ = run(capsys, "trace", "stats", str(trace), "--plot", str(tmp_path / "figs"))
    assert code == 0
    files = sorted(p.name for p in (tmp_path / "figs").iterdir())
    assert files == sorted(f"{n}.{e}" for n in ("window_coverage", "hot_cdf", "per_layer") for e in ("png", "svg"))
    assert (tmp_path / "figs" / "hot_cdf.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in (tmp_path / "figs" / "per_layer.svg").read_bytes()[:2000]


def test_synth_parameters_then_stats(capsys, tmp_path):
    out_dir = tmp_path / "syn"
    code, out, _ = run(capsys, "trace", "synth", "--model", "smollm2-135m", "--tokens", "200", "--out",
                       str(out_dir), "--seed", "3", "--active-fraction", "0.1", "--overlap", "0.5",
                       "--hot-skew", "0.5", "--json")
    assert code == 0
    summary = json.loads(out)
    assert summary["mode"] == "parameters" and summary["n_layers"] == 30 and summary["n_neurons"] == 1536
    t = open_trace(out_dir)
    assert t.is_synthetic and "--seed 3" in t.manifest.provenance["command"]
    code, out, _ = run(capsys, "trace", "stats", str(out_dir), "--json")
    s = json.loads(out)
    assert s["synthetic"] and abs(s["overlap_prev"] - 0.5) < 0.03 and abs(s["active_fraction"] - 0.1) < 0.03


def test_synth_like_defaults_to_the_source(capsys, trace, tmp_path):
    code, out, _ = run(capsys, "trace", "synth", "--like", str(trace), "--out", str(tmp_path / "s"))
    assert code == 0
    assert "t/a = target" in out and "wrote" in out
    t = open_trace(tmp_path / "s")
    assert (t.n_layers, t.n_neurons, t.n_tokens) == (2, 24, 30)
    assert t.manifest.synthetic["source"]["path"] == str(trace)


def test_profile(capsys, trace, tmp_path):
    code, out, _ = run(capsys, "trace", "profile", str(trace), str(trace), "--out", str(tmp_path / "p.npz"),
                       "--json")
    assert code == 0
    s = json.loads(out)
    assert [t["task"] for t in s["tasks"]] == ["code", "qa", "story"]
    assert s["tasks"][0]["tokens"] == 2 * 10
    with np.load(tmp_path / "p.npz", allow_pickle=False) as z:
        assert z["scores_all"].shape == (2, 24)
    code, out, _ = run(capsys, "trace", "profile", str(trace), "--out", str(tmp_path / "q.npz"))
    assert code == 0 and "top-10% score share" in out


def _one_line_error(code: int, err: str, needle: str) -> None:
    assert code == 2
    assert err.startswith("flashsim: error:") and err.count("\n") == 1, err
    assert needle in err, err


def _damage(src: Path, dst: Path, how: str) -> Path:
    shutil.copytree(src, dst)
    if how == "missing":
        (dst / "abs_sum.npy").unlink()
    elif how == "extra":
        np.save(dst / "stray.npy", np.zeros(2))
    elif how == "truncated":
        b = (dst / "top_idx.npy").read_bytes()
        (dst / "top_idx.npy").write_bytes(b[:100])
    elif how == "schema":
        m = json.loads((dst / "manifest.json").read_text())
        m["schema_version"] = 2
        (dst / "manifest.json").write_text(json.dumps(m))
    elif how == "nan":
        a = np.load(dst / "top_mag.npy")
        a[0, 0, 0] = np.nan
        np.save(dst / "top_mag.npy", a)
        m = json.loads((dst / "manifest.json").read_text())
        m["files"]["top_mag"]["sha256"] = hashlib.sha256((dst / "top_mag.npy").read_bytes()).hexdigest()
        (dst / "manifest.json").write_text(json.dumps(m))
    elif how == "spec":
        m = json.loads((dst / "manifest.json").read_text())
        m["model"]["n_layers"] = 5
        (dst / "manifest.json").write_text(json.dumps(m))
    return dst


@pytest.mark.parametrize("how, needle", [
    ("missing", "abs_sum.npy: missing array file"),
    ("extra", "unexpected file(s) ['stray.npy']"),
    ("truncated", "top_idx.npy"),
    ("schema", "schema_version"),
    ("nan", "NaN"),
    ("spec", "n_layers"),
])
@pytest.mark.parametrize("verb", ["stats", "synth", "profile"])
def test_bad_traces(capsys, trace, tmp_path, how, needle, verb):
    bad = _damage(trace, tmp_path / "bad", how)
    argv = {"stats": ["trace", "stats", str(bad), "--json"],
            "synth": ["trace", "synth", "--like", str(bad), "--out", str(tmp_path / "out")],
            "profile": ["trace", "profile", str(trace), str(bad), "--out", str(tmp_path / "out.npz")]}[verb]
    code, out, err = run(capsys, *argv)
    _one_line_error(code, err, needle)
    assert out == ""
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.npz").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("argv, needle", [
    (["--model", "no-such-model", "--tokens", "10", "--active-fraction", "0.1", "--overlap", "0.5",
      "--hot-skew", "0.5"], "unknown model 'no-such-model'"),
    (["--model", "smollm2-135m", "--tokens", "10"], "missing --active-fraction, --overlap, --hot-skew"),
    (["--model", "smollm2-135m", "--tokens", "1", "--active-fraction", "0.1", "--overlap", "0.5",
      "--hot-skew", "0.5"], "--tokens 1"),
    (["--model", "smollm2-135m", "--tokens", "100", "--active-fraction", "0.1", "--overlap", "0.5",
      "--hot-skew", "0.01"], "--hot-skew 0.01"),
    (["--active-fraction", "0.1", "--overlap", "0.5", "--hot-skew", "0.5"], "--model and --tokens"),
])
def test_synth_bad_arguments(capsys, tmp_path, argv, needle):
    code, _, err = run(capsys, "trace", "synth", "--out", str(tmp_path / "o"), *argv)
    _one_line_error(code, err, needle)
    assert list(tmp_path.iterdir()) == []


def test_synth_like_with_parameters_and_existing_out(capsys, trace, tmp_path):
    code, _, err = run(capsys, "trace", "synth", "--like", str(trace), "--overlap", "0.3", "--out", str(tmp_path / "o"))
    _one_line_error(code, err, "drop --overlap")
    code, _, err = run(capsys, "trace", "synth", "--like", str(trace), "--out", str(trace))
    _one_line_error(code, err, "already exists")
    code, _, _ = run(capsys, "trace", "synth", "--like", str(trace), "--out", str(tmp_path / "o"), "--tokens", "12")
    assert code == 0
    code, _, _ = run(capsys, "trace", "synth", "--like", str(trace), "--out", str(tmp_path / "o"), "--force")
    assert code == 0 and open_trace(tmp_path / "o").n_tokens == 30


def test_profile_and_stats_bad_arguments(capsys, trace, tmp_path):
    other = random_trace(tmp_path / "other", n_layers=1, n_tokens=9, n=24)
    code, _, err = run(capsys, "trace", "profile", str(trace), str(other), "--out", str(tmp_path / "p.npz"))
    _one_line_error(code, err, "1 x 24 neurons, but the first trace has 2 x 24")
    code, _, err = run(capsys, "trace", "profile", str(trace), "--out", str(tmp_path / "p.txt"))
    _one_line_error(code, err, "must end in .npz")
    code, _, err = run(capsys, "trace", "stats", str(tmp_path / "nowhere"))
    _one_line_error(code, err, "not a trace directory")
    (tmp_path / "file").write_text("x")
    code, _, err = run(capsys, "trace", "stats", str(trace), "--plot", str(tmp_path / "file"))
    _one_line_error(code, err, "cannot create the folder")
    with pytest.raises(SystemExit) as e:                          # argparse: usage error, exit 2
        main(["trace", "stats", str(trace), "--phase", "sometimes"])
    assert e.value.code == 2 and "invalid choice" in capsys.readouterr().err
    assert not (tmp_path / "p.npz").exists()
