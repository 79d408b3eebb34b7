"""Model-mode conversion: bundles read back equal the model's gate/up rows and down columns."""

from __future__ import annotations

import numpy as np
import pytest

from devices.errors import FlashsimError
from devices.model_spec import ModelSpec
from flashsim.main import main
from real.weights.convert import convert_state_dict
from real.weights.dtypes import bf16_bits, decode
from real.weights.store import open_store
from traces.profiler import NeuronProfile, save_profile

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def tiny_llama(tied: bool = True):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=128, tie_word_embeddings=tied)
    model = transformers.LlamaForCausalLM(cfg).eval()
    return model, ModelSpec.from_hf_config(cfg.to_dict(), name="tiny-llama")


def expected_bundles(model, layer: int, ids: np.ndarray) -> np.ndarray:
    mlp = model.model.layers[layer].mlp
    g, u, d = (m.weight.detach().numpy() for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))
    return np.concatenate([g[ids], u[ids], d[:, ids].T], axis=1)  # gate row | up row | down column


@pytest.mark.parametrize("layout", ["bundled", "unbundled"])
@pytest.mark.parametrize("alignment", ["padded", "packed"])
def test_llama_bundles_equal_rows_and_columns(tmp_path, layout, alignment):
    model, spec = tiny_llama()
    st = open_store(convert_state_dict(model.state_dict(), spec, tmp_path / "s", layout=layout,
                                       alignment=alignment), verify="full")
    ids = np.array([0, 1, 2, 50, 95, 7])
    for layer in range(2):
        got = decode(st.read_bundles(layer, ids, layout), "fp32").reshape(len(ids), -1)
        np.testing.assert_array_equal(got, expected_bundles(model, layer, ids))
    np.testing.assert_array_equal(st.matrix(1, "down"), model.model.layers[1].mlp.down_proj.weight.detach().numpy().T)


def test_resident_tensors_are_everything_else(tmp_path):
    from safetensors.torch import load_file

    model, spec = tiny_llama(tied=True)
    st = open_store(convert_state_dict(model.state_dict(), spec, tmp_path / "s"))
    res = load_file(st.resident_path())
    sd = model.state_dict()
    ffn = {k for k in sd if ".mlp." in k}
    assert set(res) == set(sd) - ffn - {"lm_head.weight"}  # tied: the embedding serves both
    for k, v in res.items():
        torch.testing.assert_close(v, sd[k], rtol=0, atol=0)
    assert st.manifest.resident.complete and st.manifest.mode == "model"


def test_hot_first_puts_hottest_neuron_first(tmp_path):
    model, spec = tiny_llama()
    scores = np.random.default_rng(1).random((2, 96)).astype(np.float32)
    prof = save_profile(NeuronProfile(scores, {}, {"schema_version": 1, "tasks": []}), tmp_path / "p.npz")
    st = open_store(convert_state_dict(model.state_dict(), spec, tmp_path / "s", order="hot-first", profile=prof))
    hottest = int(np.argmax(scores[1]))
    with open(st.file_path(1, "bundled"), "rb") as f:
        slot0 = np.frombuffer(f.read(st.bundle_bytes), np.float32)
    np.testing.assert_array_equal(slot0, expected_bundles(model, 1, np.array([hottest]))[0])
    ids = np.arange(96)
    np.testing.assert_array_equal(decode(st.read_bundles(1, ids), "fp32"), expected_bundles(model, 1, ids))


def test_fp16_and_bf16_match_torch_rounding(tmp_path):
    model, spec = tiny_llama()
    ids = np.arange(96)
    ref = expected_bundles(model, 0, ids)
    st16 = open_store(convert_state_dict(model.state_dict(), spec, tmp_path / "h", dtype="fp16"))
    np.testing.assert_array_equal(st16.read_bundles(0, ids).view(np.float16), ref.astype(np.float16))
    stb = open_store(convert_state_dict(model.state_dict(), spec, tmp_path / "b", dtype="bf16"))
    want = torch.from_numpy(ref).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(stb.read_bundles(0, ids).view(np.uint16), want)


def test_bf16_bits_round_to_nearest_even():
    x = np.array([1.0, -2.5, 3.14159, 1e-40, np.inf, -np.inf, 65504.0, 1.00390625, 1.01171875], np.float32)
    want = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(bf16_bits(x), want)
    assert np.isnan(decode(bf16_bits(np.array([np.nan], np.float32)), "bf16")[0])


def test_fp16_overflow_is_refused(tmp_path):
    model, spec = tiny_llama()
    sd = dict(model.state_dict())
    sd["model.layers.1.mlp.up_proj.weight"] = sd["model.layers.1.mlp.up_proj.weight"] * 1e6
    with pytest.raises(FlashsimError, match="exceed the fp16 range"):
        convert_state_dict(sd, spec, tmp_path / "s", dtype="fp16")
    assert list(tmp_path.iterdir()) == []


def test_opt_ungated_with_biases(tmp_path):
    torch.manual_seed(0)
    cfg = transformers.OPTConfig(hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                                 vocab_size=128, max_position_embeddings=32, word_embed_proj_dim=64)
    model = transformers.OPTForCausalLM(cfg).eval()
    spec = ModelSpec.from_hf_config(cfg.to_dict(), name="tiny-opt")
    st = open_store(convert_state_dict(model.state_dict(), spec, tmp_path / "s"))
    assert st.segments == ["up", "down"]
    layer = model.model.decoder.layers[1]
    ids = np.array([3, 0, 127])
    want = np.concatenate([layer.fc1.weight.detach().numpy()[ids], layer.fc2.weight.detach().numpy()[:, ids].T], 1)
    np.testing.assert_array_equal(decode(st.read_bundles(1, ids), "fp32").reshape(3, -1), want)
    from safetensors.numpy import load_file

    assert "model.decoder.layers.1.fc1.bias" in load_file(st.resident_path())


def test_gpt2_conv1d_is_transposed(tmp_path):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=64, n_layer=1, n_head=4, vocab_size=128, n_positions=32)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    spec = ModelSpec.from_hf_config(cfg.to_dict(), name="tiny-gpt2")
    st = open_store(convert_state_dict(model.state_dict(), spec, tmp_path / "s"))
    mlp = model.transformer.h[0].mlp
    ids = np.array([0, 200, 255])
    # Conv1D stores [in, out]: up rows are c_fc columns; down columns are c_proj rows.
    want = np.concatenate([mlp.c_fc.weight.detach().numpy()[:, ids].T, mlp.c_proj.weight.detach().numpy()[ids]], 1)
    np.testing.assert_array_equal(decode(st.read_bundles(0, ids), "fp32").reshape(3, -1), want)


def test_cli_convert_hf_folder(tmp_path, capsys):
    model, _ = tiny_llama()
    model.save_pretrained(tmp_path / "hf")
    rc = main(["real", "convert", "--model", str(tmp_path / "hf"), "--out", str(tmp_path / "s"), "--dtype", "fp16",
               "--layout", "both", "--json"])
    assert rc == 0
    import json

    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "hf" and out["dtype"] == "fp16" and set(out["layouts"]) == {"bundled", "unbundled"}
    st = open_store(tmp_path / "s", verify="full")
    ids = np.array([5, 6])
    np.testing.assert_array_equal(st.read_bundles(1, ids).view(np.float16),
                                  expected_bundles(model, 1, ids).astype(np.float16))
