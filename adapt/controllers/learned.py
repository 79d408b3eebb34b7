"""The learned RAP controller: the MLP's forward pass, the decision pass and the weights file.

Owns: the NumPy forward pass of the Q-network (`mlp_forward`), the weights file reader
(`load_policy`), and `LearnedController`, which implements adapt.controllers.base.Controller. It
needs NumPy and safetensors only: no torch, no gymnasium (training lives in adapt/train.py and the
environment in adapt/env.py; both import this module, never the other way round).

Decision pass (RAP's "sequential single-block decisions"): the blocks are visited in a fixed order,
ascending importance per byte the block frees ("per-byte": weights + KV at the current KV entries) or
ascending importance ("importance"), ties to the lower block index; the weights file says which
(metadata `visit`; "importance" when absent). For block i the Q-network scores keep (action 0) and drop
(action 1) from its observation (adapt/controllers/learned_obs.py: 15 entries, scale-free) and
the larger wins (ties: keep). The pass stops as soon as
the plan fits the available memory, keeping every block not yet visited (a block dropped beyond the
budget buys nothing and costs quality; with nothing to drop the network is not run at all). The
controller is stateless: each decision point plans from scratch, so blocks come back by themselves
when memory returns.

Safety rule (documented in docs/adapt.md): if the plan still exceeds `available_bytes`
after the pass, the controller drops the kept blocks in ascending importance until it fits (or
nothing is left to drop). `LearnedController.safety_fired` counts the decisions where it acted.

Weights file (safetensors, written by adapt/train.py): tensors w0 [15, h0], b0 [h0], w1 [h0, h1],
b1 [h1], w2 [h1, 2], b2 [2] (float32, ReLU between layers, Q-values out); metadata (strings):
format = "flashsim-rap-dqn", obs_version, obs_dim, hidden (e.g. "128,128"), n_params, alpha, beta,
seed, train_steps, updates, episodes, selected_step, validation_score, model, visit, gsi_sha256, dqn
(the other hyper-parameters as JSON). Written by hand in the safetensors layout with sorted keys so
the same training writes the same bytes (adapt/train.py: safetensors_bytes).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from adapt.controllers.base import AdaptState
from adapt.controllers.learned_obs import (
    OBS_DIM,
    OBS_VERSION,
    VISITS,
    PassContext,
    observations,
    pass_context,
)
from devices.errors import FlashsimError

WEIGHTS_FORMAT = "flashsim-rap-dqn"
PARAM_NAMES = ("w0", "b0", "w1", "b1", "w2", "b2")
KEEP, DROP = 0, 1
# Keep-runs (blocks the policy skips) are short; scoring 8 positions ahead instead of all the rest
# halves the rows a decision computes (measured on the trained SmolLM2 policy) at the price of an
# extra round for the rare longer run.
KEEP_CHUNK = 8


def mlp_forward(params: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """Q-values [k, 2] of observations x [k, OBS_DIM] (float32; ReLU hidden layers)."""
    h = np.maximum(x @ params["w0"] + params["b0"], 0.0)
    h = np.maximum(h @ params["w1"] + params["b1"], 0.0)
    return h @ params["w2"] + params["b2"]


@dataclass(frozen=True, eq=False)
class CompiledPolicy:
    """The network rearranged for `decide_pass`: the first layer is affine in the dynamic state,
    x @ w0 + b0 = base(p) @ w0 + b0 + plan * u + n_dropped * v + importance_lost * w, and the drop/keep
    choice needs only the difference of the two outputs, h1 @ dq + db > 0."""

    w0: np.ndarray
    b0: np.ndarray
    u: np.ndarray
    v_per_block: np.ndarray     # divide by 2L for v
    w: np.ndarray
    w1: np.ndarray
    b1: np.ndarray
    dq: np.ndarray
    db: float
    _uvw: dict[int, np.ndarray] = field(default_factory=dict)

    def uvw(self, n_blocks: int) -> np.ndarray:
        """[3, h0]: u, v, w stacked (v depends on the block count)."""
        if n_blocks not in self._uvw:
            self._uvw[n_blocks] = np.stack([self.u, self.v_per_block / n_blocks, self.w])
        return self._uvw[n_blocks]

    @classmethod
    def from_params(cls, params: dict[str, np.ndarray]) -> CompiledPolicy:
        w0 = params["w0"].astype(np.float64)
        w2, b2 = params["w2"], params["b2"]
        return cls(w0, params["b0"].astype(np.float64), w0[4] + w0[5] + w0[12] + w0[14], w0[10], w0[11],
                   params["w1"], params["b1"], (w2[:, DROP] - w2[:, KEEP]).astype(np.float32),
                   float(b2[DROP]) - float(b2[KEEP]))


def decide_pass(policy: CompiledPolicy | dict[str, np.ndarray], ctx: PassContext) -> np.ndarray:
    """The dropped mask of `run_pass` (see there)."""
    return run_pass(policy, ctx)[0]


def run_pass(policy: CompiledPolicy | dict[str, np.ndarray], ctx: PassContext) -> tuple[np.ndarray, int]:
    """The sequential keep/drop pass: (bool [2L] dropped mask in block-index order, footprint bytes
    of that plan). The pass stops as soon as the plan fits `available_bytes`: every block not yet
    visited is kept (the environment ends its episode there too). Same choices as `decide_sequential` (up to float
    rounding of the factored first layer), computed in rounds: from position p, with the true state,
    a round scores the positions ahead under one hypothesis, "the pass keeps choosing c" (c = the
    latest choice; drop at the start), in one batched forward pass: up to the position where dropping
    them all would fit, or to the end for keeps. The choices follow the hypothesis up to and including
    the first position that chooses otherwise, whose row is exact too (every block before it followed
    the hypothesis), so a round commits at least one position and usually a whole run."""
    cp = policy if isinstance(policy, CompiledPolicy) else CompiledPolicy.from_params(policy)
    n, full, avail = ctx.n_blocks, ctx.full_bytes, ctx.available_bytes
    choice = np.zeros(n, bool)     # in visiting order
    plan_bytes, n_drop, lost = full, 0, 0.0
    if plan_bytes <= avail:
        return choice, plan_bytes
    # Rows of the observation with every dynamic entry 0 (first layer: x @ w0 = base @ w0 + dynamic);
    # only the rows a round scores are multiplied (a drop-run usually ends, fitting, within ~25 of 2L)
    base = ctx.static.copy()
    base[:, 5] = -ctx.available_frac
    base[:, 12] = -ctx.available_frac - ctx.block_frac
    base[:, 14] = -ctx.available_frac - ctx.after_frac
    # Prefix sums over the visiting order: bytes (inclusive, int), and for "every block before j
    # dropped" (exclusive) the inputs of G[j] = -bytes_before_j / full * u + j * v + imp_before_j * w;
    # a drop-run from p reaches row j with G[j] - G[p] on top of p's state.
    cum_bytes = np.cumsum(ctx.block_bytes)
    before = np.empty((n, 3))
    before[:, 0] = (cum_bytes - ctx.block_bytes) / -full
    before[:, 1] = np.arange(n)
    before[:, 2] = np.cumsum(ctx.imp_frac) - ctx.imp_frac
    v = cp.v_per_block / n
    uvw = cp.uvw(n)
    p, hyp = 0, True
    while p < n and plan_bytes > avail:
        state = plan_bytes / full * cp.u + n_drop * v + lost * cp.w
        if hyp:
            done_before = int(cum_bytes[p] - ctx.block_bytes[p])
            fit = int(np.searchsorted(cum_bytes, plan_bytes - avail + done_before))  # fits after it
            end = min(fit + 1, n)
            h = (base[p:end] @ cp.w0 + (before[p:end] - before[p]) @ uvw) + (cp.b0 + state)
        else:
            end = min(n, p + KEEP_CHUNK)
            h = base[p:end] @ cp.w0 + (cp.b0 + state)
        h = np.maximum(h.astype(np.float32), 0.0)
        h = np.maximum(h @ cp.w1 + cp.b1, 0.0)
        match = (h @ cp.dq + cp.db > 0) == hyp
        stop = len(match) if match.all() else int(np.argmin(match))
        choice[p:p + stop] = hyp
        if hyp and stop:
            plan_bytes -= int(cum_bytes[p + stop - 1] - cum_bytes[p] + ctx.block_bytes[p])
            lost += float(ctx.imp_frac[p:p + stop].sum())
            n_drop += stop
        p += stop
        if stop < len(match):                                  # position p chose against the run
            hyp = not hyp
            choice[p] = hyp
            if hyp:
                plan_bytes -= int(ctx.block_bytes[p])
                lost += float(ctx.imp_frac[p])
                n_drop += 1
            p += 1
    dropped = np.zeros(n, bool)
    dropped[ctx.order[choice]] = True
    return dropped, plan_bytes


def decide_sequential(params: dict[str, np.ndarray], ctx: PassContext) -> np.ndarray:
    """Reference: the same pass one block at a time (one single-row forward pass per position)."""
    n = ctx.n_blocks
    choice = np.zeros(n, bool)
    plan_bytes, n_drop, lost = ctx.full_bytes, 0, 0.0
    for p in range(n):
        if plan_bytes <= ctx.available_bytes:
            break
        x = observations(ctx, np.array([p]), np.array([plan_bytes / ctx.full_bytes]),
                         np.array([n_drop]), np.array([lost]))
        q = mlp_forward(params, x)[0]
        if q[DROP] > q[KEEP]:
            choice[p] = True
            plan_bytes -= int(ctx.block_bytes[p])
            lost += float(ctx.imp_frac[p])
            n_drop += 1
    dropped = np.zeros(n, bool)
    dropped[ctx.order[choice]] = True
    return dropped


def _openblas_threads() -> tuple[object, object] | None:
    """(get, set) of the OpenBLAS that NumPy loaded, or None (another BLAS, or not Linux)."""
    import ctypes

    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            libs = sorted({ln.split()[-1] for ln in f if "openblas" in ln.lower() and "/" in ln})
    except OSError:
        return None
    for path in libs:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix, suffix in (("scipy_openblas", "64_"), ("scipy_openblas", ""), ("openblas", "64_"),
                               ("openblas", "")):
            get = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
            put = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
            if get is not None and put is not None:
                return get, put
    return None


_BLAS: list[tuple[object, object] | None] = []


@contextlib.contextmanager
def single_thread_blas() -> Iterator[None]:
    """Run NumPy's OpenBLAS on one thread inside the block, then restore its thread count.

    The policy's matrices are tiny (at most 128 x 128 times a batch of 64-120 rows): handing them to
    BLAS threads costs more than it saves, and on a shared, oversubscribed CPU the spinning threads
    made training 5x slower (measured: 16.9 s vs 3.4 s for 6,000 DQN steps at load 16 on 2 cores).
    A no-op when NumPy uses another BLAS."""
    if not _BLAS:
        _BLAS.append(_openblas_threads())
    fns = _BLAS[0]
    if fns is None:
        yield
        return
    get, put = fns
    before = int(get())  # type: ignore[operator]
    put(1)  # type: ignore[operator]
    try:
        yield
    finally:
        put(before)  # type: ignore[operator]


def n_params(params: dict[str, np.ndarray]) -> int:
    return int(sum(params[k].size for k in PARAM_NAMES))


def apply_safety(state: AdaptState, dropped: np.ndarray) -> tuple[np.ndarray, bool]:
    """Drop kept blocks in ascending importance until the footprint fits `available_bytes`."""
    blocks = state.blocks
    if blocks.footprint_bytes(dropped, state.kv_tokens) <= state.available_bytes:
        return dropped, False
    out = dropped.copy()
    imp = np.asarray(state.importance, np.float64)
    order = np.lexsort((np.arange(len(imp)), imp))
    bytes_each = blocks.weight_bytes + blocks.kv_bytes_per_token * int(state.kv_tokens)
    excess = blocks.footprint_bytes(out, state.kv_tokens) - state.available_bytes
    for i in order:
        if excess <= 0:
            break
        if not out[i]:
            out[i] = True
            excess -= int(bytes_each[i])
    return out, True


@dataclass(frozen=True)
class PolicyFile:
    params: dict[str, np.ndarray]
    metadata: dict[str, str]


def load_policy(path: str | Path) -> PolicyFile:
    """Read a weights file written by adapt/train.py; FlashsimError naming what is wrong."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_file():
        raise FlashsimError(f"{path}: no such learned-controller weights file "
                            "(write one with `flashsim adapt train --out FILE.safetensors`)")
    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = dict(f.metadata() or {})
            params = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not a dict)
    except (SafetensorError, OSError, ValueError) as e:
        raise FlashsimError(f"{path}: not a safetensors file ({e})") from None
    if meta.get("format") != WEIGHTS_FORMAT:
        raise FlashsimError(f"{path}: metadata 'format' is {meta.get('format')!r}, expected "
                            f"{WEIGHTS_FORMAT!r} (a file from `flashsim adapt train`)")
    if meta.get("obs_version") != str(OBS_VERSION):
        raise FlashsimError(f"{path}: observation layout version {meta.get('obs_version')!r}, this "
                            f"flashsim reads {OBS_VERSION}; retrain with `flashsim adapt train`")
    if meta.get("visit", "importance") not in VISITS:
        raise FlashsimError(f"{path}: metadata 'visit' is {meta.get('visit')!r}, expected one of "
                            f"{', '.join(VISITS)}")
    missing = [k for k in PARAM_NAMES if k not in params]
    if missing:
        raise FlashsimError(f"{path}: tensor {missing[0]!r} is missing (expected {', '.join(PARAM_NAMES)})")
    p = {k: np.ascontiguousarray(params[k], np.float32) for k in PARAM_NAMES}
    h0, h1 = p["w0"].shape[1], p["w1"].shape[1]
    shapes = {"w0": (OBS_DIM, h0), "b0": (h0,), "w1": (h0, h1), "b1": (h1,), "w2": (h1, 2), "b2": (2,)}
    for k, shape in shapes.items():
        if p[k].shape != shape:
            raise FlashsimError(f"{path}: tensor {k!r} has shape {p[k].shape}, expected {shape}")
    if not all(np.isfinite(p[k]).all() for k in PARAM_NAMES):
        raise FlashsimError(f"{path}: the weights contain NaN or infinity")
    return PolicyFile(p, meta)


def default_weights_path(model: str = "smollm2-135m") -> Path:
    """The shipped weights for `model` (adapt/data/learned-<model>.safetensors)."""
    return Path(__file__).resolve().parent.parent / "data" / f"learned-{model}.safetensors"


@dataclass
class LearnedController:
    """A DQN policy trained by `flashsim adapt train`; stateless across decision points."""

    weights: str | Path | None = None
    safety: bool = True
    name: str = "learned"
    policy: PolicyFile = field(init=False, repr=False)
    compiled: CompiledPolicy = field(init=False, repr=False)
    visit: str = field(default="importance", init=False)      # from the file's metadata
    decisions: int = field(default=0, init=False)
    safety_fired: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.policy = load_policy(self.weights if self.weights is not None else default_weights_path())
        self.compiled = CompiledPolicy.from_params(self.policy.params)
        self.visit = self.policy.metadata.get("visit", "importance")

    def reset(self) -> None:
        self.decisions = 0
        self.safety_fired = 0

    def decide(self, state: AdaptState) -> np.ndarray:
        fns = _BLAS[0] if _BLAS else None
        if fns is None:
            with single_thread_blas():
                dropped, plan_bytes = run_pass(self.compiled, pass_context(state, self.visit))
        else:  # the same as single_thread_blas(), without a generator's overhead (~5 us)
            get, put = fns
            before = int(get())  # type: ignore[operator]
            put(1)  # type: ignore[operator]
            try:
                dropped, plan_bytes = run_pass(self.compiled, pass_context(state, self.visit))
            finally:
                put(before)  # type: ignore[operator]
        self.decisions += 1
        if self.safety and plan_bytes > state.available_bytes:
            dropped, fired = apply_safety(state, dropped)
            self.safety_fired += int(fired)
        return dropped
