"""The learned controller: the batched decision pass equals the sequential one, the weights file
round-trips and is checked, the safety rule, deterministic training, the shipped weights, the CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapt.controllers.base import AdaptState, Controller
from adapt.controllers.learned import (
    LearnedController,
    decide_pass,
    decide_sequential,
    default_weights_path,
    load_policy,
    mlp_forward,
    n_params,
)
from adapt.controllers.learned_obs import OBS_DIM, observations, pass_context
from adapt.drop_quality import GsiPerplexity
from adapt.env import RapEnv
from adapt.importance import importance_vector
from adapt.train import DqnConfig, init_params, save_policy, train_dqn
from devices import load_model
from devices.errors import FlashsimError
from flashsim.main import main
from sim.blocks import BlockMemory
from tests.adapt.test_env import synthetic_doc

SMOL = BlockMemory.from_spec(load_model("smollm2-135m"))
DOC = synthetic_doc(SMOL.n_layers)
IMP = importance_vector(DOC, SMOL.names)


def _env(**kw) -> RapEnv:
    return RapEnv(SMOL, IMP, GsiPerplexity(DOC, SMOL.names), **kw)


def _random_params(seed: int, scale: float = 1.0) -> dict[str, np.ndarray]:
    p = init_params(np.random.default_rng(seed), (128, 128))
    rng = np.random.default_rng(seed + 1)
    p["w2"] = (rng.normal(0, 0.3 * scale, p["w2"].shape)).astype(np.float32)
    p["b0"] = rng.normal(0, 0.2, p["b0"].shape).astype(np.float32)
    return p


def _state(rng: np.random.Generator, frac: float | None = None) -> AdaptState:
    s = _env().sample_state(rng)
    if frac is None:
        return s
    return AdaptState(0, s.batch, s.seq_len, s.kv_tokens, int(frac * SMOL.full_need_bytes(s.kv_tokens)),
                      IMP, np.zeros(60, bool), SMOL)


def _write(tmp_path, params, **meta_over) -> str:
    meta = {"format": "flashsim-rap-dqn", "obs_version": "1", "obs_dim": str(OBS_DIM), **meta_over}
    path = tmp_path / "w.safetensors"
    save_policy(path, params, meta)
    return str(path)


# derandomize: the batched pass factors the first layer differently, so a near-tie (|Q_drop - Q_keep|
# ~ 1e-7) may round the other way; a fixed example set keeps the test deterministic
@settings(max_examples=40, deadline=None, derandomize=True)
@given(seed=st.integers(0, 10_000), state_seed=st.integers(0, 10_000))
def test_batched_pass_equals_the_sequential_pass(seed, state_seed):
    params = _random_params(seed)
    ctx = pass_context(_state(np.random.default_rng(state_seed)))
    np.testing.assert_array_equal(decide_pass(params, ctx), decide_sequential(params, ctx))


def test_the_pass_visits_blocks_in_ascending_importance():
    """A policy that drops exactly while the plan exceeds the budget (entry 5 > 0) drops the shortest
    prefix of the importance order that fits."""
    p = {k: np.zeros_like(v) for k, v in init_params(np.random.default_rng(0), (128, 128)).items()}
    p["w0"][5, 0] = 1.0             # h0[0] = relu(excess)
    p["w1"][0, 0] = 1.0             # h1[0] = h0[0]
    p["w2"][0, 1] = 1e6             # drop wins iff excess > 0
    state = _state(np.random.default_rng(3), frac=0.7)
    got = decide_pass(p, pass_context(state))
    order = np.argsort(IMP, kind="stable")
    k = int(got.sum())
    assert got[order[:k]].all() and not got[order[k:]].any()
    assert SMOL.footprint_bytes(got, state.kv_tokens) <= state.available_bytes
    prev = got.copy()
    prev[order[k - 1]] = False
    assert SMOL.footprint_bytes(prev, state.kv_tokens) > state.available_bytes


def test_mlp_forward_matches_observations_of_the_env():
    env = _env()
    obs, _ = env.reset(seed=5)
    ctx = pass_context(env._state)
    again = observations(ctx, np.array([0]), np.array([1.0]), np.array([0]), np.array([0.0]))[0]
    np.testing.assert_array_equal(obs, again)
    p = _random_params(1)
    assert mlp_forward(p, obs[None]).shape == (1, 2)
    assert n_params(p) == 15 * 128 + 128 + 128 * 128 + 128 + 128 * 2 + 2 == 18_818


def test_weights_round_trip_and_bad_files(tmp_path):
    params = _random_params(2)
    path = _write(tmp_path, params, alpha="1.0")
    pol = load_policy(path)
    for k, v in params.items():
        np.testing.assert_array_equal(pol.params[k], v)
    assert pol.metadata["alpha"] == "1.0"
    assert [f.name for f in tmp_path.iterdir()] == ["w.safetensors"]   # no temporary left behind
    with pytest.raises(FlashsimError, match="no such"):
        load_policy(tmp_path / "missing.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(FlashsimError, match="not a safetensors"):
        load_policy(tmp_path / "junk.safetensors")
    bad = tmp_path / "fmt"
    bad.mkdir()
    with pytest.raises(FlashsimError, match="format"):
        load_policy(_write(bad, params, format="other"))
    with pytest.raises(FlashsimError, match="layout version"):
        load_policy(_write(bad, params, obs_version="0"))
    wrong = dict(params, w2=np.zeros((128, 3), np.float32))
    with pytest.raises(FlashsimError, match="'b2' has shape|'w2' has shape"):
        load_policy(_write(bad, wrong))
    nan = dict(params, b0=np.full(128, np.nan, np.float32))
    with pytest.raises(FlashsimError, match="NaN"):
        load_policy(_write(bad, nan))


def test_controller_protocol_and_safety_rule(tmp_path):
    keep_all = {k: np.zeros_like(v) for k, v in _random_params(0).items()}
    keep_all["b2"] = np.array([1.0, 0.0], np.float32)          # Q(keep) > Q(drop) always
    path = _write(tmp_path, keep_all)
    ctl = LearnedController(path)
    assert isinstance(ctl, Controller) and ctl.name == "learned"
    state = _state(np.random.default_rng(4), frac=0.7)
    d = ctl.decide(state)
    assert d.dtype == bool and d.shape == (60,)
    assert SMOL.footprint_bytes(d, state.kv_tokens) <= state.available_bytes
    assert ctl.safety_fired == 1 and ctl.decisions == 1
    order = np.argsort(IMP, kind="stable")                      # least important first
    assert d[order[: int(d.sum())]].all()
    roomy = _state(np.random.default_rng(4), frac=1.05)
    assert not ctl.decide(roomy).any() and ctl.safety_fired == 1
    ctl.reset()
    assert ctl.safety_fired == 0 and ctl.decisions == 0
    raw = LearnedController(path, safety=False)
    assert not raw.decide(state).any()                          # without the rule it would violate


def test_training_is_deterministic_and_writes_identical_files(tmp_path):
    cfg = DqnConfig(steps=400, seed=3, learning_starts=200, buffer_size=1000)
    a, b = train_dqn(_env(), cfg), train_dqn(_env(), cfg)
    for k in a.params:
        np.testing.assert_array_equal(a.params[k], b.params[k])
    assert a.updates == b.updates > 0 and a.episodes == b.episodes > 400 // 60   # episodes end on a fit
    save_policy(tmp_path / "a.safetensors", a.params, {"format": "x"})
    save_policy(tmp_path / "b.safetensors", b.params, {"format": "x"})
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()
    c = train_dqn(_env(), DqnConfig(steps=400, seed=4, learning_starts=200, buffer_size=1000))
    assert not np.array_equal(a.params["w0"], c.params["w0"])


def test_short_training_improves_on_the_untrained_network():
    """6,000 steps (100 episodes) on the synthetic GSI: the held-out mean score rises above the
    untrained network's, with the safety rule off so the policy itself must avoid violations."""
    env = _env()
    rng = np.random.default_rng(99)
    states = [env.sample_state(rng) for _ in range(60)]

    def mean_score(params):
        return np.mean([env.plan_score(s, decide_pass(params, pass_context(s)))["score"] for s in states])

    untrained = init_params(np.random.default_rng(np.random.SeedSequence(0).spawn(4)[0]), (128, 128))
    trained = train_dqn(_env(), DqnConfig(steps=6000, seed=0)).params
    assert mean_score(trained) > mean_score(untrained) + 0.5


def test_config_validation():
    with pytest.raises(ValueError, match="steps"):
        DqnConfig(steps=0)
    with pytest.raises(ValueError, match="hidden"):
        DqnConfig(hidden=(128,))
    with pytest.raises(ValueError, match="gamma"):
        DqnConfig(gamma=1.5)


@pytest.mark.skipif(not default_weights_path().is_file(), reason="shipped weights not generated yet")
def test_shipped_weights_load_and_keep_every_budget():
    pol = load_policy(default_weights_path())
    assert n_params(pol.params) == int(pol.metadata["n_params"]) == 18_818
    assert pol.metadata["model"] == "smollm2-135m"
    ctl = LearnedController()
    rng = np.random.default_rng(5)
    for _ in range(50):
        s = _state(rng)
        d = ctl.decide(s)
        floor = SMOL.footprint_bytes(np.ones(60, bool), s.kv_tokens)
        fp = SMOL.footprint_bytes(d, s.kv_tokens)
        assert fp <= s.available_bytes or (d.all() and floor > s.available_bytes)


# ---- CLI ---------------------------------------------------------------------------------------------
def _gsi_file(tmp_path) -> str:
    doc = dict(DOC, model={"name": "smollm2-135m", "n_layers": 30})
    path = tmp_path / "gsi.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_cli_train_end_to_end(tmp_path, capsys):
    out = tmp_path / "policy.safetensors"
    rc = main(["adapt", "train", "--gsi", _gsi_file(tmp_path), "--steps", "600", "--seed", "1",
               "--alpha", "1.5", "--beta", "3", "--eval-points", "20", "--out", str(out), "--json"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["n_params"] == 18_818 and out.is_file()
    meta = load_policy(out).metadata
    assert (meta["alpha"], meta["beta"], meta["seed"], meta["train_steps"], meta["hidden"], meta["visit"]) == (
        "1.5", "3.0", "1", "600", "128,128", "importance")
    h = summary["held_out"]
    assert set(h) >= {"learned", "heuristic", "heuristic-bytes", "points"}
    assert h["learned"]["violations"] <= h["points"] and h["heuristic"]["violations"] >= 0
    assert math.isfinite(h["learned"]["score"])
    rc = main(["adapt", "train", "--gsi", _gsi_file(tmp_path), "--steps", "120", "--eval-points", "3",
               "--out", str(tmp_path / "p2.safetensors")])
    assert rc == 0 and "wrote" in capsys.readouterr().out


@pytest.mark.parametrize("argv, needle", [
    (["--steps", "0"], "--steps 0"),
    (["--gsi", "/nonexistent/gsi.json"], "no such GSI file"),
    (["--out", "/nonexistent/dir/p.safetensors"], "does not exist"),
    (["--model", "no-such-model"], "no-such-model"),
    (["--alpha", "-1"], "--alpha"),
])
def test_cli_train_bad_input_one_line_exit_2(tmp_path, capsys, argv, needle):
    base = {"--gsi": _gsi_file(tmp_path), "--out": str(tmp_path / "p.safetensors"), "--steps": "50"}
    for flag, value in zip(argv[::2], argv[1::2]):
        base[flag] = value
    args = ["adapt", "train"] + [x for kv in base.items() for x in kv]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_cli_gsi_for_another_model_is_rejected(tmp_path, capsys):
    path = tmp_path / "g.json"
    path.write_text(json.dumps(synthetic_doc(4)))
    assert main(["adapt", "train", "--gsi", str(path), "--out", str(tmp_path / "p.safetensors")]) == 2
    assert "layers" in capsys.readouterr().err


def test_visiting_orders_by_hand():
    """tiny model at 20 KV entries: every block frees 300 B except at 0 entries (mha 100 B, ffn 300 B);
    importance mha:0 .75, ffn:0 .5, mha:1 .25, ffn:1 1.0."""
    from adapt.controllers.learned_obs import visiting_order
    from tests.adapt.conftest import tiny_blocks, tiny_doc

    blocks, doc = tiny_blocks(), tiny_doc(steps=4)
    imp = importance_vector(doc, blocks.names)
    s20 = AdaptState(0, 2, 10, 20, 600, imp, np.zeros(4, bool), blocks)
    assert visiting_order(s20).tolist() == [2, 1, 0, 3]                 # ascending importance
    assert visiting_order(s20, "per-byte").tolist() == [2, 1, 0, 3]     # equal bytes: the same
    s0 = AdaptState(0, 1, 1, 0, 600, imp, np.zeros(4, bool), blocks)
    # per byte at 0 KV: mha:1 .25/100, ffn:0 .5/300, mha:0 .75/100, ffn:1 1/300
    assert visiting_order(s0, "per-byte").tolist() == [1, 2, 3, 0]
    with pytest.raises(ValueError, match="visit"):
        visiting_order(s0, "random")


def test_the_controller_uses_the_files_visiting_order(tmp_path):
    p = {k: np.zeros_like(v) for k, v in init_params(np.random.default_rng(0), (128, 128)).items()}
    p["w0"][5, 0], p["w1"][0, 0], p["w2"][0, 1] = 1.0, 1.0, 1e6    # drop while over budget
    state = AdaptState(0, 1, 64, 64, int(0.7 * SMOL.full_need_bytes(64)), IMP, np.zeros(60, bool), SMOL)
    by_imp = LearnedController(_write(tmp_path, p)).decide(state)
    sub = tmp_path / "pb"
    sub.mkdir()
    per_byte = LearnedController(_write(sub, p, visit="per-byte"))
    assert per_byte.visit == "per-byte"
    got = per_byte.decide(state)
    from adapt.controllers.learned_obs import visiting_order

    order = visiting_order(state, "per-byte")
    k = int(got.sum())
    assert got[order[:k]].all() and not got[order[k:]].any()
    assert not np.array_equal(got, by_imp)
    bad = tmp_path / "bad"
    bad.mkdir()
    with pytest.raises(FlashsimError, match="visit"):
        load_policy(_write(bad, p, visit="sideways"))


def test_safetensors_writer_is_deterministic_and_standard():
    from safetensors.numpy import load

    from adapt.train import safetensors_bytes

    t = {"w0": np.arange(6, dtype=np.float32).reshape(2, 3), "b0": np.array([1.5, -2.0], np.float32)}
    a = safetensors_bytes(t, {"seed": "0", "alpha": "1.0", "model": "m"})
    b = safetensors_bytes(dict(reversed(list(t.items()))), {"model": "m", "alpha": "1.0", "seed": "0"})
    assert a == b                                        # independent of dict order
    header_len = int.from_bytes(a[:8], "little")
    assert header_len % 8 == 0
    back = load(a)
    assert set(back) == {"w0", "b0"}
    np.testing.assert_array_equal(back["w0"], t["w0"])
    np.testing.assert_array_equal(back["b0"], t["b0"])


def test_backward_pass_matches_finite_differences():
    """QNetwork.gradients against central differences of the mean Huber loss, in float64 (errors
    both inside and outside the Huber delta)."""
    from adapt.train import QNetwork

    rng = np.random.default_rng(0)
    params = {k: v.astype(np.float64) for k, v in init_params(rng, (6, 5)).items()}
    params["w2"] = rng.normal(0, 0.5, params["w2"].shape)
    params["b0"] = rng.normal(0, 0.1, params["b0"].shape)
    net = QNetwork(params, lr=1e-3, huber_delta=1.0)
    x = rng.normal(0, 1, (7, OBS_DIM))
    actions = rng.integers(0, 2, 7)
    targets = rng.normal(0, 2, 7)                        # some |error| > delta
    loss, grads = net.gradients(x, actions, targets)
    assert math.isfinite(loss)
    eps = 1e-6
    for k in ("w0", "b0", "w1", "b1", "w2", "b2"):
        flat = params[k].reshape(-1)
        for i in np.random.default_rng(1).choice(flat.size, size=min(6, flat.size), replace=False):
            old = flat[i]
            flat[i] = old + eps
            up, _ = net.gradients(x, actions, targets)
            flat[i] = old - eps
            down, _ = net.gradients(x, actions, targets)
            flat[i] = old
            assert grads[k].reshape(-1)[i] == pytest.approx((up - down) / (2 * eps), rel=1e-4, abs=1e-7), k
