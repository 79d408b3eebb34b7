"""Training of the learned RAP controller: a DQN in pure NumPy, and its weights file.

Owns: the Q-network's parameters, initialisation, backward pass and Adam update (`QNetwork`), the
replay buffer, the DQN loop over `adapt.env.RapEnv` (`train_dqn`), and writing the weights as
safetensors with metadata (`save_policy`, atomic). Inference is `adapt.controllers.learned`
(NumPy only), which reads the file this module writes.

Why NumPy and not torch: the network is tiny (15 -> 128 -> 128 -> 2, 18,818 parameters), so a
hand-written backward pass is ~40 lines; training then runs on a core install (torch is only in the
`real` extra), and training and inference share one forward pass (`learned.mlp_forward`), so the
Q-values the controller acts on are the ones the trainer optimised.

Checkpoint selection: every `eval_every` steps the greedy policy (without the safety rule) is
scored on `eval_points` validation decision points drawn from the training seed's own stream, and the
weights with the best mean validation score are the result. DQN's greedy policy moves from one
update to the next (measured: 0.80 -> 0.85 -> 0.80 mean score 17K steps apart), so the last weights are
a lottery ticket; the validation points are disjoint from the held-out points that `adapt train`
and the benchmark report (a different root seed).

Algorithm: double DQN (van Hasselt et al. 2016) with a replay buffer, a target network copied every
`target_every` updates, Huber loss, Adam, epsilon-greedy exploration decaying linearly from
`eps_start` to `eps_end` over `eps_fraction` of the steps, discount `gamma` (1.0: the episode is a
finite 2L-step pass and the env's rewards are potential-shaped, so the undiscounted return is the
episode's score minus a constant of the sampled workload). All randomness comes from one
`np.random.SeedSequence(seed)`: children for the network initialisation, exploration, replay
sampling, and the environment's episodes, so the same seed gives the same weights file, byte for byte
(on the same NumPy/BLAS build).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from adapt.controllers.learned import (
    PARAM_NAMES,
    WEIGHTS_FORMAT,
    mlp_forward,
    n_params,
    single_thread_blas,
)
from adapt.controllers.learned_obs import OBS_DIM, OBS_VERSION
from traces.outputs import replace_output


@dataclass(frozen=True)
class DqnConfig:
    """DQN hyper-parameters (defaults: what trained the shipped SmolLM2 weights)."""

    steps: int = 150_000           # environment steps (one keep/drop decision each)
    seed: int = 0
    hidden: tuple[int, int] = (128, 128)
    gamma: float = 1.0
    lr: float = 5e-4
    batch_size: int = 64
    buffer_size: int = 50_000
    learning_starts: int = 2_000   # steps of pure exploration before the first update
    train_every: int = 2           # env steps per gradient update
    target_every: int = 500        # gradient updates between target-network copies
    eps_start: float = 1.0
    eps_end: float = 0.02
    eps_fraction: float = 0.4
    explore_drop: float = 0.8      # P(drop) of an exploratory action: uniform random keeps among
                                   # the cheap blocks force the dear ones out later (disasters)
    huber_delta: float = 1.0
    eval_every: int = 0            # env steps between validation scores (0: steps // 20)
    eval_points: int = 200         # validation decision points (0: keep the last weights)

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if len(self.hidden) != 2 or min(self.hidden) < 1:
            raise ValueError(f"hidden must be two positive sizes, got {self.hidden}")
        if not 0 <= self.gamma <= 1:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")


# ---- network -------------------------------------------------------------------------------------
def init_params(rng: np.random.Generator, hidden: tuple[int, int]) -> dict[str, np.ndarray]:
    """He-uniform weights for the ReLU layers, small output layer, zero biases (float32)."""
    sizes = (OBS_DIM, *hidden, 2)
    params: dict[str, np.ndarray] = {}
    for k, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        limit = math.sqrt(6.0 / fan_in) * (0.1 if k == 2 else 1.0)
        params[f"w{k}"] = rng.uniform(-limit, limit, (fan_in, fan_out)).astype(np.float32)
        params[f"b{k}"] = np.zeros(fan_out, np.float32)
    return params


class QNetwork:
    """The parameters plus Adam state; `update` does one gradient step on a batch."""

    def __init__(self, params: dict[str, np.ndarray], lr: float, huber_delta: float):
        self.params = params
        self.lr, self.delta = lr, huber_delta
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}
        self.t = 0

    def update(self, x: np.ndarray, actions: np.ndarray, targets: np.ndarray) -> float:
        """One Adam step on the Huber loss of Q(x, a) vs targets; returns the mean loss before it."""
        loss, grads = self.gradients(x, actions, targets)
        self.t += 1
        b1, b2, eps = 0.9, 0.999, 1e-8
        corr = math.sqrt(1 - b2**self.t) / (1 - b1**self.t)
        for k in PARAM_NAMES:
            g = grads[k].astype(np.float32)
            self.m[k] = b1 * self.m[k] + (1 - b1) * g
            self.v[k] = b2 * self.v[k] + (1 - b2) * g * g
            self.params[k] -= (self.lr * corr * self.m[k] / (np.sqrt(self.v[k]) + eps)).astype(np.float32)
        return loss

    def gradients(self, x: np.ndarray, actions: np.ndarray,
                  targets: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
        """(mean Huber loss, its gradient for every parameter): the backward pass by hand."""
        p = self.params
        z0 = x @ p["w0"] + p["b0"]
        h0 = np.maximum(z0, 0.0)
        z1 = h0 @ p["w1"] + p["b1"]
        h1 = np.maximum(z1, 0.0)
        q = h1 @ p["w2"] + p["b2"]
        rows = np.arange(len(x))
        err = q[rows, actions] - targets
        abs_err = np.abs(err)
        loss = float(np.where(abs_err <= self.delta, 0.5 * err**2,
                              self.delta * (abs_err - 0.5 * self.delta)).mean())
        dq = np.zeros_like(q)
        dq[rows, actions] = np.clip(err, -self.delta, self.delta) / len(x)
        grads = {"w2": h1.T @ dq, "b2": dq.sum(0)}
        dh1 = (dq @ p["w2"].T) * (z1 > 0)
        grads["w1"], grads["b1"] = h0.T @ dh1, dh1.sum(0)
        dh0 = (dh1 @ p["w1"].T) * (z0 > 0)
        grads["w0"], grads["b0"] = x.T @ dh0, dh0.sum(0)
        return loss, grads


# ---- DQN -----------------------------------------------------------------------------------------
@dataclass
class TrainResult:
    params: dict[str, np.ndarray]
    config: DqnConfig
    episodes: int
    updates: int
    seconds: float
    mean_score_last: float          # mean episode score over the last 10% of episodes
    history: list[tuple[int, float]]  # (env step, mean score of the episodes since the last entry)
    best_step: int = 0              # env step of the selected weights (0: none selected)
    best_validation: float = float("nan")
    validation: list[tuple[int, float]] = field(default_factory=list)  # (env step, mean score)
    visit: str = "importance"       # the env's visiting order, which the policy is only valid for


def validation_score(env, params: dict[str, np.ndarray], states: list) -> float:
    """Mean episode score of the greedy policy over decision points, without the safety rule (so a
    policy that leans on the rule is not selected: its violations cost it beta each)."""
    from adapt.controllers.learned import CompiledPolicy, decide_pass
    from adapt.controllers.learned_obs import pass_context

    policy = CompiledPolicy.from_params(params)
    total = 0.0
    for s in states:
        total += env.plan_score(s, decide_pass(policy, pass_context(s, env.visit)))["score"]
    return total / max(len(states), 1)


def train_dqn(env, config: DqnConfig,
              progress: Callable[[int, float], None] | None = None,
              callback: Callable[[int, dict[str, np.ndarray]], None] | None = None,
              callback_every: int = 0) -> TrainResult:
    """Train a Q-network on `env` (a adapt.env.RapEnv); deterministic given config.seed.

    `callback(step, params)` is called every `callback_every` env steps (benchmarks evaluate the
    policy there); `progress(step, mean_score)` about 20 times over the run."""
    with single_thread_blas():
        return _train_dqn(env, config, progress, callback, callback_every)


def _train_dqn(env, config: DqnConfig, progress: Callable[[int, float], None] | None,
               callback: Callable[[int, dict[str, np.ndarray]], None] | None,
               callback_every: int) -> TrainResult:
    t0 = time.perf_counter()
    ss = np.random.SeedSequence(config.seed)
    init_ss, explore_ss, replay_ss, env_ss, valid_ss = ss.spawn(5)
    valid_rng = np.random.default_rng(valid_ss)
    valid_states = [env.sample_state(valid_rng) for _ in range(config.eval_points)]
    eval_every = config.eval_every or max(1, config.steps // 20)
    best_params: dict[str, np.ndarray] | None = None
    best_step, best_valid = 0, -math.inf
    validation: list[tuple[int, float]] = []
    rng_explore = np.random.default_rng(explore_ss)
    rng_replay = np.random.default_rng(replay_ss)
    net = QNetwork(init_params(np.random.default_rng(init_ss), config.hidden), config.lr,
                   config.huber_delta)
    target = {k: v.copy() for k, v in net.params.items()}
    cap = min(config.buffer_size, config.steps)
    obs_buf = np.zeros((cap, OBS_DIM), np.float32)
    next_buf = np.zeros((cap, OBS_DIM), np.float32)
    act_buf = np.zeros(cap, np.int64)
    rew_buf = np.zeros(cap, np.float32)
    done_buf = np.zeros(cap, np.float32)
    episode_seeds = iter(np.random.default_rng(env_ss).integers(0, 2**31 - 1, size=config.steps + 1))
    obs, _ = env.reset(seed=int(next(episode_seeds)))
    scores: list[float] = []
    history: list[tuple[int, float]] = []
    report_every = max(1, config.steps // 20)
    since_report: list[float] = []
    updates = 0
    eps_steps = max(1, int(config.eps_fraction * config.steps))
    for step in range(config.steps):
        eps = config.eps_end + (config.eps_start - config.eps_end) * max(0.0, 1 - step / eps_steps)
        if rng_explore.random() < eps:
            action = int(rng_explore.random() < config.explore_drop)
        else:
            q = mlp_forward(net.params, obs[None, :])[0]
            action = int(q[1] > q[0])
        next_obs, reward, terminated, truncated, info = env.step(action)
        i = step % cap
        obs_buf[i], act_buf[i], rew_buf[i], next_buf[i] = obs, action, reward, next_obs
        done_buf[i] = float(terminated)
        if terminated or truncated:
            scores.append(float(info["score"]))
            since_report.append(float(info["score"]))
            obs, _ = env.reset(seed=int(next(episode_seeds)))
        else:
            obs = next_obs
        if step >= config.learning_starts and step % config.train_every == 0:
            idx = rng_replay.integers(0, min(step + 1, cap), size=config.batch_size)
            q_next_online = mlp_forward(net.params, next_buf[idx])
            q_next_target = mlp_forward(target, next_buf[idx])
            a_next = np.argmax(q_next_online, axis=1)
            y = rew_buf[idx] + config.gamma * (1.0 - done_buf[idx]) * q_next_target[np.arange(len(idx)), a_next]
            net.update(obs_buf[idx], act_buf[idx], y.astype(np.float32))
            updates += 1
            if updates % config.target_every == 0:
                target = {k: v.copy() for k, v in net.params.items()}
        if (step + 1) % report_every == 0:
            mean = float(np.mean(since_report)) if since_report else float("nan")
            history.append((step + 1, mean))
            since_report = []
            if progress:
                progress(step + 1, mean)
        if valid_states and updates and ((step + 1) % eval_every == 0 or step + 1 == config.steps):
            v = validation_score(env, net.params, valid_states)
            validation.append((step + 1, v))
            if v > best_valid:
                best_valid, best_step = v, step + 1
                best_params = {k: a.copy() for k, a in net.params.items()}
        if callback and callback_every and (step + 1) % callback_every == 0:
            callback(step + 1, net.params)
    tail = scores[-max(1, len(scores) // 10):] if scores else [float("nan")]
    params = best_params if best_params is not None else net.params
    return TrainResult(params, config, len(scores), updates, time.perf_counter() - t0,
                       float(np.mean(tail)), history, best_step,
                       best_valid if best_params is not None else float("nan"), validation,
                       env.visit)


# ---- weights file --------------------------------------------------------------------------------
def policy_metadata(result: TrainResult, *, alpha: float, beta: float, model: str,
                    gsi_sha256: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The metadata strings stored with the weights (no timings: same seed -> same file)."""
    c = result.config
    meta = {
        "format": WEIGHTS_FORMAT,
        "obs_version": str(OBS_VERSION),
        "obs_dim": str(OBS_DIM),
        "hidden": ",".join(str(h) for h in c.hidden),
        "n_params": str(n_params(result.params)),
        "alpha": repr(float(alpha)),
        "beta": repr(float(beta)),
        "seed": str(c.seed),
        "train_steps": str(c.steps),
        "updates": str(result.updates),
        "episodes": str(result.episodes),
        "selected_step": str(result.best_step),
        "validation_score": repr(result.best_validation),
        "model": model,
        "visit": result.visit,
        "gsi_sha256": gsi_sha256,
        "dqn": json.dumps({k: v for k, v in asdict(c).items() if k not in ("steps", "seed")},
                          sort_keys=True),
    }
    meta.update(extra or {})
    return meta


def safetensors_bytes(tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> bytes:
    """float32 tensors + string metadata in the safetensors format, byte-deterministic.

    (`safetensors.numpy.save` passes the metadata through a Rust HashMap, whose order changes from one
    process to the next, so the same weights gave different bytes.) Format: an 8-byte little-endian
    header length, a JSON header {"__metadata__": {...}, name: {"dtype": "F32", "shape": [...],
    "data_offsets": [begin, end]}} with sorted keys, padded with spaces to a multiple of 8 bytes, then
    the tensors' little-endian bytes in name order. `safetensors.safe_open` reads it (tested)."""
    header: dict[str, object] = {"__metadata__": {k: str(v) for k, v in sorted(metadata.items())}}
    blobs, offset = [], 0
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name], "<f4")
        blobs.append(arr.tobytes())
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + b"".join(blobs)


def save_policy(path: str | Path, params: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    """Write the weights as safetensors, atomically (temporary name in the folder, then os.replace)."""
    path = Path(path)
    data = safetensors_bytes({k: params[k] for k in PARAM_NAMES}, metadata)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_bytes(data)
        replace_output(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
