"""Routing capture from tiny MoE models built locally from a config (random weights, shapes only):
the recorded experts and weights are the ones the model's own router computes, for each family."""

from __future__ import annotations

import json

import numpy as np
import pytest

from traces.capture.prompts import Prompt
from traces.routing import open_routing_trace

pytestmark = pytest.mark.slow        # imports torch + transformers and builds models: seconds


@pytest.fixture(scope="module")
def tiny_mixtral(tmp_path_factory):
    from traces.capture.routing import build_tiny_moe

    return build_tiny_moe(tmp_path_factory.mktemp("m") / "tiny-mixtral", "mixtral")


def _router_choice(folder, token_ids, top_k, norm):
    """Top-k ids and weights recomputed from the model's router logits (output_router_logits)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([token_ids]), output_router_logits=True)
    res = []
    for logits in out.router_logits:
        p = torch.softmax(logits.float(), -1)
        w, i = torch.topk(p, top_k, -1)
        if norm:
            w = w / w.sum(-1, keepdim=True)
        res.append((i.numpy(), w.numpy()))
    return res


@pytest.mark.parametrize("family, norm", [("mixtral", True), ("qwen2_moe", False), ("olmoe", False),
                                          ("gpt_oss", True)])
def test_capture_records_the_models_own_routing(tmp_path, family, norm):
    from traces.capture.routing import build_tiny_moe, capture_routing, prompt_ids

    folder = build_tiny_moe(tmp_path / "model", family)
    text = "route me, please"
    out = capture_routing(folder, [Prompt(id="p", task="qa", text=text)], tmp_path / "t", max_new_tokens=0)
    t = open_routing_trace(out)
    ids = prompt_ids(None, text, 128, False)
    assert t.n_tokens == len(ids) and t.manifest.moe_layers == [0, 1] and (t.n_experts, t.top_k) == (8, 2)
    assert np.all(t.phase == 0) and t.manifest.source["kind"] == "captured"
    for m, (i, w) in enumerate(_router_choice(folder, ids, 2, norm)):
        assert np.array_equal(t.experts[:, m], i)
        assert np.allclose(t.weights[:, m], w, atol=1e-6)
    if norm:
        assert np.allclose(t.weights.sum(-1), 1, atol=1e-6)


def test_decode_rows_and_cli(tmp_path, tiny_mixtral, capsys):
    from flashsim.main import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "task": "qa", "text": "abc"}) + "\n"
                       + json.dumps({"id": "b", "task": "code", "text": "defgh"}) + "\n")
    assert main(["capture", "--model", str(tiny_mixtral), "--prompts", str(prompts), "--max-new-tokens", "3",
                 "--out", str(tmp_path / "t"), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["kind"] == "routing" and s["n_prefill_tokens"] == 3 + 5 and s["n_decode_tokens"] == 2 * 3
    t = open_routing_trace(tmp_path / "t")
    assert list(np.asarray(t.sequence)) == [0] * 6 + [1] * 8
    assert main(["trace", "stats", str(tmp_path / "t"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["n_tokens"] == 14
