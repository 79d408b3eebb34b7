"""SelectInfer quality on a tiny random llama model: the neuron sets (hand-computed), FFN masking equals
a model whose down projection keeps only the selected neurons' columns, full selection = dense, the
prompt rows ignore the compute ratio, votes, determinism of the random baseline; a slow SmolLM2 run."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from devices.errors import FlashsimError  # noqa: E402
from real.studies.selectinfer_quality import (  # noqa: E402
    FfnMask,
    HeldOut,
    answer_sequences,
    check_settings,
    held_out_prompts,
    random_order,
    ranked_sets,
    run_selectinfer_quality,
    summarize,
    vote_dynamic,
)
from tests.real.conftest import tiny_llama  # noqa: E402
from traces.capture.prompts import Prompt  # noqa: E402
from traces.profiler import NeuronProfile  # noqa: E402

L, N = 2, 16


def _tiny_model(seed: int = 0):
    return tiny_llama(L, d_ff=N, std=0.3, seed=seed)


@pytest.fixture(scope="module")
def model():
    return _tiny_model()


@pytest.fixture(scope="module")
def seqs(model):
    g = torch.Generator().manual_seed(3)
    items = [(task, f"{task}-{i}", torch.randint(0, 64, (12,), generator=g).tolist())
             for task in ("a", "b") for i in range(2)]
    return answer_sequences(model, items, max_new_tokens=8)


@pytest.fixture(scope="module")
def profile():
    rng = np.random.default_rng(5)
    return NeuronProfile(rng.random((L, N)).astype(np.float32),
                         {"a": rng.random((L, N)).astype(np.float32), "b": rng.random((L, N)).astype(np.float32)},
                         {"tasks": ["a", "b"]})


def test_ranked_sets_hand_computed():
    base = np.array([[0.0, 5, 4, 3, 2, 1, 0, 0, 0, 0]])      # base order: 1, 2, 3, 4, 5, ...
    sec = np.array([[9.0, 0, 8, 0, 7, 0, 6, 0, 0, 5]])       # secondary order: 0, 2, 4, 6, 9, ...
    loaded, static = ranked_sets(base, sec, gamma=0.5, static_share=0.4)   # n_load 5, n_static 2
    assert np.flatnonzero(static[0]).tolist() == [1, 2]
    assert np.flatnonzero(loaded[0]).tolist() == [0, 1, 2, 4, 6]       # 1, 2 then 0, (2 skipped), 4, 6
    loaded, static = ranked_sets(base, sec, gamma=1.0, static_share=0.0)
    assert loaded.all() and not static.any()


def test_vote_dynamic_hand_computed():
    pool = np.array([True, True, True, True, False])
    mags = np.array([[0.1, 0.9, 0.5, 0.0, 9.0],    # alpha 0.5 of 4 -> top 2: neurons 1, 2 (4 not in pool)
                     [0.8, 0.7, 0.0, 0.0, 9.0],    # 0, 1
                     [0.0, 0.6, 0.0, 0.3, 9.0]])   # 1, 3
    sec = np.array([0.0, 0.0, 1.0, 2.0, 0.0])
    # votes: 0:1, 1:3, 2:1, 3:1 -> 1 first, then ties broken by secondary score: 3 (2.0), 2 (1.0), 0
    assert np.flatnonzero(vote_dynamic(mags, pool, 2, sec, 0.5)).tolist() == [1, 3]
    assert np.flatnonzero(vote_dynamic(mags, pool, 3, sec, 0.5)).tolist() == [1, 2, 3]
    assert vote_dynamic(mags, pool, 9, sec, 0.5).tolist() == pool.tolist()     # capped at the pool
    assert not vote_dynamic(mags, pool, 0, sec, 0.5).any()


def test_random_order_is_seeded_and_independent_of_other_settings():
    a = random_order(0, 0.25, L, N)
    assert np.array_equal(a, random_order(0, 0.25, L, N))
    assert not np.array_equal(a, random_order(1, 0.25, L, N))
    assert not np.array_equal(a, random_order(0, 0.5, L, N))
    assert all(sorted(row) == list(range(N)) for row in a.tolist())


def test_mask_equals_zeroed_down_projection_columns(model, seqs):
    s = seqs[0]
    keep = np.zeros((L, N), bool)
    keep[0, [1, 4, 5, 9]] = True
    keep[1, :7] = True
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for layer in range(L):
            ref.model.layers[layer].mlp.down_proj.weight[:, ~keep[layer]] = 0.0
    ffn = FfnMask(model)
    with ffn:
        ffn.masks = [torch.from_numpy(keep[layer].astype(np.float32)) for layer in range(L)]
        with torch.no_grad():
            got = model(input_ids=torch.tensor([s.ids]), use_cache=False).logits
    with torch.no_grad():
        want = ref(input_ids=torch.tensor([s.ids]), use_cache=False).logits
        dense = model(input_ids=torch.tensor([s.ids]), use_cache=False).logits
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(got, dense, atol=1e-3)
    assert torch.equal(dense[0].float(), s.dense_logits)      # hooks removed on exit


def _rows(model, profile, seqs, **kw):
    rows, notes = run_selectinfer_quality(model, profile, seqs, **kw)
    return {(r["task"], r["gamma"], r["compute_ratio"], r["selection"]): r for r in rows}, notes


def test_everything_selected_equals_dense(model, profile, seqs):
    rows, _ = _rows(model, profile, seqs, gammas=[1.0], ratios=[1.0], static_share=0.25)
    for task in ("a", "b"):
        dense, full = rows[(task, 1.0, 1.0, "dense")], rows[(task, 1.0, 1.0, "profile")]
        assert dense["agreement"] == 1.0 and full["agreement"] == 1.0
        assert math.isclose(full["ppl_answer"], dense["ppl_answer"], rel_tol=1e-6)
        assert math.isclose(rows[(task, 1.0, 1.0, "random")]["ppl_answer"], dense["ppl_answer"], rel_tol=1e-6)


def test_prompt_rows_use_the_loaded_set_only(model, profile, seqs):
    rows, _ = _rows(model, profile, seqs, gammas=[0.5], ratios=[1.0, 0.5], static_share=0.25, seed=4)
    for task in ("a", "b"):
        for sel in ("profile", "random"):
            full, half = rows[(task, 0.5, 1.0, sel)], rows[(task, 0.5, 0.5, sel)]
            # the compute ratio applies to answer tokens only; prompt tokens compute every loaded neuron
            assert math.isclose(full["ppl_prompt"], half["ppl_prompt"], rel_tol=1e-6)
            assert full["n_loaded"] == 8 and half["n_computed"] == 4
        assert rows[(task, 0.5, 0.5, "profile")]["passes"] == 4          # votes pass + full pass, x2 prompts
        assert rows[(task, 0.5, 1.0, "profile")]["passes"] == 2
        assert rows[(task, 0.5, 0.5, "profile")]["agreement"] < 1.0      # a tiny model does feel half its FFN


def test_deterministic_and_summary(model, profile, seqs):
    a, _ = _rows(model, profile, seqs, gammas=[0.25], ratios=[0.5], static_share=0.25, seed=1)
    b, _ = _rows(model, profile, seqs, gammas=[0.25], ratios=[0.5], static_share=0.25, seed=1)
    strip = {k: {f: v for f, v in r.items() if f != "seconds"} for k, r in a.items()}
    assert strip == {k: {f: v for f, v in r.items() if f != "seconds"} for k, r in b.items()}
    summ = summarize(list(a.values()))
    assert {(s["gamma"], s["selection"]) for s in summ} == {(1.0, "dense"), (0.25, "profile"), (0.25, "random")}
    assert all(s["tasks"] == 2 for s in summ)


def test_task_missing_from_profile_uses_model_ranking(model, profile, seqs):
    other = [HeldOut("c", s.prompt_id, s.ids, s.n_prompt, s.dense_logits) for s in seqs[:1]]
    _, notes = _rows(model, profile, other, gammas=[0.5], ratios=[1.0], static_share=0.25)
    assert any("'c' is not in the profile" in n for n in notes)


@pytest.mark.parametrize("kw, match", [
    ({"gammas": [0.0]}, "--gamma 0.0"),
    ({"gammas": [1.5]}, "--gamma 1.5"),
    ({"ratios": [0.1]}, "--static-share 0.25 exceeds --compute-ratio 0.1"),
    ({"alpha": 0.0}, "--alpha"),
])
def test_bad_settings(kw, match):
    args = {"gammas": [0.5], "ratios": [1.0], "static_share": 0.25, "alpha": 0.1, **kw}
    with pytest.raises(FlashsimError, match=match):
        check_settings(args["gammas"], args["ratios"], args["static_share"], args["alpha"])


def test_held_out_excludes_profiled_prompts():
    prompts = [Prompt("qa-1", "qa", "x"), Prompt("qa-2", "qa", "y"), Prompt("qa-3", "qa", "x")]
    assert [p.id for p in held_out_prompts(prompts, [Prompt("qa-1", "qa", "x")])] == ["qa-2"]


# ---- CLI: flashsim adapt selectinfer --------------------------------------------------------------------
@pytest.fixture(scope="module")
def cli_setup(tmp_path_factory, model):
    """A saved tiny model folder and a random trace of its shape over builtin prompts 1-5."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    from devices.model_spec import ModelSpec
    from traces.build import write_dense_trace
    from traces.capture.prompts import load_prompts
    from traces.format import PromptInfo

    root = tmp_path_factory.mktemp("selectinfer_cli")
    tok = Tokenizer(WordLevel({"<unk>": 0, **{f"w{i}": i + 1 for i in range(60)}}, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(root / "m")
    model.save_pretrained(root / "m")
    spec = ModelSpec.from_hf_config(model.config.to_dict(), name="tiny")
    profiled = load_prompts("builtin")[:5]
    T = 5 * 6
    acts = np.random.default_rng(0).standard_normal((L, T, N)).astype(np.float32)
    infos = [PromptInfo(id=p.id, task=p.task, text=p.text, n_prompt_tokens=6, n_generated_tokens=0)
             for p in profiled]
    write_dense_trace(root / "trace", spec, acts, np.zeros(T, np.int32), np.zeros(T, np.uint8),
                      np.repeat(np.arange(5, dtype=np.int32), 6), infos, rule="threshold", target_fraction=0.5)
    return root


def _main(argv):
    from flashsim.main import main

    return main(argv)


def test_cli_selectinfer_json_and_csv(cli_setup, tmp_path, capsys):
    import csv
    import json

    out = tmp_path / "si.csv"
    argv = ["adapt", "selectinfer", "--model", str(cli_setup / "m"), "--trace", str(cli_setup / "trace"),
            "--tasks", "qa,code", "--prompts-per-task", "2", "--gamma", "0.5,1", "--compute-ratio", "1,0.5",
            "--max-new-tokens", "4", "--out", str(out)]
    assert _main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["held_out"] == {"code": ["code-2", "code-3"], "qa": ["qa-2", "qa-3"]}
    assert doc["profile"]["profiled_prompts"] == ["qa-1", "translation-1", "summarization-1", "code-1", "story-1"]
    rows = doc["rows"]
    assert len(rows) == 2 * (1 + 2 * 2 * 2)   # tasks x (dense + gamma x ratio x selection)
    full = [r for r in rows if r["gamma"] == 1 and r["compute_ratio"] == 1 and r["selection"] != "dense"]
    assert all(r["agreement"] == 1.0 for r in full)
    with open(out, newline="") as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows) and table[0]["task"] == "code" and table[0]["prompts"] == "code-2;code-3"
    assert [p.name for p in tmp_path.iterdir()] == ["si.csv"]
    assert _main(argv) == 0                      # the human table, same numbers
    printed = capsys.readouterr().out
    assert "mean over tasks" in printed and "wrote" in printed


@pytest.mark.parametrize("argv, needle", [
    (["--gamma", "0.5,x"], "--gamma '0.5,x'"),
    (["--gamma", "0"], "--gamma 0.0"),
    (["--compute-ratio", "0.1"], "--static-share 0.25 exceeds"),
    (["--tasks", "poetry"], "poetry"),
    (["--trace", "/nonexistent/trace"], "/nonexistent/trace"),
    (["--out", "/nonexistent/dir/x.csv"], "does not exist"),
    (["--max-new-tokens", "0"], "--max-new-tokens 0"),
    (["--model", "no-such-model"], "no-such-model"),
])
def test_cli_selectinfer_bad_input(argv, needle, cli_setup, capsys):
    base = ["--model", str(cli_setup / "m"), "--trace", str(cli_setup / "trace")]
    rc = _main(["adapt", "selectinfer", *base, *argv])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and err.count("\n") == 1


@pytest.mark.slow
def test_smollm2_ranked_beats_random_at_small_gamma():
    from real.studies.selectinfer_quality import answer_sequences as answers
    from traces.capture.generate import encode_prompt, eos_token_ids
    from traces.capture.models import load_hf_model
    from traces.capture.prompts import load_prompts
    from traces.data import shipped_trace_path
    from traces.format import open_trace
    from traces.profiler import profile_traces

    trace = open_trace(shipped_trace_path())
    prof = profile_traces([trace])
    m, tok, _ = load_hf_model("smollm2-135m")
    held = [p for p in held_out_prompts(load_prompts("builtin"), trace.manifest.prompts) if p.task == "qa"][:2]
    seq = answers(m, [(p.task, p.id, encode_prompt(tok, p.text)) for p in held], 16, eos_token_ids(m, tok))
    rows, _ = run_selectinfer_quality(m, prof, seq, gammas=[0.25], ratios=[1.0])
    by = {r["selection"]: r for r in rows}
    assert by["profile"]["ppl_answer"] < by["random"]["ppl_answer"]
