"""How a trained low-rank predictor's errors persist from token to token, and its predicted sets as a
trace the simulator's `recorded` predictor replays.

A low-rank predictor (`real.predictor_train`) sees the FFN input x, the hidden state, which changes
slowly along a sequence, so it tends to over-predict (false positive) and miss (false negative)
the same neurons on consecutive tokens. Per layer, on consecutive token pairs (t, t+k) of the same
sequence, k = 1..`lags`:

* base rates: `fp_rate` = P(predicted | inactive), `fn_rate` = P(not predicted | active)
  (= 1 - recall), and recall/precision;
* `fp_persistence[k]` = P(FP at t+k | FP at t, inactive at t+k): the neuron's over-prediction
  repeats given it is again inactive (so the truth's own turnover is factored out);
  `fn_persistence[k]` = P(FN at t+k | FN at t, active at t+k);
* `fp_then_active_recall[k]` = P(predicted at t+k | FP at t, active at t+k): an over-predicted
  neuron that becomes active is usually caught (compare with recall);
* `fp_lift`, `fn_lift`: (persistence - rate) / (1 - rate) at lag 1 (0: memoryless, 1: the error
  never changes); `fp_memory`, `fp_memory_far` (and `fn_`): that lift at lag 1 and at the last lag,
  clipped to 0 <= far <= memory: the `noisy` predictor's parameters (`sim.policies.error_memory`);
  `*_chain[k]` = rate + (1 - rate) * memory**k, what a one-step (Markov) chain implies at lag k,
  and `*_model[k]`, what the `noisy` predictor implies with these parameters, beside the measured
  lag-k figures.

Counts are summed over layers for the pooled figures (micro-averaged). Token selection (scopes):
`all` (every held-out pair), `own` (both tokens past the prefix every sequence shares, a chat
template's system prompt, which recurs identically in training), `decode` (both generated tokens).

Two sources of tokens: the predictor's own held-out prompts (from its metadata: same prompts file,
chat template, generated tokens, rule and calibrated thresholds), or a captured trace (`--trace`):
its token ids are fed teacher-forced, the truth is the trace's masks (what a replay of it uses),
only prompts the predictor was not trained on are measured, and the predicted sets of every token
can be written as a trace (`write_mask_trace`) for `predictor=recorded`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from devices.errors import FlashsimError
from sim.policies.error_memory import implied_repeat

DEFAULT_LAGS = 5
SCOPES = ("all", "own", "decode")


@dataclass
class Tokens:
    """Predicted and true sets of some sequences (bool [L, T, N]) and, per token, its sequence,
    whether it is past the shared prefix, and whether it was generated."""

    pred: np.ndarray
    truth: np.ndarray
    seq: np.ndarray          # int [T]
    own: np.ndarray          # bool [T]
    decode: np.ndarray       # bool [T]


def _ratio(a: int, b: int, empty: float | None = None) -> float | None:
    return a / b if b else empty


def transition_counts(pred: np.ndarray, truth: np.ndarray, seq: np.ndarray, keep: np.ndarray,
                      lags: int) -> dict[str, Any]:
    """Counts for one layer: pred/truth bool [T, N]; pairs (t, t+k) with both tokens kept and in
    the same sequence. Returns plain ints (lists over k = 1..lags)."""
    fp = pred & ~truth
    fn = ~pred & truth
    n_inactive = int((~truth[keep]).sum())
    n_active = int(truth[keep].sum())
    c: dict[str, Any] = {"inactive": n_inactive, "active": n_active, "fp": int(fp[keep].sum()),
                         "fn": int(fn[keep].sum()), "tp": int((pred & truth)[keep].sum()),
                         "fp_then_inactive": [], "fp_repeat": [], "fn_then_active": [], "fn_repeat": [],
                         "fp_then_active": [], "fp_then_active_hit": []}
    for k in range(1, lags + 1):
        ok = (seq[:-k] == seq[k:]) & keep[:-k] & keep[k:] if len(seq) > k else np.zeros(0, bool)
        a_fp, b_fp = fp[:-k][ok], fp[k:][ok]
        a_fn, b_fn = fn[:-k][ok], fn[k:][ok]
        b_truth, b_pred = truth[k:][ok], pred[k:][ok]
        c["fp_then_inactive"].append(int((a_fp & ~b_truth).sum()))
        c["fp_repeat"].append(int((a_fp & b_fp).sum()))
        c["fn_then_active"].append(int((a_fn & b_truth).sum()))
        c["fn_repeat"].append(int((a_fn & b_fn).sum()))
        c["fp_then_active"].append(int((a_fp & b_truth).sum()))
        c["fp_then_active_hit"].append(int((a_fp & b_truth & b_pred).sum()))
    return c


def _add(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {k: [x + y for x, y in zip(v, b[k], strict=True)] if isinstance(v, list) else v + b[k]
            for k, v in a.items()}


def figures(c: dict[str, Any]) -> dict[str, Any]:
    """Rates, persistence per lag, lift and the one-step chain's lag-k figures from counts."""
    fp_rate = _ratio(c["fp"], c["inactive"], 0.0)
    fn_rate = _ratio(c["fn"], c["active"], 0.0)
    fp_p = [_ratio(r, n) for r, n in zip(c["fp_repeat"], c["fp_then_inactive"], strict=True)]
    fn_p = [_ratio(r, n) for r, n in zip(c["fn_repeat"], c["fn_then_active"], strict=True)]

    def lift(p: float | None, rate: float) -> float | None:
        return None if p is None or rate >= 1 else (p - rate) / (1 - rate)

    def memory(rate: float, p: list[float | None]) -> tuple[float | None, float | None]:
        """The `noisy` parameters: memory at lag 1 and at the last lag (clipped to [0, 1], far <= near)."""
        l1 = lift(p[0] if p else None, rate)
        ln = lift(p[-1] if p else None, rate)
        if l1 is None or ln is None:
            return l1, ln
        l1 = min(max(l1, 0.0), 1.0)
        return l1, min(max(ln, 0.0), l1)

    def curves(rate: float, m: float | None, far: float | None, n: int) -> tuple[list, list]:
        """The one-step chain's and the `noisy` model's lag-k figures."""
        if m is None or far is None:
            return [None] * n, [None] * n
        return ([rate + (1 - rate) * m ** k for k in range(1, n + 1)],
                [implied_repeat(rate, m, far, k) for k in range(1, n + 1)])

    fp_m, fp_far = memory(fp_rate, fp_p)
    fn_m, fn_far = memory(fn_rate, fn_p)
    fp_chain, fp_model = curves(fp_rate, fp_m, fp_far, len(fp_p))
    fn_chain, fn_model = curves(fn_rate, fn_m, fn_far, len(fn_p))
    return {"recall": _ratio(c["tp"], c["tp"] + c["fn"], 1.0), "precision": _ratio(c["tp"], c["tp"] + c["fp"], 1.0),
            "fp_rate": fp_rate, "fn_rate": fn_rate, "fp_persistence": fp_p, "fn_persistence": fn_p,
            "fp_lift": lift(fp_p[0] if fp_p else None, fp_rate), "fn_lift": lift(fn_p[0] if fn_p else None, fn_rate),
            "fp_memory": fp_m, "fp_memory_far": fp_far, "fn_memory": fn_m, "fn_memory_far": fn_far,
            "fp_chain": fp_chain, "fp_model": fp_model, "fn_chain": fn_chain, "fn_model": fn_model,
            "fp_then_active_recall": [_ratio(h, n) for h, n in zip(c["fp_then_active_hit"], c["fp_then_active"],
                                                                   strict=True)],
            "pairs": c["fp_then_inactive"][0] + c["fp_then_active"][0] if c["fp_then_inactive"] else 0,
            "counts": c}


def measure(tokens: Tokens, lags: int = DEFAULT_LAGS) -> dict[str, Any]:
    """Per scope: pooled figures and per-layer figures."""
    if lags < 1:
        raise FlashsimError(f"--lags {lags}: must be >= 1")
    out: dict[str, Any] = {}
    for scope in SCOPES:
        keep = {"all": np.ones(len(tokens.seq), bool), "own": tokens.own, "decode": tokens.decode}[scope]
        if not keep.any():
            out[scope] = None
            continue
        per = [transition_counts(tokens.pred[layer], tokens.truth[layer], tokens.seq, keep, lags)
               for layer in range(tokens.pred.shape[0])]
        pooled = per[0]
        for c in per[1:]:
            pooled = _add(pooled, c)
        out[scope] = {"tokens": int(keep.sum()), "overall": figures(pooled),
                      "per_layer": [{"layer": i, **figures(c)} for i, c in enumerate(per)]}
    return out


# ---- token sources ---------------------------------------------------------------------------------
def truth_from_activations(a: np.ndarray, meta: dict[str, Any]) -> np.ndarray:
    """bool [L, T, N] under the predictor's own rule; a threshold rule uses the thresholds it was
    calibrated with on its training tokens (stored in its metadata)."""
    from traces.sparsity import active_mask, parse_rule

    rule, fraction = parse_rule(str(meta.get("sparsity") or meta.get("rule")))
    thr = meta.get("act_thresholds")
    if rule == "threshold" and (not isinstance(thr, list) or len(thr) != a.shape[0]):
        raise FlashsimError("the predictor's metadata lacks its per-layer |a| thresholds; train it again")
    return np.stack([active_mask(a[layer], rule, fraction, thr[layer] if rule == "threshold" else None)
                     for layer in range(a.shape[0])])


def heldout_prompts(meta: dict[str, Any], prompts_source: str | None) -> list[Any]:
    """The prompts the predictor held out (by id, from its prompts file or `prompts_source`)."""
    from traces.capture.prompts import load_prompts

    source = prompts_source or meta.get("prompts") or "builtin"
    by_id = {p.id: p for p in load_prompts(source)}
    ids = meta.get("prompt_ids") or []
    held = [ids[i] for i in meta.get("heldout_prompts", []) if 0 <= i < len(ids)]
    missing = [i for i in held if i not in by_id]
    if not held or missing:
        raise FlashsimError(f"the predictor's held-out prompts ({', '.join(missing) or 'none recorded'}) are not in "
                            f"{source}; pass --prompts with the file it was trained on, or --trace")
    return [by_id[i] for i in held]


def tokens_from_prompts(loaded: Any, pred: Any, prompts: Sequence[Any]) -> Tokens:
    """Run the held-out prompts as training did (chat template, generated tokens) and predict."""
    from real.predictor_train import collect_pairs, prompt_sequences, shared_prefix_length
    from real.predictors import lowrank_masks
    from traces.capture.generate import encode_prompt

    meta = pred.meta
    chat = bool(meta.get("chat_template", True))
    seqs = prompt_sequences(loaded, prompts, int(meta.get("max_new_tokens", 0)), chat_template=chat)
    n_prompt = [len(encode_prompt(loaded.tokenizer, p.text, chat)) for p in prompts]
    pairs = collect_pairs(loaded.model, seqs)
    prefix = shared_prefix_length(seqs)
    seq = pairs.prompt_of_token
    pos = np.concatenate([np.arange(len(s)) for s in seqs])
    decode = pos >= np.asarray(n_prompt)[seq]
    return Tokens(lowrank_masks(pred, pairs.x), truth_from_activations(pairs.a, meta), seq, pos >= prefix, decode)


def trace_sequences(trace: Any) -> list[np.ndarray]:
    """Token indices of each prompt of a captured trace (its tokens are stored prompt by prompt)."""
    pi = np.asarray(trace.prompt_index)
    starts = np.flatnonzero(np.concatenate([[True], pi[1:] != pi[:-1]]))
    if len(np.unique(pi)) != len(starts):
        raise FlashsimError(f"{trace.path}: a prompt's tokens are not contiguous; not a captured trace")
    return np.split(np.arange(len(pi)), starts[1:])


def check_trace_rule(trace: Any, meta: dict[str, Any]) -> None:
    from traces.sparsity import parse_rule

    rule, fraction = parse_rule(str(meta.get("sparsity") or meta.get("rule")))
    tr = trace.manifest.sparsity
    same = tr.rule == rule and (fraction is None or (tr.target_fraction is not None
                                                     and abs(tr.target_fraction - fraction) < 1e-9))
    if tr.rule == "synthetic" or not same:
        got = tr.rule + (f":{tr.target_fraction:g}" if tr.target_fraction else "")
        raise FlashsimError(f"{trace.path}: captured with rule {got}, the predictor was trained on "
                            f"{meta.get('sparsity')}; capture the trace with `--sparsity {meta.get('sparsity')}`")


def tokens_from_trace(model: Any, pred: Any, trace: Any, trained_texts: set[str]) -> tuple[Tokens, np.ndarray, int]:
    """Feed the trace's tokens (teacher forced, prompt by prompt) and predict. Returns the tokens
    (kept: prompts the predictor did not train on), the predicted sets of EVERY token (for the
    recorded trace) and how many prompts were skipped as training prompts."""
    from real.predictor_train import collect_pairs, shared_prefix_length
    from real.predictors import lowrank_masks
    from traces.format import DECODE

    check_trace_rule(trace, pred.meta)
    groups = trace_sequences(trace)
    ids = np.asarray(trace.token_ids)
    seqs = [ids[g].tolist() for g in groups]
    pairs = collect_pairs(model, seqs)
    masks = lowrank_masks(pred, pairs.x)
    L, T, N = masks.shape
    truth = np.stack([trace.mask(layer) for layer in range(L)])
    prompts = trace.manifest.prompts
    pi = np.asarray(trace.prompt_index)
    trained = np.array([prompts[pi[g[0]]].text in trained_texts and bool(prompts[pi[g[0]]].text) for g in groups])
    keep_seq = ~trained
    seq = pairs.prompt_of_token
    prefix = shared_prefix_length(seqs)
    pos = np.concatenate([np.arange(len(s)) for s in seqs])
    own = (pos >= prefix) & keep_seq[seq]
    decode = (np.asarray(trace.phase) == DECODE) & keep_seq[seq]
    sel = keep_seq[seq]
    tokens = Tokens(masks[:, sel], truth[:, sel], seq[sel], own[sel], decode[sel])
    return tokens, masks, int(trained.sum())


def training_texts(meta: dict[str, Any]) -> set[str]:
    """Texts of the prompts the predictor trained on (empty when its prompts file is not readable)."""
    from traces.capture.prompts import load_prompts

    try:
        by_id = {p.id: p for p in load_prompts(meta.get("prompts") or "builtin")}
    except FlashsimError:
        return set()
    ids = meta.get("prompt_ids") or []
    return {by_id[ids[i]].text for i in meta.get("train_prompts", []) if 0 <= i < len(ids) and ids[i] in by_id}


def record_trace(out: str | Path, trace: Any, masks: np.ndarray, pred_path: str, meta: dict[str, Any],
                 threshold: float) -> Path:
    from real.predictors import write_mask_trace

    return write_mask_trace(out, trace, masks, trace.spec,
                            {"predictor": str(pred_path), "predictor_rank": meta.get("rank"),
                             "predictor_threshold": threshold, "source_trace": str(trace.path)})


def tokens_from_traces(truth_trace: Any, pred_trace: Any) -> Tokens:
    """A captured trace and a trace of predicted sets for the same tokens (a `--record-out`): no
    model needed. Sequences are the prompts; `own` = past the prefix all prompts share; `decode`
    = generated tokens."""
    from traces.format import DECODE

    t, p = truth_trace, pred_trace
    if (t.n_layers, t.n_tokens, t.n_neurons) != (p.n_layers, p.n_tokens, p.n_neurons) or not np.array_equal(
            np.asarray(t.token_ids), np.asarray(p.token_ids)):
        raise FlashsimError(f"{p.path}: not a recording of {t.path} (shape or tokens differ)")
    groups = trace_sequences(t)
    ids = np.asarray(t.token_ids)
    seq = np.concatenate([np.full(len(g), i) for i, g in enumerate(groups)])
    pos = np.concatenate([np.arange(len(g)) for g in groups])
    from real.predictor_train import shared_prefix_length

    prefix = shared_prefix_length([ids[g].tolist() for g in groups])
    return Tokens(np.stack([p.mask(i) for i in range(p.n_layers)]), np.stack([t.mask(i) for i in range(t.n_layers)]),
                  seq, pos >= prefix, np.asarray(t.phase) == DECODE)
