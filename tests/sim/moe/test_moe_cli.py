"""`flashsim replay` on a routing trace and `flashsim plan` for an MoE config.json: every policy, the three
numbers, JSON output, one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from flashsim.main import main
from tests.sim.moe.routing_fixture import zipf_routing
from traces.routing import write_routing_trace

CFG = {"model_type": "qwen3_moe", "hidden_size": 256, "moe_intermediate_size": 512, "num_hidden_layers": 3,
       "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 1000,
       "num_experts": 12, "num_experts_per_tok": 2}


@pytest.fixture(scope="module")
def model_and_trace(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe")
    (root / "tiny").mkdir()
    (root / "tiny" / "config.json").write_text(json.dumps(CFG))
    e, w = zipf_routing(16, 3, 12, 2, seed=7)
    trace = write_routing_trace(root / "routing", model="tiny", n_layers=3, moe_layers=[0, 1, 2], n_experts=12,
                                top_k=2, experts=e, weights=w, phase=np.ones(16, np.uint8),
                                source={"kind": "synthetic", "generator": "tests/sim/moe/routing_fixture.py"})
    return root / "tiny", trace


def test_replay_runs_every_policy_with_bounds(model_and_trace, capsys) -> None:
    model, trace = model_and_trace
    assert main(["replay", "--routing-trace", str(trace), "--model", str(model), "--device", "rtx4090-nvme",
                 "--cache-slots", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    names = [r["policy"] for r in out["policies"]]
    assert names == ["belady", "cache-aware", "least-stale", "lfu", "lru", "page-cache", "pinned"]
    best = out["ideal_policy_bound"]["hit_rate"]
    for r in out["policies"]:
        assert r["peak_bound"]["tokens_per_s"] >= r["expected"]["tokens_per_s"] * 0.999
        if r["policy"] != "cache-aware":
            assert r["expected"]["hit_rate"] <= best + 1e-12
    # a routing trace given as --trace is detected too; text output names the bound
    assert main(["replay", "--trace", str(trace), "--model", str(model), "--device", "rtx4090-nvme",
                 "--cache-slots", "4", "--expert-cache", "lru", "--expert-cache", "pinned:profile_tokens=4"]) == 0
    text = capsys.readouterr().out
    assert "ideal bound" in text and "pinned" in text and "lfu" not in text


def test_replay_bad_policy_is_one_line(model_and_trace, capsys) -> None:
    model, trace = model_and_trace
    rc = main(["replay", "--routing-trace", str(trace), "--model", str(model), "--device", "rtx4090-nvme",
               "--expert-cache", "lru9"])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert "unknown expert-cache policy 'lru9'" in err and "\n" not in err


def test_plan_moe_json(model_and_trace, capsys) -> None:
    model, trace = model_and_trace
    assert main(["plan", "--model", str(model), "--device", "rtx4090-nvme", "--routing-trace", str(trace),
                 "--dram-free", "200MiB", "--target-tps", "50", "--expert-dtype", "int4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {r["policy"] for r in out["rows"]} >= {"lru", "pinned", "page-cache"}
    assert out["ideal_policy_bound"]["int4"]["tokens_per_s"] >= out["best"]["tokens_per_s"] * 0.999
    assert out["dram_for_target"] is None or out["dram_for_target"]["tokens_per_s"] >= 50


@pytest.mark.slow
def test_replay_plot_writes_both_figures(model_and_trace, tmp_path, capsys) -> None:
    model, trace = model_and_trace
    assert main(["replay", "--routing-trace", str(trace), "--model", str(model), "--device", "rtx4090-nvme",
                 "--expert-cache", "lru", "--plot", str(tmp_path / "figs")]) == 0
    assert "wrote" in capsys.readouterr().out
    assert {p.name for p in (tmp_path / "figs").iterdir()} == {"moe_hit_rate.png", "moe_hit_rate.svg",
                                                              "moe_dram.png", "moe_dram.svg"}


def test_prefetch_default_is_the_family_figure_with_its_source(model_and_trace, capsys) -> None:
    """The tiny model is a qwen3_moe config: --prefetch takes the Qwen figure (0.9469 - 0.15) and says where it
    comes from; --prefetch-accuracy overrides it; without either the output says prefetch is off."""
    model, trace = model_and_trace
    args = ["replay", "--routing-trace", str(trace), "--model", str(model), "--device", "rtx4090-nvme",
            "--cache-slots", "4", "--expert-cache", "lru"]
    assert main(args) == 0
    assert "speculative prefetch: off" in capsys.readouterr().out
    assert main([*args, "--prefetch"]) == 0
    text = capsys.readouterr().out
    assert "speculative prefetch: accuracy 0.797 (published: arXiv 2511.10676" in text
    assert main([*args, "--prefetch-accuracy", "0.6", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["prefetch"]["kind"] == "given" and out["config"]["prefetch_accuracy"] == 0.6
    assert out["policies"][0]["expected"]["prefetch_hit_rate"] > 0
    assert main(["plan", "--model", str(model), "--device", "rtx4090-nvme", "--routing-trace", str(trace),
                 "--dram-free", "200MiB", "--expert-dtype", "int4", "--prefetch"]) == 0
    assert "speculative prefetch: accuracy 0.797 (published" in capsys.readouterr().out
    assert main([*args, "--prefetch-memory", "0.5"]) == 2
    assert "needs speculative prefetch" in capsys.readouterr().err


def test_plan_moe_best_keeps_the_routers_choice_unless_allowed(model_and_trace, capsys) -> None:
    """Cache-aware routing buys hits with the model's routing choices (a quality cost): the best row keeps
    every choice by default and says so; --max-router-mass-replaced admits it."""
    model, trace = model_and_trace
    args = ["plan", "--model", str(model), "--device", "rtx4090-nvme", "--routing-trace", str(trace),
            "--dram-free", "200MiB", "--expert-dtype", "int4", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["best"]["quality_router_mass_replaced"] == 0.0
    assert "keeps every routing choice" in out["quality_floor"]["rule"]
    assert main([*args, "--max-router-mass-replaced", "1"]) == 0
    loose = json.loads(capsys.readouterr().out)
    assert loose["best"]["tokens_per_s"] == max(r["tokens_per_s"] for r in loose["rows"])
