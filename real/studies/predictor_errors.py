"""How a trained low-rank predictor's errors persist from token to token, and its predicted sets as a
trace the simulator's `recorded` predictor replays.

The statistics (rates, lag-k persistence, the `noisy` predictor's memory parameters) are
`real.studies.predictor_error_stats`; this module gathers the predicted and true sets they are measured on.

Two sources of tokens: the predictor's own held-out prompts (from its metadata: same prompts file,
chat template, generated tokens, rule and calibrated thresholds), or a captured trace (`--trace`):
its token ids are fed teacher-forced, the truth is the trace's masks (what a replay of it uses),
only prompts the predictor was not trained on are measured, and the predicted sets of every token
can be written as a trace (`write_mask_trace`) for `predictor=recorded`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from devices.errors import FlashsimError
from real.studies.predictor_error_stats import Tokens


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
    from real.runtime.predictors import lowrank_masks
    from real.studies.predictor_train import collect_pairs, prompt_sequences, shared_prefix_length
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
    from real.runtime.predictors import lowrank_masks
    from real.studies.predictor_train import collect_pairs, shared_prefix_length
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
    from real.runtime.predictors import write_mask_trace

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
    from real.studies.predictor_train import shared_prefix_length

    prefix = shared_prefix_length([ids[g].tolist() for g in groups])
    return Tokens(np.stack([p.mask(i) for i in range(p.n_layers)]), np.stack([t.mask(i) for i in range(t.n_layers)]),
                  seq, pos >= prefix, np.asarray(t.phase) == DECODE)
