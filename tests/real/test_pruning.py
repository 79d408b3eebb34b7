"""Block skipping on a tiny random-weight llama model: nothing dropped = dense, skipping = real/studies/gsi.py's
zero-output hooks, the skipped modules really do not run, the model is restored (also on errors), and
measure_drop_sets / gsi_prefixes."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from devices.errors import FlashsimError  # noqa: E402
from real.studies.gsi import dropped_blocks, perplexity  # noqa: E402
from real.studies.pruning import gsi_prefixes, measure_drop_sets, skipped_blocks  # noqa: E402
from tests.real.conftest import TINY_WORDS, save_tiny_llama_folder, tiny_llama  # noqa: E402

N_LAYERS = 3


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


def _forwards(m):
    """Instance-level forward overrides currently installed (must be none outside the context)."""
    mods = [mod for layer in m.model.layers for mod in
            (layer.self_attn, layer.mlp, layer.input_layernorm, layer.post_attention_layernorm)]
    return [mod for mod in mods if "forward" in mod.__dict__]


def test_nothing_dropped_is_bitwise_dense(model, ids):
    dense = _logits(model, ids)
    with skipped_blocks(model, []) as names:
        assert names == []
        assert torch.equal(_logits(model, ids), dense)


@pytest.mark.parametrize("blocks", [["ffn:1"], ["mha:2"], ["mha:0"], ["mha:0", "ffn:0", "ffn:2"],
                                    ["mha:1", "ffn:1", "mha:2"]])
def test_skipping_equals_zero_output_hooks(model, ids, blocks):
    with dropped_blocks(model, blocks):
        ref_logits = _logits(model, ids)
        ref_ppl = perplexity(model, ids)
    with skipped_blocks(model, blocks):
        logits = _logits(model, ids)
        ppl = perplexity(model, ids)
    assert torch.allclose(logits, ref_logits, rtol=0, atol=1e-5)
    assert math.isclose(ppl, ref_ppl, rel_tol=1e-5)
    assert not torch.equal(logits, _logits(model, ids))  # and it differs from the dense model


def test_skipped_modules_do_not_run_and_model_is_restored(model, ids):
    dense = _logits(model, ids)
    calls = {"q": 0, "gate": 0}

    def count(key):
        def hook(*_):
            calls[key] += 1
        return hook

    layer = model.model.layers[1]
    handles = [layer.self_attn.q_proj.register_forward_hook(count("q")),
               layer.mlp.gate_proj.register_forward_hook(count("gate"))]
    try:
        with skipped_blocks(model, ["mha:1", "ffn:1"]):
            _logits(model, ids)
        assert calls == {"q": 0, "gate": 0}
        _logits(model, ids)
        assert calls == {"q": 1, "gate": 1}
    finally:
        for h in handles:
            h.remove()
    assert _forwards(model) == []
    assert torch.equal(_logits(model, ids), dense)


def test_restored_after_an_exception(model, ids):
    dense = _logits(model, ids)
    with pytest.raises(RuntimeError, match="boom"), skipped_blocks(model, ["mha:0", "ffn:2"]):
        assert _forwards(model)  # installed inside
        raise RuntimeError("boom")
    assert _forwards(model) == []
    assert torch.equal(_logits(model, ids), dense)


def test_bad_block_changes_nothing(model):
    with pytest.raises(FlashsimError, match="ffn:7"), skipped_blocks(model, ["mha:0", "ffn:7"]):
        pass
    assert _forwards(model) == []


def test_measure_drop_sets(model, ids):
    sets = [[], ["mha:2"], ["mha:0", "ffn:0", "mha:1", "ffn:1", "mha:2", "ffn:2"]]
    rows = measure_drop_sets(model, ids, sets, repeats=2)
    assert [r["dropped"] for r in rows] == sets
    assert rows[0]["agreement"] == 1.0
    assert math.isclose(rows[0]["ppl"], perplexity(model, ids), rel_tol=1e-6)
    assert all(r["dense_ppl"] == rows[0]["ppl"] for r in rows)
    with dropped_blocks(model, ["mha:2"]):
        assert math.isclose(rows[1]["ppl"], perplexity(model, ids), rel_tol=1e-5)
    # everything dropped: the logits are lm_head(norm(embedding)) at each position, independent of context
    everything = rows[2]
    assert 0.0 <= everything["agreement"] < 1.0
    assert all(r["s_per_pass_min"] > 0 and r["time_ratio"] > 0 and r["cpu_s_per_pass"] > 0 for r in rows)
    assert all(len(r["s_per_pass_all"]) == 2 and r["s_per_pass_min"] <= r["s_per_pass"] for r in rows)
    with pytest.raises(FlashsimError, match="mha:9"):
        measure_drop_sets(model, ids, [["mha:9"]])


def test_gsi_prefixes_follow_gsi_then_one_shot_order():
    one_shot = [{"block": b, "ppl_alone": p} for b, p in
                [("ffn:1", 2.0), ("mha:0", 3.0), ("mha:1", 4.0), ("ffn:0", None)]]
    doc = {"model": {"n_layers": 2}, "gsi": [{"block": "mha:1", "ppl_after": 5.0}], "one_shot": one_shot}
    assert gsi_prefixes(doc, [0, 1, 3, 4]) == [[], ["mha:1"], ["mha:1", "ffn:1", "mha:0"],
                                               ["mha:1", "ffn:1", "mha:0", "ffn:0"]]
    with pytest.raises(FlashsimError, match="--gsi-steps 5: must be between 0 and 4"):
        gsi_prefixes(doc, [5])


# ---- CLI: flashsim adapt prune-eval ---------------------------------------------------------------------
WORDS = TINY_WORDS


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, model):
    return save_tiny_llama_folder(tmp_path_factory.mktemp("tiny_llama_prune"), model)


def _main(argv):
    from flashsim.main import main

    return main(argv)


def test_cli_gsi_prefixes_match_the_file(model, model_dir, tmp_path, capsys):
    import json

    text = tmp_path / "calib.txt"
    text.write_text(" ".join(WORDS[(7 * i) % 60] for i in range(50)))
    gsi = tmp_path / "gsi.json"
    assert _main(["adapt", "gsi", "--model", str(model_dir), "--text", str(text), "--steps", "2",
                  "--max-tokens", "30", "--out", str(gsi)]) == 0
    capsys.readouterr()
    assert _main(["adapt", "prune-eval", "--model", str(model_dir), "--gsi", str(gsi), "--gsi-steps", "0,1,2,4",
                  "--text", str(text), "--max-tokens", "30", "--repeats", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    doc = json.loads(gsi.read_text())
    rows = out["rows"]
    assert [r["n_dropped"] for r in rows] == [0, 1, 2, 4]
    assert [r["from_gsi"] for r in rows] == [0, 1, 2, 2]
    assert rows[2]["dropped"] == sorted([g["block"] for g in doc["gsi"]], key=lambda b: (int(b[4:]), b[:3] != "mha"))
    for r in rows[:3]:  # skipping reproduces the GSI file's perplexities (zero-output hooks) on the same text
        assert math.isclose(r["ppl"], r["gsi_file_ppl"], rel_tol=1e-5)
    assert rows[0]["agreement"] == 1.0 and rows[0]["ppl"] == rows[0]["dense_ppl"]
    assert any("one-shot" in n for n in out["notes"]) and any("in-sample" in n for n in out["notes"])
    # the human table
    assert _main(["adapt", "prune-eval", "--model", str(model_dir), "--drop", "mha:1,ffn:2", "--text", str(text),
                  "--repeats", "1"]) == 0
    printed = capsys.readouterr().out
    assert "mha:1,ffn:2" in printed and "time_ratio" in printed


@pytest.mark.parametrize("argv, needle", [
    ([], "needs --drop BLOCKS or --gsi FILE"),
    (["--drop", "mha:3"], "layer 3 is out of range"),
    (["--drop", "attn:0"], "bad block 'attn:0'"),
    (["--drop", "mha:0", "--gsi-steps", "1"], "--drop and --gsi-steps"),
    (["--gsi", "/nonexistent/g.json"], "no such GSI file"),
    (["--drop", "mha:0", "--max-tokens", "1"], "--max-tokens 1"),
    (["--drop", "mha:0", "--text", "/nonexistent/t.txt"], "no such file"),
    (["--model", "no-such-model", "--drop", "mha:0"], "no-such-model"),
    (["--drop", "mha:0", "--threads", "0"], "--threads 0"),
    (["--gsi-steps", "1"], "--gsi-steps needs --gsi FILE"),
])
def test_cli_bad_input_is_one_line_exit_2(argv, needle, model_dir, capsys):
    argv = argv if "--model" in argv else ["--model", str(model_dir), *argv]
    rc = _main(["adapt", "prune-eval", *argv])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and err.count("\n") == 1


def test_cli_gsi_file_for_another_model(model_dir, tmp_path, capsys):
    import json

    bad = tmp_path / "g.json"
    one_shot = [{"block": f"{k}:{i}", "ppl_alone": 2.0} for i in range(5) for k in ("mha", "ffn")]
    bad.write_text(json.dumps({"schema_version": 1, "model": {"name": "x", "n_layers": 5}, "dense_ppl": 2.0,
                               "text": {}, "gsi": [], "one_shot": one_shot}))
    assert _main(["adapt", "prune-eval", "--model", str(model_dir), "--gsi", str(bad)]) == 2
    assert "5 layers" in capsys.readouterr().err
