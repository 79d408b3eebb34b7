"""Persistence statistics of a predictor's errors: from predicted and true sets (bool [L, T, N]) of
some sequences, the per-layer and pooled rates and their lag-k persistence (pure NumPy; the token
sources, held-out prompts or a trace, are `real.studies.predictor_errors`).

A low-rank predictor (`real.studies.predictor_train`) sees the FFN input x, the hidden state, which changes
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
"""

from __future__ import annotations

from dataclasses import dataclass
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
