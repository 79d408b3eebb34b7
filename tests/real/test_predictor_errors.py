"""Predictor error persistence (real.studies.predictor_errors): the transition counts by hand, scopes, the
`noisy` model's curve, and the CLI on a tiny llama folder: held-out prompts, a captured trace, the
recorded trace replayed by the simulator with the recall measured here, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from flashsim.main import main
from real.studies import predictor_error_stats as PS
from real.studies import predictor_errors as PE

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


def hand_case() -> tuple[np.ndarray, np.ndarray]:
    # T=4 tokens, N=2 neurons; neuron 0 over-predicted at t0, t1, then active and caught at t2;
    # neuron 1 always active, missed at t0, t1, t3
    truth = np.array([[False, True], [False, True], [True, True], [False, True]])
    pred = np.array([[True, False], [True, False], [True, True], [False, False]])
    return pred, truth


def test_transition_counts_by_hand() -> None:
    pred, truth = hand_case()
    c = PS.transition_counts(pred, truth, np.zeros(4, int), np.ones(4, bool), 2)
    assert (c["inactive"], c["active"], c["fp"], c["fn"], c["tp"]) == (3, 5, 2, 3, 2)
    assert c["fp_then_inactive"] == [1, 1] and c["fp_repeat"] == [1, 0]      # t0 -> t1 repeats, t1 -> t3 not
    assert c["fp_then_active"] == [1, 1] and c["fp_then_active_hit"] == [1, 1]
    assert c["fn_then_active"] == [2, 2] and c["fn_repeat"] == [1, 1]        # t0->t1, t1->t2 / t0->t2, t1->t3
    f = PS.figures(c)
    assert f["fp_rate"] == pytest.approx(2 / 3) and f["fn_rate"] == pytest.approx(0.6)
    assert f["fp_persistence"] == [1.0, 0.0] and f["fn_persistence"] == [0.5, 0.5]
    assert f["fn_lift"] == pytest.approx((0.5 - 0.6) / 0.4)
    assert f["recall"] == pytest.approx(0.4) and f["precision"] == pytest.approx(0.5)
    # pairs never cross a sequence boundary
    c2 = PS.transition_counts(pred, truth, np.array([0, 0, 1, 1]), np.ones(4, bool), 1)
    assert c2["fp_then_inactive"] == [1] and c2["fn_then_active"] == [1] and c2["fn_repeat"] == [1]


def test_model_curve_is_the_simulators() -> None:
    from sim.policies.error_memory import mixture

    # rate 0.2; repeats 0.6, 0.5, 0.46: memory 0.5, far (at lag 3) 0.325
    c = {"inactive": 100, "active": 100, "fp": 20, "fn": 30, "tp": 70, "fp_then_inactive": [100, 100, 100],
         "fp_repeat": [60, 50, 46], "fn_then_active": [10, 10, 10], "fn_repeat": [7, 7, 7], "fp_then_active": [1, 1, 1],
         "fp_then_active_hit": [1, 1, 1]}
    f = PS.figures(c)
    assert f["fp_memory"] == pytest.approx(0.5) and f["fp_memory_far"] == pytest.approx(0.325)
    a, lam = mixture(0.5, 0.325)
    for k in (1, 2, 3):
        want = 0.2 + 0.8 * (lam ** k + (1 - lam ** k) * a ** 2)
        assert f["fp_model"][k - 1] == pytest.approx(want)
    # lag 1 exactly; the last lag above the floor by the chain's lam**k (0.51**3 of the lift here)
    assert f["fp_model"][0] == pytest.approx(0.6) and 0.46 < f["fp_model"][2] < 0.47
    assert f["fp_chain"][1] == pytest.approx(0.2 + 0.8 * 0.5 ** 2)


def test_measure_scopes() -> None:
    pred, truth = hand_case()
    t = PS.Tokens(pred[None], truth[None], np.zeros(4, int), np.array([False, True, True, True]),
                  np.zeros(4, bool))
    m = PS.measure(t, 1)
    assert m["all"]["tokens"] == 4 and m["own"]["tokens"] == 3 and m["decode"] is None
    assert m["own"]["overall"]["counts"]["fp_then_inactive"] == [0]         # t1 -> t2: active
    assert m["all"]["per_layer"][0]["fp_persistence"] == [1.0]


@pytest.fixture(scope="module")
def tiny_setup(tmp_path_factory):
    from tests.real.test_predictor_train import make_tiny_folder

    root = tmp_path_factory.mktemp("pe")
    folder = make_tiny_folder(root / "tiny")
    torch.set_num_threads(1)
    assert main(["real", "train-predictor", "--model", str(folder), "--limit-prompts", "6", "--rank", "4",
                 "--epochs", "2", "--sparsity", "topk:0.25", "--threshold", "0.3", "--max-new-tokens", "3",
                 "--no-chat-template", "--out", str(root / "p.safetensors"), "--json"]) == 0
    return folder, root


def test_cli_heldout_prompts_and_recorded_replay(tiny_setup, capsys) -> None:
    from real.studies.predictor_train import load_predictor
    from traces.format import open_trace

    folder, root = tiny_setup
    capsys.readouterr()
    pfile = root / "p.safetensors"
    assert main(["real", "predictor-errors", "--predictor", str(pfile), "--model", str(folder), "--lags", "2",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    o = out["scopes"]["all"]["overall"]
    meta = load_predictor(pfile).meta
    # the held-out prompts, labelled as in training: the same recall and precision as the file says
    assert o["recall"] == pytest.approx(meta["heldout"]["overall"]["recall"])
    assert o["precision"] == pytest.approx(meta["heldout"]["overall"]["precision"])
    # train-predictor's own figure (lags 1..5) is the same measurement on the same tokens
    assert meta["heldout_persistence"]["fp_persistence"][:2] == pytest.approx(o["fp_persistence"])
    assert meta["heldout_persistence"]["fn_persistence"][:2] == pytest.approx(o["fn_persistence"])
    assert len(o["fp_persistence"]) == 2 and 0 <= o["fp_rate"] <= 1 and out["scopes"]["decode"]["tokens"] == 6
    # a trace of all 6 prompts (4 of them training prompts, skipped), its predicted sets recorded
    trace = root / "trace"
    assert main(["capture", "--model", str(folder), "--limit-prompts", "6", "--max-new-tokens", "3",
                 "--sparsity", "topk:0.25", "--no-chat-template", "--out", str(trace), "--json"]) == 0
    capsys.readouterr()
    rec = root / "rec"
    assert main(["real", "predictor-errors", "--predictor", str(pfile), "--model", str(folder), "--trace", str(trace),
                 "--record-out", str(rec), "--json"]) == 0
    out2 = json.loads(capsys.readouterr().out)
    assert out2["skipped_training_prompts"] == 4
    assert out2["scopes"]["all"]["overall"]["recall"] == pytest.approx(o["recall"], abs=0.02)  # same tokens, refed
    r, t = open_trace(rec), open_trace(trace)
    assert (r.n_tokens, r.n_layers, r.n_neurons) == (t.n_tokens, t.n_layers, t.n_neurons)
    # the simulator replays the recording: its recall is the recorded sets' recall on every token
    pred = np.stack([r.mask(i) for i in range(r.n_layers)])
    truth = np.stack([t.mask(i) for i in range(t.n_layers)])
    assert main(["replay", "--trace", str(trace), "--device", "this-host", "--preset", "llm-in-a-flash",
                 "--set", "predictor=recorded", "--set", f"recorded.path={rec}", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    dec = np.asarray(t.phase) == 1
    assert s["recall"] == pytest.approx((pred & truth)[:, dec].sum() / truth[:, dec].sum(), abs=1e-6)
    # the same figure from the two traces alone (what scripts/recorded_vs_noisy.py matches noisy to)
    o3 = PS.measure(PE.tokens_from_traces(t, r), 1)["decode"]["overall"]
    assert o3["recall"] == pytest.approx(s["recall"], abs=1e-6)


def test_cli_bad_input_exits_2(tiny_setup, tmp_path, capsys) -> None:
    folder, root = tiny_setup
    pfile = str(root / "p.safetensors")
    base = ["real", "predictor-errors", "--predictor", pfile, "--model", str(folder)]
    assert main(base + ["--record-out", str(tmp_path / "r")]) == 2
    assert main(base + ["--lags", "0"]) == 2
    assert main(["real", "predictor-errors", "--predictor", str(tmp_path / "none.safetensors"), "--model",
                 str(folder)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--record-out needs --trace" in err and "--lags 0" in err
    trace = tmp_path / "t"
    assert main(["capture", "--model", str(folder), "--limit-prompts", "2", "--max-new-tokens", "1",
                 "--sparsity", "topk:0.5", "--no-chat-template", "--out", str(trace), "--json"]) == 0
    capsys.readouterr()
    assert main(base + ["--trace", str(trace)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "captured with rule topk:0.5" in err
