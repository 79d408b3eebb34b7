"""The low-rank activation predictor of LLM in a flash (Alizadeh et al. 2024, section 3.1), per layer:
FFN input x (the hidden state after the post-attention norm, [d_model]) -> p = sigmoid(x A B + b),
and neuron n is predicted active when p_n >= `threshold`. A is [d_model, r], B is [r, d_ff], b is a
per-neuron bias [d_ff] (initialised to the log-odds of each neuron's training activity rate, so an
untrained predictor already predicts the base rate). Units: activations and weights are fp32.

Labels: a neuron is active when |act(gate x) * (up x)| passes the sparsity rule the traces use
(`traces.sparsity`: relu / threshold:F with one |a| threshold per layer calibrated on the TRAINING
tokens / topk:F per token; default `traces.capture.assemble.default_rule`, threshold:0.5 for SwiGLU).

Data: every prompt (chat template as in capture, unless `chat_template=False`: the predictor learns
the distribution it sees, see docs/run-real.md) is run through the model once, prefill plus
`max_new_tokens` greedy tokens, then the whole sequence is fed once more with hooks on each layer's
`mlp` (its input x) and `mlp.down_proj` (its input a). Prompts are split, seeded, into a training
and a held-out set (whole prompts, so no held-out token was seen in training); thresholds and the
bias initialisation use the training tokens only. Training: BCE with logits, Adam, minibatches of
tokens drawn by a seeded NumPy generator, all layers' predictors stacked into one batched problem.

The file (`save_predictor`, atomic): safetensors with A [L, d, r], B [L, r, N], bias [L, N] (F32), and
`__metadata__["flashsim"]` = JSON: format, version, model, shape, rank, threshold, rule, per-layer
|a| thresholds (threshold rule), held-out recall/precision per layer and overall (also on the held-out
tokens past the prefix all prompts share, `heldout_own`: a chat template's system prompt recurs
identically in training and flatters the plain figure), how its errors persist from token to token
on the held-out prompts (`heldout_persistence`, lags 1..5), the prompt split,
seed, epochs, learning rate, training seconds. `load_predictor` checks all of it.
"""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from devices.errors import FlashsimError
from devices.progress import Stage
from traces.outputs import replace_output

FORMAT = "flashsim-lowrank-predictor"
VERSION = 1
DEFAULT_RANK = 32
DEFAULT_EPOCHS = 20
DEFAULT_LR = 3e-3
DEFAULT_BATCH = 256
DEFAULT_HOLDOUT = 0.25


@dataclass
class LowRankPredictor:
    """Trained per-layer low-rank predictors (NumPy; `predict` needs no torch)."""

    A: np.ndarray        # float32 [L, d, r]
    B: np.ndarray        # float32 [L, r, N]
    bias: np.ndarray     # float32 [L, N]
    threshold: float     # probability at or above which a neuron is predicted active
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def n_layers(self) -> int:
        return int(self.A.shape[0])

    @property
    def d_model(self) -> int:
        return int(self.A.shape[1])

    @property
    def rank(self) -> int:
        return int(self.A.shape[2])

    @property
    def n_neurons(self) -> int:
        return int(self.B.shape[2])

    def logits(self, layer: int, x: np.ndarray) -> np.ndarray:
        """float32 [T, N] for x [T, d]."""
        x = np.asarray(x, np.float32)
        return (x @ self.A[layer]) @ self.B[layer] + self.bias[layer]

    def predict(self, layer: int, x: np.ndarray) -> np.ndarray:
        """bool [T, N]: sigmoid(logit) >= threshold, i.e. logit >= log(t / (1 - t))."""
        return self.logits(layer, x) >= logit_of(self.threshold)


def logit_of(p: float) -> float:
    if p <= 0:
        return -math.inf
    if p >= 1:
        return math.inf
    return math.log(p / (1.0 - p))


# ---- data ------------------------------------------------------------------------------------------
@dataclass
class Pairs:
    """What the model produced on the prompts: inputs x [L, T, d], activations a [L, T, N] (fp32),
    and the prompt index of every token [T]."""

    x: np.ndarray
    a: np.ndarray
    prompt_of_token: np.ndarray
    n_prompt_tokens: list[int]
    shared_prefix: int = 0       # tokens every sequence starts with (a chat template's system prompt)


def mlps_of(model: Any) -> list[Any]:
    try:
        return [layer.mlp for layer in model.model.layers]
    except AttributeError:
        raise FlashsimError("the low-rank predictor needs a llama-family model (model.model.layers[i].mlp)") from None


def collect_pairs(model: Any, sequences: Sequence[Sequence[int]]) -> Pairs:
    """One full forward per token sequence with hooks on each layer's mlp input (x) and its
    down projection's input (a = act(gate x) * up x)."""
    import torch

    mlps = mlps_of(model)
    L = len(mlps)
    xs: list[list[np.ndarray]] = [[] for _ in range(L)]
    acts: list[list[np.ndarray]] = [[] for _ in range(L)]
    hooks = []
    for i, mlp in enumerate(mlps):
        down = getattr(mlp, "down_proj", None)
        if down is None:
            raise FlashsimError(f"layer {i}: no mlp.down_proj (a gated llama-family FFN is needed)")

        def on_x(_m: Any, args: tuple, i: int = i) -> None:
            xs[i].append(args[0].reshape(-1, args[0].shape[-1]).detach().float().numpy().copy())

        def on_a(_m: Any, args: tuple, i: int = i) -> None:
            acts[i].append(args[0].reshape(-1, args[0].shape[-1]).detach().float().numpy().copy())

        hooks += [mlp.register_forward_pre_hook(on_x), down.register_forward_pre_hook(on_a)]
    prompt_of = []
    try:
        with torch.no_grad():
            for p, ids in enumerate(sequences):
                model(torch.as_tensor([list(ids)], dtype=torch.long), use_cache=False)
                prompt_of.append(np.full(len(ids), p, np.int32))
    finally:
        for h in hooks:
            h.remove()
    return Pairs(np.stack([np.concatenate(v) for v in xs]), np.stack([np.concatenate(v) for v in acts]),
                 np.concatenate(prompt_of), [len(s) for s in sequences], shared_prefix_length(sequences))


def shared_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """Length of the token prefix common to every sequence (0 for one sequence: nothing is shared)."""
    if len(sequences) < 2:
        return 0
    n = min(len(s) for s in sequences)
    first = list(sequences[0][:n])
    for s in sequences[1:]:
        k = 0
        while k < n and s[k] == first[k]:
            k += 1
        n = k
    return n


def prompt_sequences(loaded: Any, prompts: Sequence[Any], max_new_tokens: int,
                     progress: Callable[[int, int], None] | None = None, chat_template: bool = True) -> list[list[int]]:
    """Each prompt (chat template when the tokenizer has one and `chat_template`, as capture does)
    followed by up to `max_new_tokens` greedy tokens."""
    from traces.capture.generate import Decoder, encode_prompt, eos_token_ids

    dec = Decoder(loaded.model, eos_token_ids(loaded.model, loaded.tokenizer), 0.0)
    out = []
    for i, p in enumerate(prompts):
        ids = encode_prompt(loaded.tokenizer, p.text, chat_template)
        if not ids:
            raise FlashsimError(f"prompt {p.id!r}: tokenizes to nothing")
        gen = dec.run(ids, max_new_tokens) if max_new_tokens > 0 else []
        out.append(ids + gen)
        if progress:
            progress(i + 1, len(prompts))
    return out


def split_prompts(n_prompts: int, holdout: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, held-out) prompt indices, sorted; seeded; at least one prompt on each side."""
    if n_prompts < 2:
        raise FlashsimError(f"the predictor needs at least 2 prompts (a training and a held-out one), got {n_prompts}")
    if not 0 < holdout < 1:
        raise FlashsimError(f"--holdout {holdout}: must be in (0, 1)")
    n_hold = min(n_prompts - 1, max(1, int(round(holdout * n_prompts))))
    perm = np.random.default_rng(np.random.SeedSequence([seed, 0x5117])).permutation(n_prompts)
    return np.sort(perm[n_hold:]), np.sort(perm[:n_hold])


def labels(a: np.ndarray, train_tokens: np.ndarray, rule: str, fraction: float | None) -> tuple[np.ndarray, list[float] | None]:
    """bool [L, T, N] activity under the trace rule; for `threshold`, the per-layer |a| thresholds
    are calibrated on the training tokens only (returned)."""
    from traces.sparsity import active_mask, calibrate_threshold

    out = np.zeros(a.shape, bool)
    thresholds: list[float] | None = [] if rule == "threshold" else None
    for layer in range(a.shape[0]):
        thr = None
        if rule == "threshold":
            assert fraction is not None and thresholds is not None
            thr = calibrate_threshold(np.abs(a[layer, train_tokens]), fraction)
            thresholds.append(thr)
        out[layer] = active_mask(a[layer], rule, fraction, thr)
    return out, thresholds


# ---- training --------------------------------------------------------------------------------------
def train(x: np.ndarray, y: np.ndarray, *, rank: int, epochs: int, seed: int, lr: float = DEFAULT_LR,
          batch_tokens: int = DEFAULT_BATCH) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fit A [L, d, r], B [L, r, N], bias [L, N] to x [L, T, d] -> y [L, T, N] (bool) by BCE + Adam."""
    import torch

    if rank < 1:
        raise FlashsimError(f"--rank {rank}: must be >= 1")
    if epochs < 1:
        raise FlashsimError(f"--epochs {epochs}: must be >= 1")
    L, T, d = x.shape
    N = y.shape[2]
    if T == 0:
        raise FlashsimError("no training tokens")
    g = torch.Generator().manual_seed(int(seed))
    X = torch.from_numpy(np.ascontiguousarray(x, np.float32))
    Y = torch.from_numpy(np.ascontiguousarray(y, np.float32))
    # init: A ~ N(0, 1/d) so x A has unit-scale entries; B small so training starts from the bias,
    # which is the log-odds of each neuron's training activity rate (clipped away from 0 and 1)
    rate = np.clip(y.mean(axis=1), 1.0 / (T + 1), 1.0 - 1.0 / (T + 1)).astype(np.float32)
    A = (torch.randn(L, d, rank, generator=g) / math.sqrt(d)).requires_grad_()
    B = (torch.randn(L, rank, N, generator=g) * (0.01 / math.sqrt(rank))).requires_grad_()
    b = torch.from_numpy(np.log(rate / (1 - rate))).requires_grad_()
    opt = torch.optim.Adam([A, B, b], lr=lr)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xBA7C]))
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for _ in range(epochs):
        order = rng.permutation(T)
        for s in range(0, T, batch_tokens):
            idx = torch.from_numpy(order[s:s + batch_tokens])
            logits = torch.baddbmm(b[:, None, :], X[:, idx] @ A, B)
            loss = loss_fn(logits, Y[:, idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return A.detach().numpy().copy(), B.detach().numpy().copy(), b.detach().numpy().copy()


def evaluate(pred: LowRankPredictor, x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """Recall, precision and predicted fraction per layer and overall (micro-averaged) on x -> y."""
    per = []
    tp_all = fp_all = fn_all = n_all = 0
    for layer in range(pred.n_layers):
        p = pred.predict(layer, x[layer])
        t = y[layer]
        tp, fp, fn = int((p & t).sum()), int((p & ~t).sum()), int((~p & t).sum())
        per.append({"layer": layer, "recall": tp / (tp + fn) if tp + fn else 1.0,
                    "precision": tp / (tp + fp) if tp + fp else 1.0,
                    "predicted_fraction": float(p.mean()), "active_fraction": float(t.mean())})
        tp_all, fp_all, fn_all, n_all = tp_all + tp, fp_all + fp, fn_all + fn, n_all + p.size
    overall = {"recall": tp_all / (tp_all + fn_all) if tp_all + fn_all else 1.0,
               "precision": tp_all / (tp_all + fp_all) if tp_all + fp_all else 1.0,
               "predicted_fraction": (tp_all + fp_all) / n_all if n_all else 0.0,
               "active_fraction": (tp_all + fn_all) / n_all if n_all else 0.0}
    return {"overall": overall, "per_layer": per}


def heldout_persistence(pred: LowRankPredictor, x: np.ndarray, y: np.ndarray, seq: np.ndarray,
                        lags: int = 5) -> dict[str, Any]:
    """Pooled error persistence on consecutive held-out tokens of the same prompt
    (`real.studies.predictor_error_stats`; `flashsim real predictor-errors` gives it per layer and scope)."""
    from real.runtime.predictors import lowrank_masks
    from real.studies.predictor_error_stats import Tokens, measure

    keep = np.ones(len(seq), bool)
    o = measure(Tokens(lowrank_masks(pred, x), y, seq, keep, ~keep), lags)["all"]["overall"]
    return {k: o[k] for k in ("fp_rate", "fn_rate", "fp_persistence", "fn_persistence", "fp_memory", "fp_memory_far",
                              "fn_memory", "fn_memory_far")}


def train_from_pairs(pairs: Pairs, *, rank: int, epochs: int, seed: int, rule: str, fraction: float | None,
                     threshold: float = 0.5, holdout: float = DEFAULT_HOLDOUT, lr: float = DEFAULT_LR,
                     batch_tokens: int = DEFAULT_BATCH, meta: dict | None = None) -> LowRankPredictor:
    """Split by prompt, label, train, evaluate on the held-out prompts."""
    if not 0 < threshold < 1:
        raise FlashsimError(f"--threshold {threshold}: must be in (0, 1)")
    n_prompts = len(pairs.n_prompt_tokens)
    train_p, hold_p = split_prompts(n_prompts, holdout, seed)
    tr = np.flatnonzero(np.isin(pairs.prompt_of_token, train_p))
    ho = np.flatnonzero(np.isin(pairs.prompt_of_token, hold_p))
    y, act_thresholds = labels(pairs.a, tr, rule, fraction)
    t0 = time.perf_counter()
    A, B, b = train(pairs.x[:, tr], y[:, tr], rank=rank, epochs=epochs, seed=seed, lr=lr, batch_tokens=batch_tokens)
    train_s = time.perf_counter() - t0
    pred = LowRankPredictor(A, B, b, float(threshold))
    metrics = evaluate(pred, pairs.x[:, ho], y[:, ho])
    # held-out tokens past the prefix every sequence shares (a chat template's system prompt): the
    # shared tokens recur identically in training, so they flatter the plain held-out figure
    starts = np.concatenate([[0], np.cumsum(pairs.n_prompt_tokens)[:-1]])
    position = np.arange(len(pairs.prompt_of_token)) - starts[pairs.prompt_of_token]
    ho_own = ho[position[ho] >= pairs.shared_prefix]
    metrics_own = evaluate(pred, pairs.x[:, ho_own], y[:, ho_own]) if len(ho_own) else None
    persistence = heldout_persistence(pred, pairs.x[:, ho], y[:, ho], pairs.prompt_of_token[ho])
    L, _, d = pairs.x.shape
    pred.meta = {
        "format": FORMAT, "version": VERSION, "n_layers": L, "d_model": d, "d_ff": int(pairs.a.shape[2]),
        "rank": rank, "threshold": float(threshold), "rule": rule, "target_fraction": fraction,
        "act_thresholds": act_thresholds, "seed": seed, "epochs": epochs, "lr": lr, "batch_tokens": batch_tokens,
        "holdout": holdout, "train_prompts": [int(i) for i in train_p], "heldout_prompts": [int(i) for i in hold_p],
        "train_tokens": int(len(tr)), "heldout_tokens": int(len(ho)), "training_s": train_s,
        "heldout": metrics, "shared_prefix_tokens": pairs.shared_prefix, "heldout_own_tokens": int(len(ho_own)),
        "heldout_own": metrics_own, "heldout_persistence": persistence, **(meta or {}),
    }
    return pred


# ---- file ------------------------------------------------------------------------------------------
def save_predictor(pred: LowRankPredictor, path: str | Path) -> Path:
    """safetensors (A, B, bias) + JSON metadata in the header; temporary name, then rename."""
    from real.weights.safetensors_io import write_safetensors

    path = Path(path)
    if path.suffix != ".safetensors":
        raise FlashsimError(f"--out {path}: the predictor file must end in .safetensors")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    tensors = {"A": ("F32", np.ascontiguousarray(pred.A, np.float32)),
               "B": ("F32", np.ascontiguousarray(pred.B, np.float32)),
               "bias": ("F32", np.ascontiguousarray(pred.bias, np.float32))}
    try:
        write_safetensors(tmp, tensors, {"flashsim": json.dumps(pred.meta, sort_keys=True)})
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        replace_output(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise FlashsimError(f"{path}: cannot write the predictor ({e.strerror})") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def load_predictor(path: str | Path) -> LowRankPredictor:
    """Read and check a predictor file (FlashsimError naming the file and what is wrong)."""
    from real.weights.safetensors_io import read_safetensors

    path = Path(path)
    if not path.is_file():
        raise FlashsimError(f"{path}: no such predictor file (train one with `flashsim real train-predictor`)")
    tensors, header = read_safetensors(path)
    try:
        meta = json.loads(header.get("flashsim", ""))
    except json.JSONDecodeError:
        raise FlashsimError(f"{path}: no flashsim metadata in the safetensors header; not a predictor file") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise FlashsimError(f"{path}: not a flashsim low-rank predictor (format {meta.get('format') if isinstance(meta, dict) else None!r})")
    if meta.get("version") != VERSION:
        raise FlashsimError(f"{path}: predictor version {meta.get('version')!r} is not supported (this flashsim reads "
                            f"{VERSION}); train it again")
    missing = [k for k in ("A", "B", "bias") if k not in tensors]
    if missing:
        raise FlashsimError(f"{path}: tensor(s) {', '.join(missing)} missing; train the predictor again")
    A, B, b = (np.asarray(tensors[k][1], np.float32) for k in ("A", "B", "bias"))
    ok = (A.ndim == 3 and B.ndim == 3 and b.ndim == 2 and A.shape[0] == B.shape[0] == b.shape[0]
          and A.shape[2] == B.shape[1] and B.shape[2] == b.shape[1]
          and (A.shape[0], A.shape[1], B.shape[2], A.shape[2]) == (meta.get("n_layers"), meta.get("d_model"),
                                                                  meta.get("d_ff"), meta.get("rank")))
    if not ok:
        raise FlashsimError(f"{path}: tensor shapes A {list(A.shape)}, B {list(B.shape)}, bias {list(b.shape)} do not "
                            "agree with each other or with the metadata; train the predictor again")
    thr = meta.get("threshold")
    if not isinstance(thr, (int, float)) or not 0 < thr < 1:
        raise FlashsimError(f"{path}: metadata field 'threshold' must be in (0, 1), got {thr!r}")
    if not (np.isfinite(A).all() and np.isfinite(B).all() and np.isfinite(b).all()):
        raise FlashsimError(f"{path}: non-finite weights; train the predictor again")
    return LowRankPredictor(A.copy(), B.copy(), b.copy(), float(thr), meta)


def check_matches(pred: LowRankPredictor, spec: Any, where: str) -> None:
    if (pred.n_layers, pred.d_model, pred.n_neurons) != (spec.n_layers, spec.d_model, spec.d_ff):
        raise FlashsimError(f"{where}: the predictor is for {pred.meta.get('model', '?')} ({pred.n_layers} layers, "
                            f"d_model {pred.d_model}, d_ff {pred.n_neurons}) but the model is {spec.name} "
                            f"({spec.n_layers}, {spec.d_model}, {spec.d_ff}); train one for this model")


def check_settings(*, rank: int, epochs: int, threshold: float, holdout: float, n_prompts: int) -> None:
    """Refuse bad settings before any model work."""
    if rank < 1:
        raise FlashsimError(f"--rank {rank}: must be >= 1")
    if epochs < 1:
        raise FlashsimError(f"--epochs {epochs}: must be >= 1")
    if not 0 < threshold < 1:
        raise FlashsimError(f"--threshold {threshold}: must be in (0, 1)")
    split_prompts(n_prompts, holdout, 0)


def train_on_prompts(loaded: Any, prompts: Sequence[Any], *, rank: int = DEFAULT_RANK, epochs: int = DEFAULT_EPOCHS,
                     seed: int = 0, sparsity: str | None = None, threshold: float = 0.5,
                     holdout: float = DEFAULT_HOLDOUT, max_new_tokens: int = 0, lr: float = DEFAULT_LR,
                     prompts_source: str = "builtin", progress: Callable[[str], None] | None = None,
                     chat_template: bool = True) -> LowRankPredictor:
    """The whole pipeline on a loaded model (`traces.capture.models.LoadedModel`)."""
    from traces.capture.assemble import default_rule
    from traces.capture.run import library_versions
    from traces.sparsity import parse_rule

    spec = loaded.spec
    rule, fraction = parse_rule(sparsity) if sparsity else default_rule(spec)
    if max_new_tokens < 0:
        raise FlashsimError(f"--max-new-tokens must be >= 0, got {max_new_tokens}")
    check_settings(rank=rank, epochs=epochs, threshold=threshold, holdout=holdout, n_prompts=len(prompts))
    t0 = time.perf_counter()
    with Stage("train-predictor: prompts through the model", len(prompts), "prompts",
               enabled=progress is not None) as stage:
        seqs = prompt_sequences(loaded, prompts, max_new_tokens, lambda i, n: stage.update(), chat_template)
    pairs = collect_pairs(loaded.model, seqs)
    collect_s = time.perf_counter() - t0
    if progress:
        progress(f"collected {pairs.x.shape[1]} tokens x {pairs.x.shape[0]} layers in {collect_s:.1f} s; training")
    meta = {"model": spec.name, "model_source": loaded.source, "prompts": prompts_source,
            "prompt_ids": [p.id for p in prompts], "max_new_tokens": max_new_tokens, "collect_s": collect_s,
            "chat_template": bool(chat_template and getattr(loaded.tokenizer, "chat_template", None)),
            "sparsity": f"{rule}" + (f":{fraction:g}" if fraction is not None else ""),
            "libraries": library_versions()}
    return train_from_pairs(pairs, rank=rank, epochs=epochs, seed=seed, rule=rule, fraction=fraction,
                            threshold=threshold, holdout=holdout, lr=lr, meta=meta)
