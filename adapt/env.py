"""The Gymnasium environment in which the learned RAP controller is trained (issue 7, RAP).

Owns: `RapEnv`, a `gymnasium.Env` whose episode is one decision point of a controller: a sampled
workload (batch, sequence length) and memory budget, then up to 2L sequential keep/drop decisions, one
per block, in the visiting order of `adapt.controllers.learned_obs.visiting_order` (`visit`:
ascending importance, the default, or ascending importance per byte freed). Bytes come from
`sim.blocks.BlockMemory`, importances from a GSI file (`adapt.importance.importance_vector`), quality from a perplexity estimate
(`adapt.drop_quality.GsiPerplexity`, or any object with `log_ppl(dropped) -> float`).

Observation: float32 [15], the layout of `adapt.controllers.learned_obs` (`OBS_NAMES`, documented
there): batch, sequence length, KV share, available memory, the footprint of the current plan and the
memory estimate of each action, the block's importance, bytes and kind, progress. All sizes are
fractions of the full need, so the same policy works for any layer count. Action: Discrete(2),
0 = keep the block, 1 = drop it. The episode terminates (never truncates) as soon as the plan fits
the budget (the blocks not visited are kept, as the controller's pass does) or after the last block.

Reward (per episode, the "score"; α = `alpha`, β = `beta`):

    score(D)      = α · quality_kept(D) − β · memory_penalty(D)
    quality_kept  = log(dense ppl) / log(ppl(D))       1 with nothing dropped, → 0 as ppl → ∞
                    (the log-ppl estimate; a ratio of logs, not of perplexities, so a budget that
                    forces heavy pruning still ranks plans instead of rounding them all to 0)
    memory_penalty= excess / full_need + [excess > 0], excess = max(0, footprint(D) − available)
                    (the indicator makes any violation cost β at least, more than the whole quality
                    range when β ≥ α, so a feasible plan always scores higher than a violating one)

D is the plan: the blocks decided "drop" so far (blocks not yet visited count as kept). The reward
of a step is the change it makes, score(D after) − score(D before) (potential-based shaping: the
undiscounted return of an episode is score(final D) − score(nothing dropped), the same optimal policy
as scoring only the end, with credit where it is due). `info["score"]` at the last step is the
episode's score(D); `info` also carries quality_kept, violation, excess_bytes and the dropped mask.

Episode sampling (from `np_random`, seeded by `reset(seed=...)`): batch log-uniform in `batch_range`,
sequence length log-uniform in `seq_len_range`, KV entries = batch × seq_len, available memory =
U(`available_range`) × full need at those KV entries, redrawn while it already fits (a decision
point with nothing to drop has no decision to learn). The defaults cover weight-bound (batch 1 × 64
tokens: KV is 0.5% of SmolLM2-135M's need) to KV-bound (32 × 8192 tokens: 96%) workloads and budgets
from 30% (for SmolLM2 still feasible: its never-dropped embeddings are 21% of the weight-bound need,
but almost every block must go) to 100%.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np

from adapt.controllers.base import AdaptState
from adapt.controllers.learned_obs import OBS_BOUND, OBS_DIM, VISITS, observations, pass_context
from sim.blocks import BlockMemory

DEFAULT_ALPHA = 1.0
DEFAULT_BETA = 1.0       # >= alpha: a violation (>= beta) outweighs the whole quality range [0, 1]
DEFAULT_BATCH_RANGE = (1, 32)
DEFAULT_SEQ_LEN_RANGE = (64, 8192)      # SmolLM2's context window is 8192 tokens
DEFAULT_AVAILABLE_RANGE = (0.3, 1.0)


def quality_kept(log_ppl: float, log_dense: float) -> float:
    """log(dense ppl) / log(ppl): 1 with nothing lost, 0 for an infinite perplexity."""
    if not math.isfinite(log_ppl):
        return 0.0
    return log_dense / log_ppl if log_ppl > 0 else 1.0


class RapEnv(gym.Env):
    """One controller decision point per episode: 2L keep/drop decisions (see the module docstring)."""

    metadata = {"render_modes": []}

    def __init__(self, blocks: BlockMemory, importance: np.ndarray, quality: Any, *,
                 alpha: float = DEFAULT_ALPHA, beta: float = DEFAULT_BETA,
                 batch_range: tuple[int, int] = DEFAULT_BATCH_RANGE,
                 seq_len_range: tuple[int, int] = DEFAULT_SEQ_LEN_RANGE,
                 available_range: tuple[float, float] = DEFAULT_AVAILABLE_RANGE,
                 visit: str = "importance"):
        """ValueError for an importance of the wrong shape, negative α/β or an empty range."""
        super().__init__()
        n = len(blocks.names)
        importance = np.asarray(importance, np.float64)
        if importance.shape != (n,):
            raise ValueError(f"importance must have shape ({n},), got {importance.shape}")
        if alpha < 0 or beta < 0:
            raise ValueError(f"alpha and beta must be >= 0, got {alpha}, {beta}")
        for name, (lo, hi) in (("batch_range", batch_range), ("seq_len_range", seq_len_range),
                               ("available_range", available_range)):
            if not 0 < lo <= hi:
                raise ValueError(f"{name} must be 0 < low <= high, got {(lo, hi)}")
        if available_range[0] >= 1:
            raise ValueError(f"available_range must start below 1 (a budget that fits has nothing to "
                             f"decide), got {available_range}")
        self.blocks, self.importance, self.quality = blocks, importance, quality
        self.alpha, self.beta = float(alpha), float(beta)
        self.batch_range, self.seq_len_range = batch_range, seq_len_range
        self.available_range = available_range
        if visit not in VISITS:
            raise ValueError(f"visit must be one of {VISITS}, got {visit!r}")
        self.visit = visit
        self.log_dense = float(quality.log_ppl(np.zeros(n, bool)))
        self.n_blocks = n
        self.observation_space = gym.spaces.Box(-OBS_BOUND, OBS_BOUND, (OBS_DIM,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._state: AdaptState | None = None

    # ---- episode ----
    def sample_state(self, rng: np.random.Generator) -> AdaptState:
        """A workload and budget drawn as the module docstring says."""
        lo, hi = self.batch_range
        batch = int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))
        lo, hi = self.seq_len_range
        seq_len = int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))
        kv_tokens = batch * seq_len
        full = self.blocks.full_need_bytes(kv_tokens)
        available = full
        while available >= full:
            available = int(rng.uniform(*self.available_range) * full)
        n = self.n_blocks
        return AdaptState(0, batch, seq_len, kv_tokens, available, self.importance, np.zeros(n, bool),
                          self.blocks)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """options={"state": AdaptState} replays a given decision point instead of sampling one."""
        super().reset(seed=seed)
        state = (options or {}).get("state")
        if state is None:
            state = self.sample_state(self.np_random)
        elif state.blocks.full_need_bytes(state.kv_tokens) <= state.available_bytes:
            raise ValueError("options['state'] already fits its budget: there is nothing to decide")
        self._begin(state)
        return self._obs(), self._info()

    def _begin(self, state: AdaptState) -> None:
        self._state = state
        self._ctx = pass_context(state, self.visit)
        self._bytes_in_order = self._ctx.block_bytes
        self._full_bytes = self._ctx.full_bytes
        self._plan_bytes = self._full_bytes
        self._pos, self._n_drop, self._lost, self._done = 0, 0, 0.0, False
        self._dropped = np.zeros(self.n_blocks, bool)
        self._score = self.score(dropped=self._dropped, footprint_bytes=self._plan_bytes,
                                 available_bytes=int(state.available_bytes), full_bytes=self._full_bytes)

    def score(self, *, dropped: np.ndarray, footprint_bytes: int, available_bytes: int,
              full_bytes: int) -> float:
        """α · quality_kept − β · memory_penalty of a plan (module docstring)."""
        q = quality_kept(self.quality.log_ppl(dropped), self.log_dense)
        excess = max(0, footprint_bytes - available_bytes)
        penalty = excess / full_bytes + (1.0 if excess > 0 else 0.0)
        return self.alpha * q - self.beta * penalty

    def step(self, action: int):
        if self._state is None or self._done:
            raise RuntimeError("call reset() before step() (the episode is over)")
        if not self.action_space.contains(action):
            raise ValueError(f"action must be 0 (keep) or 1 (drop), got {action!r}")
        p = self._pos
        if int(action) == 1:
            self._dropped[self._ctx.order[p]] = True
            self._plan_bytes -= int(self._bytes_in_order[p])
            self._lost += float(self._ctx.imp_frac[p])
            self._n_drop += 1
        self._pos += 1
        before = self._score
        if int(action) == 1:
            self._score = self.score(dropped=self._dropped, footprint_bytes=self._plan_bytes,
                                     available_bytes=int(self._state.available_bytes),
                                     full_bytes=self._full_bytes)
        reward = self._score - before
        terminated = self._done = (self._pos >= self.n_blocks
                                   or self._plan_bytes <= int(self._state.available_bytes))
        obs = self._obs() if not terminated else np.zeros(OBS_DIM, np.float32)
        return obs, float(reward), terminated, False, self._info()

    def _obs(self) -> np.ndarray:
        if self._done:
            return np.zeros(OBS_DIM, np.float32)
        plan = self._plan_bytes / self._full_bytes
        return observations(self._ctx, np.array([self._pos]), np.array([plan]),
                            np.array([self._n_drop]), np.array([self._lost]))[0]

    def _info(self) -> dict[str, Any]:
        assert self._state is not None
        excess = max(0, self._plan_bytes - int(self._state.available_bytes))
        return {
            "score": self._score,
            "quality_kept": quality_kept(self.quality.log_ppl(self._dropped), self.log_dense),
            "violation": excess > 0,
            "excess_bytes": excess,
            "footprint_bytes": self._plan_bytes,
            "available_bytes": int(self._state.available_bytes),
            "dropped": self._dropped.copy(),
            "position": self._pos,
        }

    # ---- evaluation helpers ----
    def plan_score(self, state: AdaptState, dropped: np.ndarray) -> dict[str, Any]:
        """Score any controller's dropped mask at a decision point (same formula as the episode)."""
        footprint = int(state.blocks.footprint_bytes(dropped, state.kv_tokens))
        log_ppl = float(self.quality.log_ppl(dropped))
        excess = max(0, footprint - int(state.available_bytes))
        full = int(state.blocks.full_need_bytes(state.kv_tokens))
        return {"score": self.score(dropped=dropped, footprint_bytes=footprint,
                                    available_bytes=int(state.available_bytes), full_bytes=full),
                "quality_kept": quality_kept(log_ppl, self.log_dense),
                "log_ppl": log_ppl, "violation": excess > 0, "excess_bytes": excess,
                "n_dropped": int(np.count_nonzero(dropped))}
