"""Quantization quality (real/studies/quant_quality.py, `flashsim real quant-quality`): the Q8_0 / Q4_0 rules on
hand-computed groups, the weight swap and its restore, the oracle top-k FFN mask, the measurement and the
CLI on a tiny random llama model."""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from analysis.quality_table import load_quality_table  # noqa: E402
from real.studies.quant_quality import (  # noqa: E402
    Config,
    OracleTopK,
    default_configs,
    measure_quality,
    quantize_q4_0,
    quantize_q8_0,
    quantized_weights,
    weight_matrices,
)
from tests.real.conftest import TINY_WORDS, save_tiny_llama_folder, tiny_llama  # noqa: E402


def _group(values):
    x = torch.zeros(32)
    x[: len(values)] = torch.tensor(values, dtype=torch.float32)
    return x


def test_q8_0_hand_computed():
    # amax 7.9375 -> d = 7.9375 / 127 = 0.0625 (exact in fp16); q = roundf(x / d), half away from zero
    x = _group([7.9375, -3.125, 0.03125, -0.03125, 0.09375, 0.02])
    want = _group([7.9375, -3.125, 0.0625, -0.0625, 0.125, 0.0])   # 127, -50, 0.5->1, -0.5->-1, 1.5->2, 0.32->0
    assert torch.equal(quantize_q8_0(x), want)


def test_q4_0_hand_computed():
    # largest |x| is 4.0 (positive, first of the tie with -4.0): d = 4.0 / -8 = -0.5; q = min(15, trunc(x/d + 8.5))
    x = _group([4.0, -4.0, -3.5, 0.25, -0.25, 1.1])
    # 4.0 -> q 0 -> -8 * -0.5 = 4.0; -4.0 -> x/d = 8 -> q 16 clipped to 15 -> -3.5; -3.5 -> q 15 -> -3.5;
    # 0.25 -> x/d = -0.5 -> q 8 -> 0; -0.25 -> 0.5 -> q 9 -> -0.5; 1.1 -> -2.2 -> q 6 -> 1.0
    want = _group([4.0, -3.5, -3.5, 0.0, -0.5, 1.0])
    assert torch.equal(quantize_q4_0(x), want)
    # the tie goes to the first: -4.0 first gives d = +0.5 and clips +4.0 to 7 * 0.5
    y = _group([-4.0, 4.0])
    assert torch.equal(quantize_q4_0(y), _group([-4.0, 3.5]))


def test_scale_is_rounded_to_fp16_and_zero_groups_stay_zero():
    x = _group([1.0, 0.3])                              # d = 1/127: not exact in fp16
    d16 = float(torch.tensor(1.0 / 127).to(torch.float16))
    assert float(quantize_q8_0(x)[0]) == pytest.approx(127 * d16, rel=0, abs=1e-7)
    assert float(quantize_q8_0(x)[0]) != 1.0
    assert torch.equal(quantize_q8_0(torch.zeros(64)), torch.zeros(64))
    assert torch.equal(quantize_q4_0(torch.zeros(64)), torch.zeros(64))


def test_groups_run_along_the_last_dimension_and_a_partial_group_is_padded():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(3, 40, generator=g)
    for q in (quantize_q8_0, quantize_q4_0):
        out = q(w)
        assert out.shape == w.shape and out.dtype == w.dtype
        for r in range(3):  # group 1 of a row = its first 32 values alone; group 2 = the last 8, zero-padded
            assert torch.equal(out[r, :32], q(w[r, :32]))
            assert torch.equal(out[r, 32:], q(torch.cat([w[r, 32:], torch.zeros(24)]))[:8])
    # the error is half a step (d/2 for Q8_0, d = amax/127; up to d for Q4_0, whose level +8d does not
    # exist) plus the fp16 rounding of d (relative 2^-11) times the largest level (127 / 8)
    amax = w[:, :32].abs().amax(dim=1, keepdim=True)
    assert torch.all((quantize_q8_0(w)[:, :32] - w[:, :32]).abs() <= amax / 127 * (0.5 + 127 / 2048) + 1e-6)
    assert torch.all((quantize_q4_0(w)[:, :32] - w[:, :32]).abs() <= amax / 8 * (1 + 8 / 2048) + 1e-6)


@pytest.fixture(scope="module")
def model():
    return tiny_llama(2, d_ff=64, seed=3)


@pytest.fixture(scope="module")
def ids():
    g = torch.Generator().manual_seed(5)
    return torch.randint(0, 64, (1, 30), generator=g)


def test_quantized_weights_swaps_every_matrix_and_restores(model):
    mats = weight_matrices(model)
    names = [n for n, _ in mats]
    assert "model.embed_tokens.weight" in names and any("down_proj" in n for n in names)
    n_expected = sum(p.numel() for _, p in mats)
    before = [p.detach().clone() for _, p in mats]
    norms = [p.detach().clone() for n, p in model.named_parameters() if p.dim() == 1]
    with quantized_weights(model, 4) as n:
        assert n == n_expected
        for (_, p), b in zip(mats, before):
            assert torch.equal(p, quantize_q4_0(b))
    assert all(torch.equal(p, b) for (_, p), b in zip(mats, before))
    with pytest.raises(RuntimeError), quantized_weights(model, 8):
        raise RuntimeError("body fails")
    assert all(torch.equal(p, b) for (_, p), b in zip(mats, before))
    assert all(torch.equal(p, b) for p, b in zip([p for _, p in model.named_parameters() if p.dim() == 1], norms))


def test_oracle_top_k_keeps_k_neurons_per_token(model, ids):
    from traces.capture.hooks import ffn_input_modules

    seen = []
    with OracleTopK(model, 0.25) as ora:  # registered first: the recorder sees the masked input
        hs = [m.register_forward_pre_hook(lambda _m, a: seen.append(a[0].detach().clone()))
              for m in ffn_input_modules(model)]
        try:
            with torch.no_grad():
                model(input_ids=ids, use_cache=False)
        finally:
            for h in hs:
                h.remove()
    assert len(seen) == 2
    for a in seen:
        assert torch.all((a[0] != 0).sum(dim=-1) == 16)     # round(0.25 * 64)
    assert 0.25 < ora.mass_kept < 1.0
    with OracleTopK(model, 1.0) as full, torch.no_grad():
        a = model(input_ids=ids, use_cache=False).logits
    with torch.no_grad():
        b = model(input_ids=ids, use_cache=False).logits
    assert torch.equal(a, b) and full.mass_kept == 1.0


def test_measure_quality_rows(model, ids):
    configs = default_configs((8, 4), (1.0, 0.5))
    assert [(c.bits, c.keep) for c in configs] == [(None, 1.0), (None, 0.5), (8, 1.0), (8, 0.5), (4, 1.0), (4, 0.5)]
    rows = measure_quality(model, ids, configs)
    by = {(r["bits"], r["keep"]): r for r in rows}
    native = by[(None, 1.0)]
    assert native["agreement"] == 1.0 and native["ppl_ratio"] == 1.0 and native["nll_delta"] == 0.0
    for r in rows:
        assert math.isclose(r["ppl_ratio"], math.exp(r["nll_delta"]), rel_tol=1e-9)
        assert 0 <= r["agreement"] <= 1
        assert (r["mass_kept"] == 1.0) == (r["keep"] == 1.0)
    # int4 moves the logits more than int8 (teacher-forced, same tokens)
    assert abs(by[(4, 1.0)]["nll_delta"]) > abs(by[(8, 1.0)]["nll_delta"])
    assert by[(8, 1.0)]["agreement"] >= by[(4, 1.0)]["agreement"]
    again = measure_quality(model, ids, [Config(4, 0.5)])[0]
    assert again["ppl"] == by[(4, 0.5)]["ppl"] and again["agreement"] == by[(4, 0.5)]["agreement"]


WORDS = TINY_WORDS


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, model):
    return save_tiny_llama_folder(tmp_path_factory.mktemp("tiny_llama_quant"), model)


def _main(argv):
    from flashsim.main import main

    return main(argv)


def test_cli_writes_the_planners_table(model_dir, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text(" ".join(WORDS[(11 * i) % 60] for i in range(40)))
    out = tmp_path / "qq.json"
    assert _main(["real", "quant-quality", "--model", str(model_dir), "--text", str(text), "--keep", "1,0.5",
                  "--out", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    doc = json.loads(out.read_text())
    assert doc["kind"] == "flashsim-quant-quality" and doc["text"]["n_tokens"] == 40
    assert doc["command"].startswith("flashsim real quant-quality") and doc["date"].endswith("Z")
    assert [(r["bits"], r["keep"]) for r in doc["rows"]] == [(None, 1.0), (None, 0.5), (8, 1.0), (8, 0.5),
                                                            (4, 1.0), (4, 0.5)]
    assert printed["rows"] == doc["rows"]
    table = load_quality_table(out)
    assert table.lookup(4, 1.0)["agreement"] == doc["rows"][4]["agreement"]
    assert _main(["real", "quant-quality", "--model", str(model_dir), "--text", str(text), "--bits", "4",
                  "--keep", "1"]) == 0
    human = capsys.readouterr().out
    assert "int4 (Q4_0)" in human and "ppl ratio" in human


@pytest.mark.parametrize("argv, needle", [
    (["--bits", "3"], "--bits 3"),
    (["--keep", "0"], "--keep 0"),
    (["--keep", "1.5"], "--keep 1.5"),
    (["--bits", "x"], "--bits 'x'"),
    (["--max-tokens", "1"], "--max-tokens 1"),
    (["--threads", "0"], "--threads 0"),
    (["--text", "/nonexistent/t.txt"], "no such file"),
    (["--model", "no-such-model"], "no-such-model"),
    (["--out", "/nonexistent/dir/q.json"], "does not exist"),
])
def test_cli_bad_input(argv, needle, capsys):
    assert _main(["real", "quant-quality", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1
