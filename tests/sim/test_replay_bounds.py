"""`flashsim replay` prints the expected figure with both bounds (issue 51.1): the device peak-bound and
the ideal-policy bound (oracle predictor, perfect prefetch), in text and in --json."""

from __future__ import annotations

import json

from flashsim.main import main
from traces.data import shipped_trace_path

ARGS = ["replay", "--trace", str(shipped_trace_path()), "--device", "jetson-orin-nano-8gb", "--tokens", "8"]


def test_json_carries_expected_peak_and_ideal_policy_bounds(capsys) -> None:
    assert main([*ARGS, "--preset", "llm-in-a-flash", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["config"]["policies"]["predictor"]["name"] == "noisy"          # the expected figure is realistic
    ib, pk = s["ideal_policy_bound"], s["peak_bound"]
    assert ib["policies"] == {"predictor": {"name": "oracle", "rank": 128}}
    assert ib["tokens_per_s"] > 0 and pk["tokens_per_s"] > 0 and ib["tokens_per_s"] != s["tokens_per_s"]
    assert set(ib) - {"policies"} == set(pk)


def test_a_preset_without_idealisations_is_its_own_ideal_bound(capsys) -> None:
    assert main([*ARGS, "--preset", "naive", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["ideal_policy_bound"]["policies"] == {}
    assert s["ideal_policy_bound"]["tokens_per_s"] == s["tokens_per_s"]
    assert main([*ARGS, "--preset", "naive"]) == 0
    out = capsys.readouterr().out
    assert "ideal-policy bound" in out and "policy idealisations: none" in out
