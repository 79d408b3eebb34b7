"""Importing published routing records (JSON lines) and the routing verbs of the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from devices.errors import FlashsimError
from flashsim.main import main
from traces.routing import open_routing_trace
from traces.routing_import import import_routing_jsonl


def write_records(path: Path, n_tokens=(6, 4), n_layers=3, drop=None, weights=True) -> Path:
    """Records in the published format (dataset, problem_id, layer, token_idx, experts, gating_probs)."""
    rng = np.random.default_rng(0)
    with open(path, "w") as f:
        for pid, T in enumerate(n_tokens):
            for layer in range(n_layers):
                for t in range(T):
                    if drop == (pid, layer, t):
                        continue
                    ex = [int(x) for x in rng.permutation(8)[:2]]
                    p = float(rng.uniform(0.5, 0.9))
                    rec = {"dataset": "gsm8k", "problem_id": pid, "layer": layer, "token_idx": t, "experts": ex}
                    if weights:
                        rec["gating_probs"] = [1 - p, p]          # ascending: the importer reorders
                    f.write(json.dumps(rec) + "\n")
    return path


def test_import_aligns_sequences_and_orders_by_weight(tmp_path):
    src = write_records(tmp_path / "r.jsonl", drop=(1, 2, 3))
    out = import_routing_jsonl([src], tmp_path / "t", model="mixtral-8x7b", n_layers=32, n_experts=8,
                               provenance={"repository": "r", "commit": "c", "license": "none"})
    t = open_routing_trace(out)
    assert t.n_tokens == 6 + 3 and t.manifest.moe_layers == [0, 1, 2] and t.top_k == 2
    assert t.manifest.source["dropped_tokens"] == 1 and t.manifest.source["commit"] == "c"
    assert list(np.asarray(t.sequence)) == [0] * 6 + [1] * 3
    assert np.all(t.weights[:, :, 0] >= t.weights[:, :, 1]) and np.all(t.phase == 1)
    first = json.loads(src.read_text().splitlines()[0])
    assert sorted(t.experts[0, 0].tolist()) == sorted(first["experts"])
    assert t.experts[0, 0, 0] == first["experts"][1]                  # the heavier expert first


def test_import_without_weights_stores_uniform(tmp_path):
    out = import_routing_jsonl([write_records(tmp_path / "r.jsonl", weights=False)], tmp_path / "t", model="m")
    t = open_routing_trace(out)
    assert np.allclose(t.weights, 0.5) and "1/K" in t.manifest.source["weights"]


@pytest.mark.parametrize("line, match", [
    ('{"problem_id": 0, "layer": 0, "token_idx": 0}', "no experts field"),
    ('{"problem_id": 0, "layer": -1, "token_idx": 0, "experts": [1, 2]}', "whole numbers"),
    ("not json", "invalid JSON"),
])
def test_bad_records_name_file_and_line(tmp_path, line, match):
    p = tmp_path / "r.jsonl"
    p.write_text('{"problem_id": 0, "layer": 0, "token_idx": 0, "experts": [1, 2]}\n' + line + "\n")
    with pytest.raises(FlashsimError, match=rf"r.jsonl:2: .*{match}"):
        import_routing_jsonl([p], tmp_path / "t", model="m")


def test_expert_count_below_the_ids_is_refused(tmp_path):
    with pytest.raises(FlashsimError, match="--n-experts is 4"):
        import_routing_jsonl([write_records(tmp_path / "r.jsonl")], tmp_path / "t", model="m", n_experts=4)


def test_cli_import_stats_and_synth(tmp_path, capsys):
    src = write_records(tmp_path / "r.jsonl", n_tokens=(40, 30))
    assert main(["trace", "import-routing", str(src), "--out", str(tmp_path / "t"), "--model", "m",
                 "--n-experts", "8", "--license", "none", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["n_tokens"] == 70
    assert main(["trace", "stats", str(tmp_path / "t"), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["kind"] == "routing" and st["n_experts"] == 8 and set(st["srp"]) == {"4", "16", "64"}
    assert main(["trace", "stats", str(tmp_path / "t")]) == 0
    assert "SRP@16" in capsys.readouterr().out
    assert main(["trace", "synth", "--model", "olmoe-1b-7b", "--tokens", "50", "--out", str(tmp_path / "s"),
                 "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    t = open_routing_trace(tmp_path / "s")
    assert (t.n_experts, t.top_k, t.n_tokens, s["model"]) == (64, 8, 50, "olmoe-1b-7b")
    assert main(["trace", "synth-routing", "--like", str(tmp_path / "t"), "--sigma", "1", "--out",
                 str(tmp_path / "u")]) == 2
    assert "--like fits" in capsys.readouterr().err
