"""The low-rank activation predictor: labels by the trace rule, training that learns, held-out
metrics by hand, the safetensors file (round trip, atomic, checked on load), the CLI verb on a tiny
llama folder with its own tokenizer, determinism, bad input."""

from __future__ import annotations

import json
import string

import numpy as np
import pytest

from devices.errors import FlashsimError
from flashsim.main import main
from real.studies import predictor_train as PT

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def _one_thread():
    """One PyTorch thread, as the CLI's default (on shared cores 2 threads are many times slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_tiny_folder(folder):
    """A random 2-layer llama saved as a HF folder with a character-level tokenizer (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    chars = sorted(set(string.printable) - set(string.whitespace)) + [" "]
    vocab = {c: i for i, c in enumerate(chars)}
    vocab["[UNK]"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return make_tiny_folder(tmp_path_factory.mktemp("tiny-llama"))


def test_evaluate_by_hand():
    # one layer, d=1, r=1, N=2: logits = x * A * B + bias; neuron 0 fires for x > 0, neuron 1 never
    pred = PT.LowRankPredictor(np.ones((1, 1, 1), np.float32), np.array([[[1.0, 0.0]]], np.float32),
                               np.array([[0.0, -5.0]], np.float32), 0.5)
    x = np.array([[[1.0], [-1.0], [2.0], [-3.0]]], np.float32)           # [L=1, T=4, d=1]
    y = np.array([[[True, False], [True, False], [False, True], [False, False]]])
    m = PT.evaluate(pred, x, y)
    # predicted: neuron 0 at tokens 0 and 2; true: (0,0), (1,0), (2,1)
    assert m["overall"]["recall"] == pytest.approx(1 / 3)
    assert m["overall"]["precision"] == pytest.approx(1 / 2)
    assert m["overall"]["predicted_fraction"] == pytest.approx(2 / 8)
    assert m["per_layer"][0]["active_fraction"] == pytest.approx(3 / 8)


def test_training_learns_a_low_rank_rule():
    """Labels that ARE a rank-2 linear rule of x: the trained predictor must find them."""
    rng = np.random.default_rng(1)
    L, T, d, N = 2, 600, 16, 32
    x = rng.standard_normal((L, T, d)).astype(np.float32)
    w = rng.standard_normal((L, d, 2)) @ rng.standard_normal((L, 2, N))
    y = np.einsum("ltd,ldn->ltn", x, w) > 0
    A, B, b = PT.train(x[:, :400], y[:, :400], rank=4, epochs=40, seed=0, lr=2e-2, batch_tokens=100)
    m = PT.evaluate(PT.LowRankPredictor(A, B, b, 0.5), x[:, 400:], y[:, 400:])["overall"]
    assert m["recall"] > 0.9 and m["precision"] > 0.9
    # an untrained one (zero epochs is refused; one epoch of a tiny rate) is clearly worse
    A0, B0, b0 = PT.train(x[:, :400], y[:, :400], rank=4, epochs=1, seed=0, lr=1e-5, batch_tokens=100)
    m0 = PT.evaluate(PT.LowRankPredictor(A0, B0, b0, 0.5), x[:, 400:], y[:, 400:])["overall"]
    assert m0["recall"] + m0["precision"] < m["recall"] + m["precision"] - 0.3


def test_labels_follow_the_trace_rules():
    a = np.array([[[0.1, -3.0, 2.0, 0.0], [5.0, 0.2, -0.1, 1.0]]], np.float32)   # [1, 2, 4]
    top, none = PT.labels(a, np.arange(2), "topk", 0.5)
    assert none is None and top[0].tolist() == [[False, True, True, False], [True, False, False, True]]
    relu, _ = PT.labels(a, np.arange(2), "relu", None)
    assert relu[0, 0].tolist() == [True, False, True, False]
    thr_lab, thr = PT.labels(a, np.array([0]), "threshold", 0.5)     # calibrated on token 0 only
    assert len(thr) == 1 and thr_lab[0, 0].sum() == 2


def test_split_is_by_prompt_seeded_and_disjoint():
    tr, ho = PT.split_prompts(20, 0.25, seed=3)
    assert len(ho) == 5 and set(tr).isdisjoint(ho) and set(tr) | set(ho) == set(range(20))
    assert (PT.split_prompts(20, 0.25, 3)[1] == ho).all()
    assert not (PT.split_prompts(20, 0.25, 4)[1] == ho).all()
    with pytest.raises(FlashsimError, match="at least 2 prompts"):
        PT.split_prompts(1, 0.25, 0)


def test_file_round_trip_and_bad_files(tmp_path):
    rng = np.random.default_rng(0)
    pred = PT.LowRankPredictor(rng.standard_normal((2, 8, 3)).astype(np.float32),
                               rng.standard_normal((2, 3, 16)).astype(np.float32),
                               rng.standard_normal((2, 16)).astype(np.float32), 0.4,
                               {"format": PT.FORMAT, "version": PT.VERSION, "n_layers": 2, "d_model": 8, "d_ff": 16,
                                "rank": 3, "threshold": 0.4, "model": "m"})
    path = PT.save_predictor(pred, tmp_path / "p.safetensors")
    back = PT.load_predictor(path)
    assert np.array_equal(back.A, pred.A) and np.array_equal(back.B, pred.B) and back.threshold == 0.4
    assert list(tmp_path.iterdir()) == [path]                 # no temporary file left
    x = rng.standard_normal((5, 8)).astype(np.float32)
    p = 1 / (1 + np.exp(-((x @ pred.A[1]) @ pred.B[1] + pred.bias[1])))
    assert np.array_equal(back.predict(1, x), p >= 0.4)
    from safetensors.numpy import load_file

    assert set(load_file(str(path))) == {"A", "B", "bias"}  # readable by the reference library
    with pytest.raises(FlashsimError, match="must end in .safetensors"):
        PT.save_predictor(pred, tmp_path / "p.bin")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(FlashsimError, match="bad.safetensors"):
        PT.load_predictor(bad)
    pred.meta["version"] = 99
    PT.save_predictor(pred, tmp_path / "v.safetensors")
    with pytest.raises(FlashsimError, match="version 99"):
        PT.load_predictor(tmp_path / "v.safetensors")
    with pytest.raises(FlashsimError, match="no such predictor"):
        PT.load_predictor(tmp_path / "none.safetensors")


def test_cli_trains_reports_and_is_deterministic(tiny_folder, tmp_path, capsys):
    args = ["real", "train-predictor", "--model", str(tiny_folder), "--limit-prompts", "6", "--rank", "4",
            "--epochs", "3", "--sparsity", "topk:0.25", "--seed", "1", "--json"]
    assert main(args + ["--out", str(tmp_path / "a.safetensors")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rank"] == 4 and out["rule"] == "topk" and out["target_fraction"] == 0.25
    assert len(out["heldout_prompts"]) == 2 and len(out["train_prompts"]) == 4
    ho = out["heldout"]
    assert len(ho["per_layer"]) == 2 and 0 <= ho["overall"]["recall"] <= 1 and 0 <= ho["overall"]["precision"] <= 1
    assert ho["overall"]["active_fraction"] == pytest.approx(0.25)          # topk:0.25 of 128 neurons = 32 exactly
    pred = PT.load_predictor(tmp_path / "a.safetensors")
    assert pred.meta["heldout"] == ho and pred.rank == 4
    assert main(args + ["--out", str(tmp_path / "b.safetensors")]) == 0
    capsys.readouterr()
    assert np.array_equal(PT.load_predictor(tmp_path / "b.safetensors").A, pred.A)
    assert out["chat_template"] is False      # the character tokenizer has none
    # the table form
    assert main(args[:-1] + ["--no-chat-template", "--out", str(tmp_path / "c.safetensors")]) == 0
    text = capsys.readouterr().out
    assert "recall" in text and "all" in text


def test_cli_bad_input_exits_2(tiny_folder, tmp_path, capsys):
    base = ["real", "train-predictor", "--model", str(tiny_folder), "--limit-prompts", "4"]
    assert main(base + ["--out", str(tmp_path / "x.bin")]) == 2
    assert main(base + ["--rank", "0", "--out", str(tmp_path / "x.safetensors")]) == 2
    assert main(base + ["--sparsity", "topk:7", "--out", str(tmp_path / "x.safetensors")]) == 2
    assert main(base + ["--threshold", "1.5", "--out", str(tmp_path / "x.safetensors")]) == 2
    assert main(["real", "train-predictor", "--model", str(tiny_folder), "--limit-prompts", "1",
                 "--out", str(tmp_path / "x.safetensors")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--rank 0" in err and "at least 2 prompts" in err
    assert not list(tmp_path.glob("*.safetensors"))


def test_shared_prefix_and_own_token_metrics():
    assert PT.shared_prefix_length([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3]]) == 2
    assert PT.shared_prefix_length([[1, 2], [3]]) == 0 and PT.shared_prefix_length([[1, 2]]) == 0
    rng = np.random.default_rng(0)
    L, d, N = 1, 4, 8
    lens = [5, 6, 7, 5]
    T = sum(lens)
    pairs = PT.Pairs(rng.standard_normal((L, T, d)).astype(np.float32), rng.standard_normal((L, T, N)).astype(np.float32),
                     np.repeat(np.arange(4), lens).astype(np.int32), lens, shared_prefix=3)
    pred = PT.train_from_pairs(pairs, rank=2, epochs=1, seed=0, rule="topk", fraction=0.25, holdout=0.25)
    (ho,) = pred.meta["heldout_prompts"]
    assert pred.meta["heldout_tokens"] == lens[ho] and pred.meta["heldout_own_tokens"] == lens[ho] - 3
