"""RapEnv's contract: gymnasium's checker, shapes and dtypes, a hand-computed episode, the reward's
sign (violation lowers it, quality raises it), shaping that telescopes, determinism under a seed."""

from __future__ import annotations

import math

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

from adapt.controllers.base import AdaptState
from adapt.controllers.learned_obs import OBS_DIM, OBS_NAMES, visiting_order
from adapt.drop_quality import GsiPerplexity
from adapt.env import RapEnv, quality_kept
from adapt.importance import importance_vector, make_gsi_document
from devices import load_model
from sim.blocks import BlockMemory, block_names
from tests.adapt.conftest import tiny_blocks, tiny_doc


def synthetic_doc(n_layers: int, seed: int = 0, dense: float = 27.0) -> dict:
    """A full-GSI document with heavy-tailed one-shot damage (cheap attention, dear FFNs, dearer
    first layer) and GSI increments that grow with depth (removals interact)."""
    rng = np.random.default_rng(seed)
    names = block_names(n_layers)
    inc = np.empty(2 * n_layers)
    inc[0::2] = rng.lognormal(-4.5, 1.5, n_layers)
    inc[1::2] = rng.lognormal(-2.5, 1.2, n_layers)
    inc[:2] = (5.0, 10.0)
    order = np.lexsort((np.arange(2 * n_layers), inc))
    one = [(names[i], dense * math.exp(inc[i])) for i in order]
    lp, gsi = math.log(dense), []
    for k, i in enumerate(order):
        lp += inc[i] * (1 + 0.03 * k)
        gsi.append((names[i], math.exp(min(lp, 600.0))))
    return make_gsi_document(dense_ppl=dense, gsi=gsi, one_shot=one, model_name="synthetic",
                             n_layers=n_layers, text_sha256="0" * 64, text_source="builtin", n_tokens=8)


def smol_env(**kw) -> RapEnv:
    blocks = BlockMemory.from_spec(load_model("smollm2-135m"))
    doc = synthetic_doc(blocks.n_layers)
    return RapEnv(blocks, importance_vector(doc, blocks.names), GsiPerplexity(doc, blocks.names), **kw)


def tiny_env(**kw) -> RapEnv:
    blocks, doc = tiny_blocks(), tiny_doc(steps=4)
    return RapEnv(blocks, importance_vector(doc, blocks.names), GsiPerplexity(doc, blocks.names), **kw)


def test_gymnasium_env_checker_passes():
    check_env(smol_env(), skip_render_check=True)
    check_env(tiny_env(), skip_render_check=True)


def test_reset_and_step_shapes_dtypes_and_episode_length():
    env = smol_env()
    assert env.observation_space.shape == (OBS_DIM,) == (len(OBS_NAMES),)
    assert env.action_space.n == 2
    obs, info = env.reset(seed=3)
    assert obs.dtype == np.float32 and obs.shape == (OBS_DIM,) and env.observation_space.contains(obs)
    # a budget below the always-resident bytes never fits: the episode visits every block
    s = env.sample_state(np.random.default_rng(0))
    tight = AdaptState(0, s.batch, s.seq_len, s.kv_tokens, 1, env.importance, s.dropped, env.blocks)
    obs, info = env.reset(seed=3, options={"state": tight})
    steps, terminated = 0, False
    while not terminated:
        obs, reward, terminated, truncated, info = env.step(steps % 2)
        steps += 1
        assert isinstance(reward, float) and not truncated
        assert env.observation_space.contains(obs)
    assert steps == 60
    assert info["dropped"].dtype == bool and info["dropped"].sum() == 30
    with pytest.raises(RuntimeError):
        env.step(0)
    env.reset(seed=3)
    with pytest.raises(ValueError):
        env.step(2)
    roomy = AdaptState(0, s.batch, s.seq_len, s.kv_tokens, 10**12, env.importance, s.dropped, env.blocks)
    with pytest.raises(ValueError, match="nothing to decide"):
        env.reset(options={"state": roomy})


def test_the_episode_ends_when_the_plan_fits():
    env = smol_env()
    _, info = env.reset(seed=4)
    terminated, steps = False, 0
    while not terminated:
        _, _, terminated, _, info = env.step(1)
        steps += 1
    assert not info["violation"] and steps < 60
    dropped = info["dropped"]
    order = visiting_order(env._state, env.visit)
    assert dropped[order[:steps]].all() and not dropped[order[steps:]].any()
    last = dropped.copy()
    last[order[steps - 1]] = False                      # one block fewer would not have fitted
    assert env.blocks.footprint_bytes(last, env._state.kv_tokens) > info["available_bytes"]


def test_hand_computed_first_steps():
    """tiny model: mha 100 B + 10 B/token, ffn 300 B, always 50 B; batch 2 x 10 tokens = 20 KV
    entries -> every block holds 300 B, full need 1250 B; budget 600 B; GSI order mha:1, ffn:0,
    mha:0, ffn:1 (importance 0.25, 0.5, 0.75, 1.0) is also the visiting order."""
    env = tiny_env(alpha=1.0, beta=2.0)
    state = AdaptState(0, 2, 10, 20, 600, env.importance, np.zeros(4, bool), env.blocks)
    obs, _ = env.reset(seed=0, options={"state": state})
    expect = {"log_batch": 1 / 8, "log_seq_len": math.log2(10) / 15, "kv_share": 400 / 1250,
              "available": 600 / 1250, "plan": 1.0, "excess": 650 / 1250, "importance": 0.25,
              "block_bytes": 300 / 1250, "is_mha": 1.0, "visited": 0.0, "dropped_frac": 0.0,
              "importance_lost": 0.0, "excess_if_drop": 350 / 1250, "droppable_after": 900 / 1250,
              "excess_if_keep": -250 / 1250}
    np.testing.assert_allclose(obs, [expect[k] for k in OBS_NAMES], rtol=1e-6, atol=1e-7)
    # drop mha:1: footprint 950 B, ppl 11 (GSI prefix); score before: 1 - 2 (650/1250 + 1)
    obs, reward, *_ , info = env.step(1)
    before = 1.0 - 2.0 * (650 / 1250 + 1)
    after = math.log(10) / math.log(11) - 2.0 * (350 / 1250 + 1)
    assert reward == pytest.approx(after - before)
    assert info["score"] == pytest.approx(after) and info["footprint_bytes"] == 950
    named = dict(zip(OBS_NAMES, obs))
    assert named["importance"] == pytest.approx(0.5) and named["is_mha"] == 0.0   # ffn:0 next
    assert named["plan"] == pytest.approx(0.76) and named["dropped_frac"] == pytest.approx(0.25)
    assert named["importance_lost"] == pytest.approx(0.25 / 2.5)
    # keeping changes nothing: reward 0
    _, reward, *_ = env.step(0)
    assert reward == 0.0
    # drop mha:0 -> 650 B, still 50 over; ffn:1 kept -> the episode ends violating
    *_, info = env.step(1)
    _, _, terminated, _, info = env.step(0)
    assert terminated and info["violation"] and info["excess_bytes"] == 50


def test_reward_sign_violation_and_quality():
    env = smol_env()
    rng = np.random.default_rng(7)
    state = env.sample_state(rng)
    state = AdaptState(0, state.batch, state.seq_len, state.kv_tokens,
                       int(0.7 * env.blocks.full_need_bytes(state.kv_tokens)), env.importance,
                       np.zeros(60, bool), env.blocks)
    order = np.argsort(env.importance)
    fp = [env.blocks.footprint_bytes(_prefix(order, k), state.kv_tokens) for k in range(61)]
    k_fit = next(k for k in range(61) if fp[k] <= state.available_bytes)
    fits = env.plan_score(state, _prefix(order, k_fit))
    short1 = env.plan_score(state, _prefix(order, k_fit - 1))
    short3 = env.plan_score(state, _prefix(order, k_fit - 3))
    assert not fits["violation"] and short1["violation"] and short3["violation"]
    assert fits["score"] > short1["score"] > short3["score"]        # more violation -> lower
    more = env.plan_score(state, _prefix(order, k_fit + 5))          # fits too, more quality lost
    assert not more["violation"] and more["quality_kept"] < fits["quality_kept"]
    assert fits["score"] > more["score"]                             # more quality -> higher
    # the same plans with beta = 0: only quality counts
    env0 = smol_env(beta=0.0)
    assert env0.plan_score(state, _prefix(order, k_fit - 1))["score"] > env0.plan_score(
        state, _prefix(order, k_fit))["score"]


def _prefix(order: np.ndarray, k: int) -> np.ndarray:
    d = np.zeros(len(order), bool)
    d[order[:k]] = True
    return d


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), actions=st.lists(st.integers(0, 1), min_size=60, max_size=60))
def test_rewards_telescope_to_the_final_score(seed, actions):
    env = smol_env()
    _, info = env.reset(seed=seed)
    start, total = info["score"], 0.0
    for a in actions:
        obs, r, terminated, _, info = env.step(a)
        assert env.observation_space.contains(obs)
        total += r
        if terminated:
            break
    assert terminated
    assert total == pytest.approx(info["score"] - start, abs=1e-9)
    assert info["score"] == pytest.approx(env.plan_score(env._state, info["dropped"])["score"])


def test_determinism_under_a_seed():
    def run(seed: int) -> tuple[list, list]:
        env = smol_env()
        obs, _ = env.reset(seed=seed)
        seen, rewards = [obs], []
        for k in range(60):
            obs, r, terminated, *_ = env.step(int(k % 3 == 0))
            seen.append(obs)
            rewards.append(r)
            if terminated:
                break
        return seen, rewards
    a, b = run(11), run(11)
    assert all(np.array_equal(x, y) for x, y in zip(a[0], b[0])) and a[1] == b[1]
    c = run(12)
    assert not np.array_equal(a[0][0], c[0][0])


def test_sampled_workloads_cover_the_ranges():
    env = smol_env()
    rng = np.random.default_rng(0)
    states = [env.sample_state(rng) for _ in range(400)]
    batches = [s.batch for s in states]
    seqs = [s.seq_len for s in states]
    frac = [s.available_bytes / env.blocks.full_need_bytes(s.kv_tokens) for s in states]
    assert min(batches) == 1 and max(batches) >= 28 and max(batches) <= 32
    assert min(seqs) < 100 and max(seqs) > 6000 and max(seqs) <= 8192
    assert 0.3 <= min(frac) < 0.35 and 0.95 < max(frac) < 1.0


def test_quality_kept_and_bad_arguments():
    assert quality_kept(math.log(27.0), math.log(27.0)) == 1.0
    assert quality_kept(math.inf, math.log(27.0)) == 0.0
    assert quality_kept(2 * math.log(27.0), math.log(27.0)) == pytest.approx(0.5)
    blocks, doc = tiny_blocks(), tiny_doc(steps=4)
    q = GsiPerplexity(doc, blocks.names)
    with pytest.raises(ValueError, match="importance"):
        RapEnv(blocks, np.ones(3), q)
    with pytest.raises(ValueError, match="alpha"):
        RapEnv(blocks, importance_vector(doc, blocks.names), q, beta=-1)
    with pytest.raises(ValueError, match="available_range"):
        RapEnv(blocks, importance_vector(doc, blocks.names), q, available_range=(0.9, 0.5))
    with pytest.raises(ValueError, match="available_range"):
        RapEnv(blocks, importance_vector(doc, blocks.names), q, available_range=(1.0, 1.2))
