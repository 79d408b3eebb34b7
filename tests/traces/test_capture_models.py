"""Capture on tiny random-weight models of every supported family (llama, mistral, qwen2 gated;
opt, gpt2 ungated): hooked values against a hand computation of the FFN intermediate, prefill and
decode row counts, folder loading, the CLI end to end, determinism and atomicity."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from devices.errors import FlashsimError  # noqa: E402
from flashsim.main import main  # noqa: E402
from traces.capture import capture_trace, load_hf_model  # noqa: E402
from traces.capture.generate import Decoder  # noqa: E402
from traces.capture.hooks import FfnRecorder  # noqa: E402
from traces.capture.models import LoadedModel  # noqa: E402
from traces.capture.prompts import Prompt  # noqa: E402
from traces.format import DECODE, PREFILL, open_trace  # noqa: E402

VOCAB = 64
D_FF = 40
WORDS = ["[UNK]", "</s>"] + [f"w{i}" for i in range(VOCAB - 2)]


def _config(family: str):
    c = transformers
    if family == "llama":
        return c.LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=D_FF, num_hidden_layers=3,
                             num_attention_heads=4, num_key_value_heads=2, bos_token_id=None, eos_token_id=1)
    if family == "mistral":
        return c.MistralConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=D_FF, num_hidden_layers=3,
                               num_attention_heads=4, num_key_value_heads=2, bos_token_id=None, eos_token_id=1)
    if family == "qwen2":
        return c.Qwen2Config(vocab_size=VOCAB, hidden_size=16, intermediate_size=D_FF, num_hidden_layers=3,
                             num_attention_heads=4, num_key_value_heads=2, bos_token_id=None, eos_token_id=1)
    if family == "opt":
        return c.OPTConfig(vocab_size=VOCAB, hidden_size=16, ffn_dim=D_FF, num_hidden_layers=3,
                           num_attention_heads=4, word_embed_proj_dim=16, max_position_embeddings=128,
                           bos_token_id=0, eos_token_id=1, pad_token_id=0)
    if family == "gpt2":
        return c.GPT2Config(vocab_size=VOCAB, n_embd=16, n_inner=D_FF, n_layer=3, n_head=4, n_positions=128,
                            bos_token_id=0, eos_token_id=1)
    raise AssertionError(family)


def tiny_model(family: str, seed: int = 0):
    """A random-weight model of `family`; weights from a seeded torch.Generator (no global RNG)."""
    model = transformers.AutoModelForCausalLM.from_config(_config(family)).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.4)
    return model


def tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", eos_token="</s>")


def tiny_loaded(family: str, seed: int = 0) -> LoadedModel:
    from devices.model_spec import ModelSpec

    model = tiny_model(family, seed)
    spec = ModelSpec.from_hf_config(model.config.to_dict(), name=f"tiny-{family}")
    return LoadedModel(model, tiny_tokenizer(), spec, f"tiny-{family}")


FAMILIES = ["llama", "mistral", "qwen2", "opt", "gpt2"]


def _first_projection(model, family: str, layer: int):
    if family in ("llama", "mistral", "qwen2"):
        return model.model.layers[layer].mlp
    if family == "opt":
        return model.model.decoder.layers[layer].fc1
    return model.transformer.h[layer].mlp.c_fc


def _manual_intermediate(model, family: str, layer: int, x: np.ndarray) -> np.ndarray:
    """The FFN intermediate a for input x [S, d], written out from the weights."""
    x = x.astype(np.float64)
    if family in ("llama", "mistral", "qwen2"):
        mlp = model.model.layers[layer].mlp
        g = x @ mlp.gate_proj.weight.detach().numpy().T.astype(np.float64)
        u = x @ mlp.up_proj.weight.detach().numpy().T.astype(np.float64)
        return g / (1 + np.exp(-g)) * u                                   # SiLU(gate) * up
    if family == "opt":
        fc1 = model.model.decoder.layers[layer].fc1
        h = x @ fc1.weight.detach().numpy().T + fc1.bias.detach().numpy()
        return np.maximum(h, 0)                                           # ReLU(fc1 x)
    c_fc = model.transformer.h[layer].mlp.c_fc                            # Conv1D: weight is [in, out]
    h = x @ c_fc.weight.detach().numpy().astype(np.float64) + c_fc.bias.detach().numpy()
    return 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))  # gelu_new


@pytest.mark.parametrize("family", FAMILIES)
def test_hook_records_the_ffn_intermediate(family):
    model = tiny_model(family)
    layer = 1
    seen: list[np.ndarray] = []
    handle = _first_projection(model, family, layer).register_forward_pre_hook(
        lambda _m, args: seen.append(args[0].detach().reshape(-1, args[0].shape[-1]).numpy().copy()))
    rec = FfnRecorder(model, D_FF)
    buf = torch.zeros((3, 12, D_FF))
    ids = [5, 9, 17, 3, 30, 2, 8]
    with rec:
        rec.reset(buf)
        gen = Decoder(model).run(ids, 4)
    handle.remove()
    assert rec.n_recorded == len(ids) + len(gen) == 11
    x = np.concatenate(seen)                        # input of the FFN at every position, in order
    expected = _manual_intermediate(model, family, layer, x)
    np.testing.assert_allclose(buf[layer, :11].numpy(), expected, rtol=1e-4, atol=1e-5)
    assert np.all(buf[:, 11:].numpy() == 0)         # nothing past the recorded rows
    if family == "opt":
        assert (buf[layer, :11].numpy() == 0).mean() > 0.2  # ReLU: exact zeros exist


@pytest.mark.parametrize("family", FAMILIES)
def test_decoder_matches_hf_generate(family):
    model = tiny_model(family, seed=3)
    ids = [4, 8, 15, 16, 23, 42]
    ours = Decoder(model).run(ids, 6)
    hf = model.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False, eos_token_id=None,
                        pad_token_id=0)[0, len(ids):].tolist()
    assert ours == hf


@pytest.mark.parametrize("family", ["llama", "opt", "gpt2"])
def test_capture_rows_and_phases(tmp_path, family):
    loaded = tiny_loaded(family)
    prompts = [Prompt("p1", "qa", "what is w3 w4 the"), Prompt("p2", "code", "write w5 w6 w7 w8 w9 w10")]
    out = capture_trace(loaded, prompts, tmp_path / "t", max_new_tokens=5, sparsity="topk:0.25",
                        progress=False)
    tr = open_trace(out)
    assert [p.n_prompt_tokens for p in tr.manifest.prompts] == [5, 7]   # one token per word
    assert [p.n_generated_tokens for p in tr.manifest.prompts] == [5, 5]
    assert tr.n_tokens == 5 + 5 + 7 + 5
    np.testing.assert_array_equal(tr.phase, [PREFILL] * 5 + [DECODE] * 5 + [PREFILL] * 7 + [DECODE] * 5)
    np.testing.assert_array_equal(tr.prompt_index, [0] * 10 + [1] * 12)
    assert list(tr.task_of_token[[0, 10]]) == ["qa", "code"]
    assert tr.token_ids[:5].tolist() == [0, 0, 5, 6, 0]                  # what is w3 w4 the
    assert tr.top_k == 10 and tr.spec.name == f"tiny-{family}"
    counts = np.bitwise_count(tr.packed_masks(0)).sum(axis=1)
    assert np.all(counts == 10)  # topk:0.25 of 40 neurons


def test_prompt_token_ids_and_generated_tokens_are_recorded(tmp_path):
    loaded = tiny_loaded("llama")
    text = "w1 w2 w3 w4"
    ids = loaded.tokenizer(text)["input_ids"]
    gen = Decoder(loaded.model).run(ids, 3)
    tr = open_trace(capture_trace(loaded, [Prompt("a", "qa", text)], tmp_path / "t", max_new_tokens=3,
                                  progress=False))
    assert tr.token_ids.tolist() == ids + gen


def test_generation_stops_after_eos(tmp_path):
    loaded = tiny_loaded("llama", seed=1)
    ids = loaded.tokenizer("w1 w2 w3")["input_ids"]
    free = Decoder(loaded.model).run(ids, 6)
    stop = free[1]
    first = free.index(stop)
    loaded.model.generation_config.eos_token_id = stop
    tr = open_trace(capture_trace(loaded, [Prompt("a", "qa", "w1 w2 w3")], tmp_path / "t", max_new_tokens=6,
                                  progress=False))
    assert tr.manifest.prompts[0].n_generated_tokens == first + 1  # the EOS token itself is fed once
    assert int(tr.token_ids[-1]) == stop


def test_sampling_is_seeded_and_deterministic(tmp_path):
    loaded = tiny_loaded("gpt2")
    prompts = [Prompt("a", "qa", "w1 w2 w3"), Prompt("b", "story", "w9 w8")]
    kw = dict(max_new_tokens=8, temperature=1.5, progress=False)
    a = open_trace(capture_trace(loaded, prompts, tmp_path / "a", seed=7, **kw))
    b = open_trace(capture_trace(loaded, prompts, tmp_path / "b", seed=7, **kw))
    c = open_trace(capture_trace(loaded, prompts, tmp_path / "c", seed=8, **kw))
    assert a.token_ids.tolist() == b.token_ids.tolist() != c.token_ids.tolist()
    assert a.manifest.files == b.manifest.files   # identical arrays, identical checksums
    assert a.manifest.provenance["seed"] == 7
    # per-prompt streams: capturing prompt b alone samples the same tokens for it
    d = open_trace(capture_trace(loaded, prompts[1:], tmp_path / "d", seed=7, **kw))
    assert d.token_ids.tolist() == a.token_ids[a.prompt_index == 1].tolist()


def test_exception_mid_capture_leaves_no_trace(tmp_path, monkeypatch):
    loaded = tiny_loaded("llama")
    prompts = [Prompt(f"p{i}", "qa", "w1 w2 w3") for i in range(3)]
    calls = []
    real_run = Decoder.run

    def flaky(self, *a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_run(self, *a, **k)

    monkeypatch.setattr(Decoder, "run", flaky)
    with pytest.raises(KeyboardInterrupt):
        capture_trace(loaded, prompts, tmp_path / "t", max_new_tokens=3, progress=False)
    assert list(tmp_path.iterdir()) == []
    # ...and an exception while the arrays are being written
    monkeypatch.setattr(Decoder, "run", real_run)
    import traces.capture.assemble as assemble

    def boom(*_a, **_k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(assemble, "top_k_fp16", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        capture_trace(loaded, prompts, tmp_path / "t", max_new_tokens=3, sparsity="threshold:0.3",
                      magnitude_fraction=0.5, progress=False)
    assert list(tmp_path.iterdir()) == []


def _save_folder(tmp_path, family: str):
    folder = tmp_path / f"tiny-{family}"
    tiny_model(family).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


def test_load_hf_folder_gives_the_spec_from_its_config(tmp_path):
    folder = _save_folder(tmp_path, "qwen2")
    loaded = load_hf_model(folder)
    assert loaded.spec.name == "tiny-qwen2" and loaded.spec.family == "qwen2"
    assert (loaded.spec.n_layers, loaded.spec.d_ff, loaded.spec.ffn_kind) == (3, D_FF, "swiglu")
    assert next(loaded.model.parameters()).dtype == torch.float32


def test_cli_capture_of_a_model_folder(tmp_path, capsys):
    folder = _save_folder(tmp_path, "opt")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "x", "task": "qa", "text": "w1 w2 w3"}\n\n'
                       '{"id": "y", "task": "code", "text": "w4 w5"}\n')
    out = tmp_path / "trace"
    rc = main(["capture", "--model", str(folder), "--prompts", str(prompts), "--max-new-tokens", "3",
               "--out", str(out), "--seed", "1", "--json"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    tr = open_trace(out)
    assert summary["n_tokens"] == tr.n_tokens == (3 + 3) + (2 + 3)   # one token per word
    assert summary["n_decode_tokens"] == 6 and summary["n_prompts"] == 2
    assert tr.manifest.sparsity.rule == "relu"                     # OPT's FFN is ReLU: the default
    masks = np.concatenate([tr.mask(layer) for layer in range(tr.n_layers)])
    assert summary["active_fraction"] == pytest.approx(masks.mean())
    prov = tr.manifest.provenance
    assert prov["command"].startswith(f"flashsim capture --model {folder} --prompts {prompts} --max-new-tokens 3")
    assert prov["seed"] == 1 and "torch" in prov["libraries"] and "transformers" in prov["libraries"]
    # the recorded command reproduces the trace exactly
    import shlex
    argv = shlex.split(prov["command"])[1:]
    argv[argv.index("--out") + 1] = str(tmp_path / "again")
    assert main(argv) == 0
    assert open_trace(tmp_path / "again").manifest.files == tr.manifest.files


def test_cli_refuses_an_existing_out_before_loading(tmp_path, capsys):
    out = tmp_path / "exists"
    out.mkdir()
    assert main(["capture", "--model", "nope-model", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "already exists" in err and len(err.splitlines()) == 1


def test_unknown_model_is_one_line(tmp_path, capsys):
    assert main(["capture", "--model", "llama-9000", "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown model 'llama-9000'" in err[0] and "smollm2-135m" in err[0]
    assert main(["capture", "--model", str(tmp_path / "missing.gguf"), "--out", str(tmp_path / "t")]) == 2
    assert "no such model folder or file" in capsys.readouterr().err
    (tmp_path / "weights.bin").write_bytes(b"x")
    assert main(["capture", "--model", str(tmp_path / "weights.bin"), "--out", str(tmp_path / "t")]) == 2
    assert "must be a .gguf" in capsys.readouterr().err
    assert not (tmp_path / "t").exists()


def test_gguf_that_is_not_a_gguf_is_a_clear_error(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(FlashsimError, match="cannot load this GGUF"):
        load_hf_model(bad, use_cache=False)


def test_gguf_cache_is_written_atomically_reused_and_rebuilt_when_damaged(tmp_path, monkeypatch):
    """The GGUF path with the (slow) conversion replaced by a tiny model: cache entry, reuse, repair."""
    import traces.capture.models as models

    monkeypatch.setenv("FLASHSIM_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF stand-in")
    conversions = []

    def fake_convert(path):
        conversions.append(path)
        return tiny_model("llama"), tiny_tokenizer()

    monkeypatch.setattr(models, "_load_gguf", fake_convert)
    notes = []
    first = models.load_hf_model(gguf, notify=notes.append)
    entry = models._entry_dir(gguf, "tiny")
    assert len(conversions) == 1 and "dequantizing tiny.gguf" in notes[0]
    assert (entry / "model.safetensors").is_file() and (entry / "flashsim-cache.json").is_file()
    assert [p.name for p in entry.parent.iterdir()] == [entry.name]  # no temporary folder left
    second = models.load_hf_model(gguf)
    assert len(conversions) == 1  # read from the cache
    for a, b in zip(first.model.parameters(), second.model.parameters()):
        assert torch.equal(a, b)
    (entry / "model.safetensors").write_bytes(b"truncated")
    models.load_hf_model(gguf)
    assert len(conversions) == 2  # a damaged entry is converted again
    models.load_hf_model(gguf)
    assert len(conversions) == 2
    gguf.write_bytes(b"GGUF stand-in, changed")  # a changed source file invalidates its entry
    models.load_hf_model(gguf)
    assert len(conversions) == 3
