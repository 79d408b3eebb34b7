"""`flashsim replay` end to end through the real entry point: output contracts and error paths."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from flashsim.main import main
from sim.results import SUMMARY_KEYS


def run(capsys, *argv: str) -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_replay_json_and_files(capsys, small_trace, tmp_path) -> None:
    rec, tl = tmp_path / "r.parquet", tmp_path / "t.json"
    rc, out, err = run(capsys, "replay", "--trace", str(small_trace.path), "--device", "jetson-orin-nano-8gb",
                       "--preset", "llm-in-a-flash", "--set", "prefetch=delta", "--set", "window.k=3", "--json",
                       "--records", str(rec), "--timeline", str(tl), "--seed", "2", "--tokens", "10", "--batch", "2")
    assert rc == 0, err
    s = json.loads(out)
    assert set(SUMMARY_KEYS) <= set(s) and s["engine"] == "des" and s["batch"] == 2 and s["decode_tokens"] == 20
    assert s["config"]["residency"]["k"] == 3 and s["config"]["sim"]["seed"] == 2
    assert s["config"]["device"] == "jetson-orin-nano-8gb" and s["config"]["model"] == "tiny"
    df = pd.read_parquet(rec)
    assert len(df) == 11 and list(df["phase"][:2]) == ["prefill", "decode"]
    assert json.loads(tl.read_text())["traceEvents"]


def test_replay_table_and_fast_engine(capsys, small_trace) -> None:
    rc, out, _ = run(capsys, "replay", "--trace", str(small_trace.path), "--device", "apple-m1-max",
                     "--preset", "naive", "--engine", "fast", "--dram-budget", "2GiB")
    assert rc == 0 and "ms per token" in out and "engine fast" in out and "budget 2.00 GiB" in out


def test_list_params_documents_every_policy(capsys) -> None:
    rc, out, _ = run(capsys, "replay", "--list-params", "--json")
    doc = json.loads(out)
    assert rc == 0 and set(doc["slots"]) == {"residency", "predictor", "layout", "prefetch", "precision"}
    assert {p["name"] for p in doc["slots"]["residency"]["window"]["params"]} == {"k", "insert_copy"}
    assert all(p["help"] for slot in doc["slots"].values() for pol in slot.values() for p in pol["params"])
    assert "selectinfer" in doc["presets"] and "workload" in doc["sections"]
    rc, out, _ = run(capsys, "replay", "--list-params", "--preset", "neuroprefetcher")
    assert rc == 0 and "<- neuroprefetcher" in out and "window.k = 'inf'" in out


@pytest.mark.parametrize("extra, message", [
    (["--preset", "llm-in-a-fash"],
     "unknown preset 'llm-in-a-fash'; did you mean 'llm-in-a-flash'? valid presets: dense, hybrid"),
    (["--set", "window.kk=2"], "unknown parameter 'kk'; did you mean 'k'? valid parameters: k, insert_copy"),
    (["--set", "window.k=-2"], "window.k must be an integer >= 0 or 'inf', got -2"),
    (["--set", "selective.load_ratio=1.2"], "policy 'selective' is not in use"),
    (["--preset", "selectinfer", "--set", "selective.load_ratio=1.2"], "load_ratio must be in [0, 1], got 1.2"),
    (["--dram-budget=-3GiB"], "--dram-budget: cannot parse"),
    (["--dram-budget", "300KiB"], "is too small: what must stay resident"),
    (["--model", "llama-2-7b"], "--rescale"),
    (["--device", "nope"], "unknown device 'nope'"),
    (["--engine", "fast", "--set", "prefetch=delta"], "fast path does not apply"),
    (["--tokens", "999"], "workload.tokens must be in [1, 32]"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, small_trace, extra, message) -> None:
    argv = ["replay", "--trace", str(small_trace.path), "--device", "this-host", "--preset", "llm-in-a-flash"]
    # later flags win in argparse, so the parametrized ones replace the defaults above
    rc, out, err = run(capsys, *argv, *extra)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and message in err, err


def test_missing_trace_and_rescale(capsys, small_trace, tmp_path) -> None:
    rc, _, err = run(capsys, "replay", "--device", "this-host")
    assert rc == 2 and "--trace" in err
    rc, _, err = run(capsys, "replay", "--trace", str(tmp_path / "none"), "--device", "this-host")
    assert rc == 2 and "not a trace directory" in err
    rc, out, err = run(capsys, "replay", "--trace", str(small_trace.path), "--device", "this-host", "--model",
                       "smollm2-135m", "--rescale", "--json", "--tokens", "3")
    assert rc == 0, err
    s = json.loads(out)
    assert s["config"]["rescaled"] is True and any("rescaled" in n for n in s["notes"])


def test_config_file_then_set_overrides(capsys, small_trace, tmp_path) -> None:
    f = tmp_path / "run.yaml"
    f.write_text("residency: {name: window, k: 2}\nprefetch: lookahead\nworkload: {tokens: 6}\n")
    rc, out, err = run(capsys, "replay", "--trace", str(small_trace.path), "--device", "this-host", "--config", str(f),
                       "--set", "window.k=4", "--json")
    assert rc == 0, err
    c = json.loads(out)["config"]
    assert c["residency"]["k"] == 4 and c["prefetch"]["name"] == "lookahead" and c["workload"]["tokens"] == 6
    f.write_text("windw: 3\n")
    rc, _, err = run(capsys, "replay", "--trace", str(small_trace.path), "--device", "this-host", "--config", str(f))
    assert rc == 2 and "unknown key 'windw'" in err
