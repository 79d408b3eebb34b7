"""`flashsim validate --keep DIR` and `--rescore DIR`: the kept grid's contract, rescoring by hand,
bad input, and that a kept folder is whole or absent."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from devices import load_profile
from devices.errors import FlashsimError
from flashsim.main import main
from real.validation import validate_keep as K
from sim.config import RunConfig
from sim.engine import simulate
from tests.real.conftest import tiny_spec
from tests.real.test_validate import tiny_grids
from traces.format import open_trace
from traces.synthetic import synthesize

pytest.importorskip("torch")


def _sim_grid(tmp_path: Path, factors: tuple[float, ...]) -> tuple[list[tuple], list]:
    """Replays as validate collects them, with 'real' runs made from one simulation: pass p's
    latencies are the simulated ones x factors[p], everything else equal."""
    spec = tiny_spec()
    trace_dir = synthesize(tmp_path / "trace", spec, 12, 0, active_fraction=0.2, overlap=0.8, hot_skew=0.3,
                           prompt_tokens=12, overwrite=True)
    cfg = RunConfig().with_overrides(["prefetch=none", "seed=0"])
    prof = load_profile("this-host")
    sim = simulate(open_trace(trace_dir), spec, prof, cfg, fast=False)
    runs = [[dataclasses.replace(t, latency_s=t.latency_s * f) for t in sim.tokens] for f in factors]
    row = {"mode": "shape", "config": "shape: hand", "k": 0, "bundled": True, "prefetch": "none",
           "budget_fraction": 0.5, "budget_bytes": 1 << 20, "direct_io": True}
    return [(row, trace_dir, spec, cfg, runs, [1.0 + p for p in range(len(factors))])], sim.tokens


def test_rescore_by_hand(tmp_path):
    # real latency = the simulated x 1.2 in pass 0 and x 1.3 in pass 1: their mean is x 1.25, so the
    # simulator's latency error is |1 - 1.25| / 1.25 = 0.2, their spread (1.3 - 1.2) / 1.2 = 1/12;
    # every other metric is the simulator's own (error 0)
    replays, _ = _sim_grid(tmp_path, (1.2, 1.3))
    keep = K.write_kept_grid(tmp_path / "kept", replays, {"profile": "this-host", "tokens": 12, "quick": True,
                                                          "seed": 0, "repeats": 2}, t0=0.5)
    doc = json.loads((keep / "grid.json").read_text())
    assert doc["version"] == K.KEEP_VERSION and doc["configs"][0]["run_times_s"] == [0.5, 1.5]
    assert sorted(p.name for p in keep.iterdir()) == ["grid.json", "runs.parquet", "traces"]    # no profile given
    assert doc["configs"][0]["passes"] == 2 and doc["configs"][0]["trace"].startswith("traces/")
    rep = K.rescore(keep, load_profile("this-host"))
    m = rep["configs"][0]["metrics"]
    assert m["latency_s"]["error"] == pytest.approx(0.2)
    assert m["latency_s"]["spread"] == pytest.approx(1 / 12)
    assert m["io_s"]["error"] == 0.0 and m["bytes_read"]["error"] == 0.0
    assert rep["n_configs"] == 1 and rep["latency_error_median"] == pytest.approx(0.2)
    assert rep["rescored_from"] == str(keep) and rep["repeats"] == 2 and rep["per_group"][0]["n_configs"] == 1
    g = rep["per_group"][0]     # signed: (sim - real) / real = (1 - 1.25) / 1.25; compute is the simulator's own
    assert g["latency_signed_median"] == g["latency_signed_q25"] == g["latency_signed_q75"] == pytest.approx(-0.2)
    assert g["compute_signed_median"] == 0.0 and g["io_signed_median"] == 0.0
    # another profile is what the replay runs on: a disk half as fast reads twice as long
    prof = load_profile("this-host")
    table = prof.flash.read_table.model_copy(update={"bytes_per_s": [[b / 2 for b in row] for row in
                                                                     prof.flash.read_table.bytes_per_s]})
    slow = prof.model_copy(update={"flash": prof.flash.model_copy(update={"read_table": table})})
    m2 = K.rescore(keep, slow)["configs"][0]["metrics"]
    assert m2["io_s"]["sim"] > 1.5 * m["io_s"]["sim"] and m2["io_s"]["real"] == m["io_s"]["real"]


def test_rescore_many_by_hand(tmp_path, capsys):
    # grid a: real = sim x 1.2 and x 1.3 (latency error 0.2, spread 1/12, signed -0.2);
    # grid b: real = sim, one pass (error 0, no spread). Over the two: median error 0.1 (0-0.2); the
    # pooled group's signed errors -0.2 and 0: median -0.1, quartiles -0.15 and -0.05 (linear)
    kept = []
    for name, factors in (("a", (1.2, 1.3)), ("b", (1.0,))):
        (tmp_path / name).mkdir()
        replays, _ = _sim_grid(tmp_path / name, factors)
        kept.append(K.write_kept_grid(tmp_path / name / "kept", replays, {"profile": "this-host", "tokens": 12,
                                                                          "repeats": len(factors)}, t0=0.0))
    many = K.rescore_many(kept, load_profile("this-host"))
    assert many["n_grids"] == 2 and many["n_configs"] == 2 and len(many["per_grid"]) == 2
    assert [g["latency_error_median"] for g in many["grids"]] == pytest.approx([0.2, 0.0])
    assert [g["rescored_from"] for g in many["grids"]] == [str(k) for k in kept]
    assert many["grids"][0]["noise_latency_median"] == pytest.approx(1 / 12)
    assert many["grids"][1]["noise_latency_median"] is None
    # grid a's passes alone: the simulator (1) against 1.2 and 1.3 -> 1/6, 3/13; each pass against
    # the other -> 1/12, 1/13; grid b has one pass, so nothing to score alone
    a, b = many["grids"]
    assert a["pass_latency_error_median"] == pytest.approx((1 / 6 + 3 / 13) / 2)
    assert a["rest_latency_error_median"] == pytest.approx((1 / 12 + 1 / 13) / 2)
    assert b["pass_latency_error_median"] is None and b["rest_latency_error_median"] is None
    # no calibration run among the grid's configurations: no level is fitted, none taken out
    assert a["level_removed_latency_error_p90"] is None
    assert many["repeatability"]["latency_s"]["other_passes"]["max"] == pytest.approx(1 / 12)
    assert many["latency_error_median"] == pytest.approx({"median": 0.1, "min": 0.0, "max": 0.2})
    (g,) = many["per_group"]
    assert g["n_configs"] == 2 and g["latency_signed_median"] == pytest.approx(-0.1)
    assert g["latency_signed_q25"] == pytest.approx(-0.15) and g["latency_signed_q75"] == pytest.approx(-0.05)
    # between the grids: b's real runs are a's / 1.25 (a factor of 0.8 for the mode), 25% apart raw
    # and 0 after the factor
    (pair,) = many["between_grids"]["pairs"]
    assert pair["factor"] == pytest.approx({"shape": 0.8}) and pair["raw"]["median"] == pytest.approx(0.25)
    assert pair["scaled"]["p90"] == pytest.approx(0.0, abs=1e-12)
    # through the CLI: a table per grid, the spread, the pooled groups; JSON the same numbers
    assert main(["validate", "--rescore", *map(str, kept)]) == 0
    text, err = capsys.readouterr()
    assert "[1/1] kept: shape: hand: latency error 20.0%" in err      # progress names each grid
    assert "on 2 kept grids (2 configurations)" in text and all(str(k) in text for k in kept)
    assert "over the 2 grids: latency error median 10.0% (0.0%-20.0%)" in text
    assert "each real pass alone, pooled: the simulator's latency error median 19.9%" in text
    assert "shape, bundled, prefetch none" in text and "-15.0% to -5.0%" in text
    assert "the host against itself" in text and "shape 0.800" in text and "over the 1 pairs, after the factor" in text
    assert main(["validate", "--rescore", *map(str, kept), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["latency_error_median"]["median"] == pytest.approx(0.1) and out["n_grids"] == 2
    for g, rep in zip(out["grids"], out["per_grid"], strict=True):     # each grid's floor in its row
        assert g["floor"] == rep["floor"] and set(g["floor"]["metrics"]) == {"latency_s", "io_s", "compute_s"}
    # one grid of two passes plots each point with its passes' range
    assert main(["validate", "--rescore", str(kept[0]), "--plot", str(tmp_path / "one")]) == 0
    assert (tmp_path / "one" / "validate_scatter.png").stat().st_size > 0
    capsys.readouterr()
    # several grids make one plot each: refused, as is a missing folder among them (one line each)
    assert main(["validate", "--rescore", *map(str, kept), "--plot", str(tmp_path / "figs")]) == 2
    err = capsys.readouterr().err
    assert "--plot with several --rescore folders" in err and err.count("\n") == 1
    assert main(["validate", "--rescore", str(kept[0]), str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err
    assert "nothing" in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "figs").exists()


def test_keep_and_rescore_through_the_cli(monkeypatch, tmp_path, capsys):
    calls = tiny_grids(monkeypatch, tmp_path)
    work, keep = tmp_path / "work", tmp_path / "kept"
    work.mkdir()
    assert main(["validate", "--quick", "--json", "--tokens", "6", "--repeats", "2", "--workdir", str(work),
                 "--keep", str(keep), "--modes", "moe,shape"]) == 2     # MoE rows cannot be kept: refused first
    assert "--modes shape,model" in capsys.readouterr().err and not keep.exists()
    assert main(["validate", "--quick", "--json", "--tokens", "6", "--repeats", "2", "--workdir", str(work),
                 "--keep", str(keep), "--modes", "shape,model"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kept"] == str(keep) and list(work.iterdir()) == [] and calls == [6]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".kept")) == []   # no temporary left
    doc = K.load_kept_grid(keep)
    assert [c["config"] for c in doc["configs"]] == [c["config"] for c in out["configs"]]
    assert all(c["passes"] == 2 for c in doc["configs"])
    # the profile validate replayed with is kept, and `--profile kept` rescores on it
    assert K.kept_profile(keep).model_dump() == load_profile("this-host").model_dump()
    # rescoring on the same profile gives the same errors: the replay is deterministic, the real runs kept
    assert main(["validate", "--rescore", str(keep), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert calls == [6]                  # nothing ran again
    for a, b in zip(out["configs"], again["configs"], strict=True):
        assert a["config"] == b["config"]
        for metric, v in a["metrics"].items():
            assert b["metrics"][metric]["error"] == pytest.approx(v["error"], abs=1e-12)
            assert b["metrics"][metric]["real"] == pytest.approx(v["real"], rel=1e-12)
    assert again["latency_error_median"] == pytest.approx(out["latency_error_median"])
    assert set(again["per_mode"]) == {"shape", "model"} and "drift_corrected" not in again
    assert main(["validate", "--rescore", str(keep), "--profile", "kept", "--json"]) == 0
    own = json.loads(capsys.readouterr().out)
    assert own["profile_kept"] is True and again["profile_kept"] is False
    assert own["latency_error_median"] == again["latency_error_median"]
    assert main(["validate", "--rescore", str(keep), "--profile", "kept"]) == 0
    text = capsys.readouterr().out
    assert f"rescored: the real runs kept in {keep} (2 per configuration" in text
    assert "(the profile kept with them)" in text
    assert "latency_s" in text and "group (sim - real" in text


def test_kept_profile_is_refused_without_rescore(capsys):
    assert main(["validate", "--quick", "--profile", "kept"]) == 2
    err = capsys.readouterr().err
    assert "--profile kept: only with --rescore" in err and err.count("\n") == 1


def test_equal_traces_are_kept_once_and_the_profile_loads_back_equal(tmp_path):
    replays, _ = _sim_grid(tmp_path, (1.1,))
    (row, trace, spec, cfg, runs, times), = replays
    other = synthesize(tmp_path / "other", spec, 12, 1, active_fraction=0.3, overlap=0.7, hot_skew=0.3,
                       prompt_tokens=12, overwrite=True)
    three = [(row, trace, spec, cfg, runs, times), ({**row, "config": "shape: again"}, trace, spec, cfg, runs, times),
             ({**row, "config": "shape: other"}, other, spec, cfg, runs, times)]
    prof = load_profile("this-host")
    keep = K.write_kept_grid(tmp_path / "kept", three, {"repeats": 1}, t0=0.0, profile=prof)
    doc = K.load_kept_grid(keep)
    assert doc["configs"][0]["trace"] == doc["configs"][1]["trace"] != doc["configs"][2]["trace"]
    assert len(list((keep / "traces").iterdir())) == 2
    assert K.kept_profile(keep).model_dump() == prof.model_dump()     # floats written exactly
    rep = K.rescore(keep)                                              # None: the kept profile
    assert rep["profile_kept"] and [c["config"] for c in rep["configs"]] == ["shape: hand", "shape: again",
                                                                          "shape: other"]
    assert rep["configs"][0]["metrics"] == rep["configs"][1]["metrics"]


def test_a_version_1_grid_is_still_read(tmp_path):
    # version 1: a folder per configuration with its trace and a Parquet file per pass, no profile
    import shutil
    from types import SimpleNamespace

    from real.runtime.run_outputs import write_records

    replays, sim_tokens = _sim_grid(tmp_path, (1.2, 1.3))
    (row, trace, spec, cfg, runs, _), = replays
    v1 = tmp_path / "v1"
    shutil.copytree(trace, v1 / "config-000" / "trace")
    for p, tokens in enumerate(runs):
        write_records(v1 / "config-000" / f"run-{p}.parquet", SimpleNamespace(tokens=tokens))
    entry = {**{k: row[k] for k in K.ROW_KEYS}, "trace": "config-000/trace",
             "runs": ["config-000/run-0.parquet", "config-000/run-1.parquet"], "run_times_s": [1.0, 2.0],
             "run_config": cfg.to_dict(), "spec": spec.model_dump(mode="json")}
    (v1 / "grid.json").write_text(json.dumps({"format": "flashsim-validate-keep", "version": 1, "repeats": 2,
                                              "configs": [entry]}))
    rep = K.rescore(v1, load_profile("this-host"))
    assert rep["configs"][0]["metrics"]["latency_s"]["error"] == pytest.approx(0.2)   # as test_rescore_by_hand
    with pytest.raises(FlashsimError, match="no profile.yaml"):
        K.rescore(v1)


def test_keep_refuses_an_existing_folder_before_running(tmp_path, capsys):
    (tmp_path / "kept").mkdir()
    assert main(["validate", "--quick", "--modes", "shape", "--keep", str(tmp_path / "kept")]) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and err.count("\n") == 1
    assert main(["validate", "--quick", "--modes", "shape", "--keep", str(tmp_path / "no" / "kept")]) == 2
    assert "no such folder" in capsys.readouterr().err


@pytest.mark.parametrize("flag", [["--quick"], ["--repeats", "2"], ["--modes", "shape"], ["--tokens", "8"],
                                  ["--keep", "x"], ["--check-every", "0"]])
def test_rescore_refuses_options_of_a_run(tmp_path, capsys, flag):
    assert main(["validate", "--rescore", str(tmp_path), *flag]) == 2
    err = capsys.readouterr().err
    assert "with --rescore" in err and flag[0] in err and "Traceback" not in err


def test_rescore_bad_input_is_one_line(tmp_path, capsys):
    replays, _ = _sim_grid(tmp_path, (1.0,))
    keep = K.write_kept_grid(tmp_path / "kept", replays, {"repeats": 1}, t0=0.0)
    grid = keep / "grid.json"
    good = grid.read_text()

    def err_of(*args: str) -> str:
        assert main(["validate", "--rescore", *args]) == 2
        e = capsys.readouterr().err
        assert e.count("\n") == 1 and "Traceback" not in e
        return e

    assert "no grid.json" in err_of(str(tmp_path))
    grid.write_text(good.replace('"version": 2', '"version": 99'))
    assert "version 99" in err_of(str(keep))
    grid.write_text("{not json")
    assert "not readable JSON" in err_of(str(keep))
    grid.write_text(json.dumps({"format": "something-else"}))
    assert "not a kept validation grid" in err_of(str(keep))
    grid.write_text(good)
    assert "--profile kept: no profile.yaml" in err_of(str(keep), "--profile", "kept")    # none was given
    runs = keep / "runs.parquet"
    records = runs.read_bytes()
    doc = json.loads(good)
    doc["configs"][0]["passes"] = 2
    grid.write_text(json.dumps(doc))
    assert "no records of configuration 0, pass 1" in err_of(str(keep))
    grid.write_text(good)
    runs.write_bytes(b"PAR1 truncated")
    assert "not a readable Parquet file" in err_of(str(keep))
    runs.unlink()
    assert "runs.parquet: missing" in err_of(str(keep))
    runs.write_bytes(records)
    doc = json.loads(good)
    doc["configs"][0]["run_config"]["no_such_section"] = {}
    grid.write_text(json.dumps(doc))
    assert "configuration 0" in err_of(str(keep))


def test_a_failed_keep_leaves_nothing(tmp_path, monkeypatch):
    replays, _ = _sim_grid(tmp_path, (1.0, 1.0))
    import pandas as pd

    def boom(self, *a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", boom)
    with pytest.raises(OSError):
        K.write_kept_grid(tmp_path / "kept", replays, {}, t0=0.0)
    assert not (tmp_path / "kept").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".kept")] == []


def test_load_kept_grid_needs_configurations(tmp_path):
    (tmp_path / "grid.json").write_text(json.dumps({"format": "flashsim-validate-keep", "version": K.KEEP_VERSION,
                                                    "configs": []}))
    with pytest.raises(FlashsimError, match="no configurations"):
        K.load_kept_grid(tmp_path)


def test_a_keep_that_cannot_be_written_warns_and_keeps_the_report(monkeypatch, tmp_path, capsys):
    tiny_grids(monkeypatch, tmp_path)
    work = tmp_path / "work"
    work.mkdir()

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(K, "write_kept_grid", full)
    assert main(["validate", "--quick", "--json", "--tokens", "6", "--modes", "shape", "--workdir", str(work),
                 "--keep", str(tmp_path / "kept")]) == 0
    cap = capsys.readouterr()
    out = json.loads(cap.out)
    assert out["kept"] is None and out["n_configs"] == 2
    assert "WARNING: --keep" in cap.err and "No space left on device" in cap.err and "report is complete" in cap.err
    assert not (tmp_path / "kept").exists() and list(work.iterdir()) == []
