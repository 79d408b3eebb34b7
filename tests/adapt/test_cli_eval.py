"""`flashsim adapt eval` end to end through the real entry point (small workloads: fast)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from adapt.importance import block_names, make_gsi_document, write_gsi_file
from flashsim.main import main

SMALL = ["--batch", "4", "--prompt-tokens", "16", "--tokens", "24", "--decide-every", "4"]


@pytest.fixture(scope="module")
def gsi_file(tmp_path_factory):
    """A synthetic but valid 30-layer GSI file (numbers made up: one-shot ppl grows with the index)."""
    names = block_names(30)
    rng = np.random.default_rng(1)
    alone = {b: 20.0 * math.exp(0.02 * (i + 1) * rng.uniform(0.5, 1.5)) for i, b in enumerate(names)}
    one = sorted(alone.items(), key=lambda kv: (kv[1], names.index(kv[0])))
    gsi, p = [], 20.0
    for b, v in one[:10]:
        p *= v / 20.0
        gsi.append((b, p))
    doc = make_gsi_document(dense_ppl=20.0, gsi=gsi, one_shot=one, model_name="smollm2-135m", n_layers=30,
                            text_sha256="0" * 64, text_source="builtin", n_tokens=64)
    path = tmp_path_factory.mktemp("gsi") / "g.json"
    write_gsi_file(path, doc)
    return path


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_json_table(capsys, gsi_file):
    rc, out, err = run(capsys, "adapt", "eval", "--gsi", str(gsi_file), *SMALL, "--json",
                       "--timelines", "step:t=30%,from=1.0,to=0.6;bursts:seed=2,rate=5,depth=0.25",
                       "--controllers", "static-ratio,static-window,heuristic,heuristic-bytes")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["workload"] == {"batch": 4, "prompt_tokens": 16, "decode_tokens": 24, "kv_tokens_max": 4 * 40}
    assert doc["gsi"]["steps"] == 10 and doc["gsi"]["blocks"] == 60 and doc["quality"] == "estimate"
    assert [t["label"] for t in doc["timelines"]] == ["0.8", "0.6", "step:t=30%,from=1.0,to=0.6",
                                                     "bursts:seed=2,rate=5,depth=0.25"]
    assert len(doc["rows"]) == 4 * 4
    by = {(r["controller"], r["timeline"]): r for r in doc["rows"]}
    for t in doc["timelines"]:
        for h in ("heuristic", "heuristic-bytes"):
            r = by[(h, t["label"])]
            assert r["status"] == "ok" and r["violations"] == 0 and r["max_over_bytes"] == 0
            assert r["ppl"] >= 20.0 * 0.999 and r["tokens_per_s"] > 0
    # a step from 100% to 60%: static-window sized at 100% keeps every neuron resident and must fail
    sw = by[("static-window", "step:t=30%,from=1.0,to=0.6")]
    assert sw["violations"] > 0 and sw["status"] == "FAIL (allowed)" and sw["ppl"] == pytest.approx(20.0)
    assert by[("static-ratio", "0.6")]["status"] in ("ok", "FAIL (allowed)")
    # pruning is faster than the dense model; streaming FFN weights from flash is slower
    dense_tps = 4 * 24 / doc["horizon_s"]
    assert by[("heuristic", "0.6")]["tokens_per_s"] > dense_tps > by[("static-window", "0.6")]["tokens_per_s"]
    assert doc["full_need_bytes"] > doc["always_bytes"] > 0


def test_deterministic_json(capsys, gsi_file):
    argv = ["adapt", "eval", "--gsi", str(gsi_file), *SMALL, "--json", "--timelines",
            "bursts:seed=5,rate=9,depth=0.3", "--budgets", "", "--controllers", "heuristic,static-ratio"]
    _, a, _ = run(capsys, *argv)
    _, b, _ = run(capsys, *argv)
    strip = [{k: v for k, v in r.items() if k != "decide_us"} for r in json.loads(a)["rows"]]
    assert strip == [{k: v for k, v in r.items() if k != "decide_us"} for r in json.loads(b)["rows"]]


def test_table_and_plot(capsys, gsi_file, tmp_path):
    rc, out, err = run(capsys, "adapt", "eval", "--gsi", str(gsi_file), *SMALL, "--budgets", "0.7",
                       "--timelines", "sawtooth:period=50%,low=0.6,high=1.0",
                       "--controllers", "heuristic", "--plot", str(tmp_path / "fig"))
    assert rc == 0, err
    assert "controller" in out and "heuristic" in out and "sawtooth" in out
    assert (tmp_path / "fig" / "adapt.png").stat().st_size > 0 and (tmp_path / "fig" / "adapt.svg").is_file()
    from analysis.tables import load_memory_records

    rec = load_memory_records(tmp_path / "fig" / "adapt_records.csv")
    assert set(rec["controller"]) == {"heuristic"} and len(rec) == 2 * 24
    rc, out, err = run(capsys, "plot", "adapt", str(tmp_path / "fig" / "adapt_records.csv"), "--out",
                       str(tmp_path / "again"))
    assert rc == 0, err
    assert (tmp_path / "again" / "adapt.png").is_file()


def test_learned_is_skipped_with_a_reason_without_weights(capsys, gsi_file, monkeypatch, tmp_path):
    from adapt import controllers

    monkeypatch.setattr(controllers, "learned_unavailable", lambda w: "no weights here (test)")
    rc, out, err = run(capsys, "adapt", "eval", "--gsi", str(gsi_file), *SMALL, "--budgets", "0.8",
                       "--timelines", "", "--controllers", "heuristic,learned", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["skipped"] == {"learned": "no weights here (test)"} and doc["controllers"] == ["heuristic"]


@pytest.mark.parametrize("argv, needle", [
    (["--controllers", "heuristc"], "did you mean 'heuristic'"),
    (["--controllers", ","], "at least one"),
    (["--timelines", "wave:x=1"], "unknown timeline kind 'wave'"),
    (["--budgets", "lots"], "--budgets 'lots'"),
    (["--budgets", "", "--timelines", ""], "nothing to evaluate"),
    (["--tokens", "0"], "--tokens must be >= 1"),
    (["--batch", "0"], "--batch must be >= 1"),
    (["--prompt-tokens", "99"], "prompt_tokens=99"),
    (["--decide-every", "0"], "--decide-every must be >= 1"),
    (["--gsi", "/no/such.json"], "no such GSI file"),
    (["--weights", "/no/such.safetensors"], "--weights"),
    (["--device", "nope"], "nope"),
])
def test_bad_input_one_line_exit_2(capsys, gsi_file, argv, needle):
    full = ["adapt", "eval", *SMALL, *argv]
    if "--gsi" not in argv:
        full += ["--gsi", str(gsi_file)]
    rc, out, err = run(capsys, *full)
    assert rc == 2 and out == ""
    assert needle in err and len(err.strip().splitlines()) == 1


def test_gsi_of_another_model_is_one_line(capsys, tmp_path):
    from tests.adapt.conftest import tiny_doc

    path = tmp_path / "tiny.json"
    write_gsi_file(path, tiny_doc())
    rc, _, err = run(capsys, "adapt", "eval", "--gsi", str(path), *SMALL)
    assert rc == 2 and "2 layers" in err and "60 blocks" in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_quality_real_on_smollm2(capsys):
    """--quality real measures the dropped sets on SmolLM2 (blocks skipped): static-ratio drops the k
    least important blocks = the k blocks of the shipped file's GSI order, whose measured perplexity is
    what the file recorded (skipping a block computes the same function as zeroing its output)."""
    pytest.importorskip("torch")
    from pathlib import Path

    from adapt.importance import read_gsi_file

    shipped = Path(__file__).resolve().parents[3] / "sim" / "adapt" / "data" / "smollm2-135m.gsi.json"
    if not shipped.is_file():
        pytest.skip("no shipped SmolLM2 GSI file")
    doc = read_gsi_file(shipped)
    k = min(len(doc["gsi"]), 3)
    argv = ["adapt", "eval", "--batch", "2", "--prompt-tokens", "8", "--tokens", "8", "--budgets", "1.0",
            "--timelines", "", "--controllers", "static-ratio", "--static-ratio", str(k / 60), "--json"]
    rc, out, err = run(capsys, *argv, "--quality", "real")
    assert rc == 0, err
    real = {r["timeline"]: r for r in json.loads(out)["rows"]}
    rc, out, _ = run(capsys, *argv)
    est = {r["timeline"]: r for r in json.loads(out)["rows"]}
    assert json.loads(out)["quality"] == "estimate" and real["1.0"]["mean_dropped"] == k
    assert real["1.0"]["ppl"] == pytest.approx(est["1.0"]["ppl"], rel=1e-3)
    assert real["1.0"]["ppl"] == pytest.approx(doc["gsi"][k - 1]["ppl_after"], rel=1e-3)


def test_learned_controller_runs_with_a_weights_file(capsys, gsi_file, tmp_path):
    """The learned controller (module) joins the table when given weights: here random
    ones in its documented file format; its safety rule keeps it within a feasible budget."""
    learned = pytest.importorskip("adapt.controllers.learned")
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    rng = np.random.default_rng(0)
    sizes = (learned.OBS_DIM, 16, 16, 2)
    params = {}
    for k, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        params[f"w{k}"] = rng.uniform(-0.5, 0.5, (a, b)).astype(np.float32)
        params[f"b{k}"] = np.zeros(b, np.float32)
    weights = tmp_path / "policy.safetensors"
    safetensors_numpy.save_file(params, str(weights), metadata={"format": learned.WEIGHTS_FORMAT,
                                                                "obs_version": str(learned.OBS_VERSION)})
    rc, out, err = run(capsys, "adapt", "eval", "--gsi", str(gsi_file), *SMALL, "--budgets", "0.7",
                       "--timelines", "bursts:seed=1,rate=6,depth=0.25", "--controllers", "learned",
                       "--weights", str(weights), "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["controllers"] == ["learned"] and doc["skipped"] == {}
    assert [r["violations"] for r in doc["rows"]] == [0, 0]
