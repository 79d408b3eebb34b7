"""GSI on a tiny random-weight llama model: block dropping, perplexity, the greedy order against a
brute force that drops blocks by zeroing their output projections, the file and the CLI."""

from __future__ import annotations

import copy
import json
import math

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from flashsim.main import main  # noqa: E402
from real.studies.gsi import (  # noqa: E402
    block_names,
    dropped_blocks,
    gsi_document,
    perplexity,
    read_gsi_file,
    run_gsi,
    write_gsi_file,
)
from tests.real.conftest import tiny_llama  # noqa: E402

N_LAYERS = 3
WORDS = [f"w{i}" for i in range(60)]


def _tiny_model(seed: int = 0):
    return tiny_llama(N_LAYERS, seed=seed)


@pytest.fixture(scope="module")
def model():
    return _tiny_model()


@pytest.fixture(scope="module")
def ids():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 64, (1, 40), generator=g)


def _logits(m, ids):
    with torch.no_grad():
        return m(input_ids=ids, use_cache=False).logits


def _zeroed(m, blocks):
    """Independent way to drop blocks: zero the projection that writes to the residual stream."""
    m = copy.deepcopy(m)
    with torch.no_grad():
        for b in blocks:
            kind, i = b.split(":")
            layer = m.model.layers[int(i)]
            (layer.self_attn.o_proj if kind == "mha" else layer.mlp.down_proj).weight.zero_()
    return m


def test_dropping_nothing_equals_dense_and_hooks_are_removed(model, ids):
    dense = _logits(model, ids)
    with dropped_blocks(model, []):
        assert torch.equal(_logits(model, ids), dense)
    with dropped_blocks(model, ["mha:0", "ffn:2"]):
        assert not torch.equal(_logits(model, ids), dense)
    assert torch.equal(_logits(model, ids), dense)
    assert all(not layer.self_attn._forward_hooks and not layer.mlp._forward_hooks for layer in model.model.layers)


@pytest.mark.parametrize("blocks", [["ffn:1"], ["mha:2"], ["mha:0", "ffn:0", "ffn:2"]])
def test_dropping_equals_zeroed_output_projection(model, ids, blocks):
    with dropped_blocks(model, blocks):
        hooked = _logits(model, ids)
    torch.testing.assert_close(hooked, _logits(_zeroed(model, blocks), ids), rtol=1e-5, atol=1e-5)


def test_perplexity_matches_hf_loss(model, ids):
    with torch.no_grad():
        loss = float(model(input_ids=ids, labels=ids, use_cache=False).loss)
    assert perplexity(model, ids) == pytest.approx(math.exp(loss), rel=1e-5)


def test_bad_block_name_is_one_line_error(model):
    from devices.errors import FlashsimError

    with pytest.raises(FlashsimError, match="mha:I or ffn:I"), dropped_blocks(model, ["ffn:9"]):
        pass


def test_gsi_equals_brute_force(model, ids):
    result = run_gsi(model, ids)  # all 2L steps
    order = block_names(N_LAYERS)
    dropped, expected, alone = [], [], {}
    for _ in range(len(order)):
        scores = {b: perplexity(_zeroed(model, [*dropped, b]), ids) for b in order if b not in dropped}
        alone = alone or scores      # the first pass drops each block alone
        best = min(scores, key=lambda b: (scores[b], order.index(b)))
        dropped.append(best)
        expected.append((best, scores[best]))
    assert [b for b, _ in result.gsi] == [b for b, _ in expected]
    for (_, got), (_, want) in zip(result.gsi, expected, strict=True):
        assert got == pytest.approx(want, rel=1e-4)
    assert result.gsi[0][0] == min(order, key=lambda b: (alone[b], order.index(b)))
    assert result.dense_ppl == pytest.approx(perplexity(model, ids))
    assert result.n_passes == 1 + len(order) + sum(len(order) - k for k in range(1, len(order)))


def test_one_shot_is_sorted_and_complete(model, ids):
    result = run_gsi(model, ids, steps=1)
    values = [p for _, p in result.one_shot]
    assert values == sorted(values)
    assert sorted(b for b, _ in result.one_shot) == sorted(block_names(N_LAYERS))
    assert len(result.gsi) == 1 and result.n_passes == 1 + 2 * N_LAYERS


def test_steps_out_of_range(model, ids):
    from devices.errors import FlashsimError

    with pytest.raises(FlashsimError, match="--steps 7"):
        run_gsi(model, ids, steps=7)


def test_file_round_trips_and_is_deterministic(model, ids, tmp_path):
    doc = gsi_document(run_gsi(model, ids, steps=2), model_name="tiny", n_layers=N_LAYERS, text="abc",
                       text_source="builtin", n_tokens=40)
    path = tmp_path / "g.json"
    write_gsi_file(path, doc)
    assert read_gsi_file(path) == doc
    first = path.read_bytes()
    write_gsi_file(path, gsi_document(run_gsi(model, ids, steps=2), model_name="tiny", n_layers=N_LAYERS,
                                      text="abc", text_source="builtin", n_tokens=40))
    assert path.read_bytes() == first
    assert [p.name for p in tmp_path.iterdir()] == ["g.json"]  # no temp file left behind


def test_read_rejects_other_files(tmp_path):
    from devices.errors import FlashsimError

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema_version": 1, "gsi": [{"block": "ffn:0"}], "one_shot": []}))
    with pytest.raises(FlashsimError, match="ppl_after"):
        read_gsi_file(bad)


# ---- CLI ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, model):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    folder = tmp_path_factory.mktemp("tiny_llama")
    vocab = {"<unk>": 0, **{w: i + 1 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(folder)
    model.save_pretrained(folder)
    return folder


def test_cli_end_to_end(model_dir, tmp_path, capsys):
    text = tmp_path / "calib.txt"
    text.write_text(" ".join(WORDS[(7 * i) % 60] for i in range(50)))
    out = tmp_path / "gsi.json"
    rc = main(["adapt", "gsi", "--model", str(model_dir), "--text", str(text), "--steps", "3",
               "--max-tokens", "30", "--out", str(out), "--json"])
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    doc = read_gsi_file(out)
    assert doc["text"]["n_tokens"] == 30 and doc["model"]["n_layers"] == N_LAYERS
    assert len(doc["gsi"]) == 3 and len(doc["one_shot"]) == 2 * N_LAYERS
    assert printed["gsi"] == doc["gsi"] and printed["timing"]["passes"] == 1 + 6 + 5 + 4
    rc = main(["adapt", "gsi", "--model", str(model_dir), "--text", str(text), "--steps", "all",
               "--out", str(out)])
    assert rc == 0 and len(read_gsi_file(out)["gsi"]) == 2 * N_LAYERS
    assert "wrote" in capsys.readouterr().out


@pytest.mark.parametrize("argv, needle", [
    (["--model", "no-such-model"], "no-such-model"),
    (["--steps", "0"], "--steps 0"),
    (["--steps", "x"], "--steps 'x'"),
    (["--max-tokens", "1"], "--max-tokens 1"),
    (["--text", "/nonexistent/calib.txt"], "no such file"),
])
def test_cli_bad_input_is_one_line_exit_2(argv, needle, tmp_path, capsys):
    rc = main(["adapt", "gsi", *argv, "--out", str(tmp_path / "g.json")])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and err.count("\n") == 1
    assert not (tmp_path / "g.json").exists()
