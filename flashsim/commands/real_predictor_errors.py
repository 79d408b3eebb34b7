"""CLI: how a trained predictor's errors persist from token to token, and its sets as a trace.

    flashsim real predictor-errors --predictor FILE.safetensors --model smollm2-135m
          [--prompts FILE] [--trace TRACE [--record-out DIR [--overwrite]]] [--threshold P] [--lags 5]
          [--threads 1] [--json]

Registered under `flashsim real` by `register_real(rsub)` (called from flashsim/commands/real.py); the
measurement is `real.studies.predictor_errors`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from devices.errors import FlashsimError
from flashsim.output import print_json, print_table


def register_real(rsub: argparse._SubParsersAction) -> None:
    from real.studies.predictor_error_stats import DEFAULT_LAGS

    e = rsub.add_parser("predictor-errors", help="how a trained low-rank predictor's false positives and misses "
                                                 "persist from token to token (per layer, held-out tokens)")
    e.add_argument("--predictor", required=True, help="predictor file (`flashsim real train-predictor`)")
    e.add_argument("--model", required=True, help="the model it was trained for (smollm2-135m or a HF folder)")
    e.add_argument("--prompts", help="the prompts file it was trained on, when not the one its metadata names")
    e.add_argument("--trace", help="measure on this captured trace's tokens instead (its masks are the truth; "
                                   "prompts the predictor trained on are skipped)")
    e.add_argument("--record-out", metavar="DIR", help="with --trace: write the predicted sets of every token of "
                                                      "the trace as a trace for `--set predictor=recorded "
                                                      "--set recorded.path=DIR`")
    e.add_argument("--overwrite", action="store_true", help="replace an existing --record-out trace")
    e.add_argument("--threshold", type=float, help="predict active at sigmoid >= this instead of the file's threshold "
                                                  "(trades recall for precision)")
    e.add_argument("--lags", type=int, default=DEFAULT_LAGS,
                   help=f"token distances k at which persistence is measured, 1..k (default {DEFAULT_LAGS})")
    e.add_argument("--threads", type=int, default=1, help="PyTorch threads (default 1, as train-predictor)")
    e.add_argument("--json", action="store_true", help="print every figure (per layer, per lag, counts) as JSON")
    e.set_defaults(func=_predictor_errors)


def _predictor_errors(args: argparse.Namespace) -> int:
    from real.studies.predictor_error_stats import measure
    from real.studies.predictor_errors import (
        heldout_prompts,
        record_trace,
        tokens_from_prompts,
        tokens_from_trace,
        training_texts,
    )
    from real.studies.predictor_train import check_matches, load_predictor
    from traces.capture.models import load_hf_model

    if args.lags < 1:
        raise FlashsimError(f"--lags {args.lags}: must be >= 1")
    if args.threads < 1:
        raise FlashsimError(f"--threads {args.threads}: must be >= 1")
    if args.record_out and not args.trace:
        raise FlashsimError("--record-out needs --trace (the recorded sets must match a trace the simulator replays)")
    if args.record_out and Path(args.record_out).exists() and not args.overwrite:
        raise FlashsimError(f"--record-out {args.record_out}: already exists; pass --overwrite to replace it")
    pred = load_predictor(args.predictor)
    if args.threshold is not None:
        if not 0 < args.threshold < 1:
            raise FlashsimError(f"--threshold {args.threshold}: must be in (0, 1)")
        pred.threshold = float(args.threshold)
    trace = None
    if args.trace:
        from traces.format import open_trace

        trace = open_trace(args.trace)
    else:
        prompts = heldout_prompts(pred.meta, args.prompts)

    def note(m: str) -> None:
        if not args.json:
            print(f"note: {m}", file=sys.stderr, flush=True)

    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        loaded = load_hf_model(args.model, notify=note)
        check_matches(pred, loaded.spec, f"--predictor {args.predictor}")
        skipped = 0
        if trace is not None:
            if (trace.n_layers, trace.n_neurons) != (pred.n_layers, pred.n_neurons):
                raise FlashsimError(f"--trace {args.trace}: {trace.n_layers} layers x {trace.n_neurons} neurons, the "
                                    f"predictor {pred.n_layers} x {pred.n_neurons}; capture it from the same model")
            tokens, masks, skipped = tokens_from_trace(loaded.model, pred, trace, training_texts(pred.meta))
        else:
            tokens = tokens_from_prompts(loaded, pred, prompts)
    finally:
        torch.set_num_threads(before)
    result = measure(tokens, args.lags)
    m = pred.meta
    out: dict[str, Any] = {
        "predictor": str(args.predictor), "model": m.get("model"), "rank": m.get("rank"), "threshold": pred.threshold,
        "rule": m.get("sparsity"), "source": f"trace {args.trace}" if trace is not None else "held-out prompts",
        "skipped_training_prompts": skipped, "lags": args.lags, "scopes": result}
    if args.record_out:
        assert trace is not None
        out["recorded"] = str(record_trace(args.record_out, trace, masks, args.predictor, m, pred.threshold))
    if args.json:
        print_json(out)
        return 0
    _print(out)
    return 0


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _print(out: dict[str, Any]) -> None:
    print(f"{out['predictor']}: {out['model']} low-rank predictor, rank {out['rank']}, threshold {out['threshold']:g}, "
          f"rule {out['rule']}; tokens: {out['source']}"
          + (f" ({out['skipped_training_prompts']} training prompt(s) skipped)" if out["skipped_training_prompts"] else ""))
    print("P(error at t+k | error at t), the neuron inactive (FP) or active (miss) at t+k; '1-step chain': what a "
          "Markov chain with the lag-1 figure implies; 'noisy model': the simulator's noisy predictor with "
          "the memories below (memory: lag 1, memory_far: the last lag)")
    for scope, r in out["scopes"].items():
        if r is None:
            continue
        o = r["overall"]
        print(f"\n[{scope}] {r['tokens']} tokens: recall {_f(o['recall'])}, precision {_f(o['precision'])}; "
              f"P(FP at t+1 | FP at t, inactive) {_f(o['fp_persistence'][0])} (FP rate {_f(o['fp_rate'])}), "
              f"P(miss at t+1 | miss at t, active) {_f(o['fn_persistence'][0])} (miss rate {_f(o['fn_rate'])})")
        print(f"  as the noisy predictor's parameters: --set noisy.fp_memory={_f(o['fp_memory'])} "
              f"--set noisy.fp_memory_far={_f(o['fp_memory_far'])} --set noisy.fn_memory={_f(o['fn_memory'])} "
              f"--set noisy.fn_memory_far={_f(o['fn_memory_far'])}")
        rows = [[k + 1, _f(o["fp_persistence"][k]), _f(o["fp_chain"][k]), _f(o["fp_model"][k]),
                 _f(o["fn_persistence"][k]), _f(o["fn_chain"][k]), _f(o["fn_model"][k]),
                 _f(o["fp_then_active_recall"][k])] for k in range(out["lags"])]
        print_table(["lag k", "FP repeats", "1-step chain", "noisy model", "miss repeats", "1-step chain",
                     "noisy model", "FP->active caught"], rows, align="rrrrrrrr")
        if scope == "all":
            rows = [[r2["layer"], _f(r2["recall"]), _f(r2["precision"]), _f(r2["fp_rate"]), _f(r2["fp_persistence"][0]),
                     _f(r2["fn_rate"]), _f(r2["fn_persistence"][0])] for r2 in r["per_layer"]]
            print_table(["layer", "recall", "precision", "FP rate", "FP persist", "miss rate", "miss persist"], rows,
                        align="rrrrrrr")
    if out.get("recorded"):
        print(f"\nwrote {out['recorded']}: the predicted sets of every token of the trace "
              f"(replay: --set predictor=recorded --set recorded.path={out['recorded']} --set recorded.rank={out['rank']})")
