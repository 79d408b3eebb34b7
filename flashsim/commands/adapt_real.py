"""`flashsim adapt prune-eval` and `flashsim adapt selectinfer`: adaptation measured on the real model.

* `prune-eval`: skip dropped MHA/FFN blocks of a llama-family model (real/studies/pruning.py) and measure the
  perplexity of a text, the greedy-token agreement with the dense model and the wall time per
  forward pass, for one `--drop` set or for the first k blocks of a GSI file's order (`--gsi-steps`).
* `selectinfer`: SelectInfer's neuron selection (selective loading gamma, compute ratio) on the real
  model vs a random selection of the same size (real/studies/selectinfer_quality.py), on held-out prompts.

Both check every argument (model name, lists, files) before the model loads; bad input is one
FlashsimError line and exit code 2. Details and measured numbers: docs/adapt.md.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from devices.errors import FlashsimError
from flashsim.output import output_file, print_json, print_table
from traces.outputs import replace_output

DEFAULT_GSI_STEPS = (0, 4, 8, 16)
DEFAULT_MAX_TOKENS = 256   # as `adapt gsi`, so the builtin text scores like the GSI file's perplexities


def register(asub: argparse._SubParsersAction) -> None:
    p = asub.add_parser(
        "prune-eval", help="skip MHA/FFN blocks on the real model: perplexity, agreement, time per pass",
        description="Skip (do not compute) the dropped blocks of a llama-family model and measure the "
        "perplexity of a text, the greedy-token agreement with the dense model and the wall time per "
        "forward pass. Drop sets: --drop BLOCKS, or the first k blocks of a GSI file (--gsi FILE "
        "[--gsi-steps K,...]).")
    p.add_argument("--model", default="smollm2-135m", help="smollm2-135m (embedded) or a Hugging Face model folder")
    p.add_argument("--gsi", metavar="FILE", help="GSI file from `flashsim adapt gsi` (its greedy order)")
    p.add_argument("--drop", metavar="BLOCKS", help='one drop set, e.g. "mha:3,ffn:5"')
    p.add_argument("--gsi-steps", metavar="K,...",
                   help="drop the first K blocks of the file's removal order (GSI steps, then one-shot order); "
                   "default 0,4,8,16")
    p.add_argument("--text", default="builtin", metavar="builtin|prompts|FILE",
                   help="evaluation text: the GSI calibration paragraph (builtin, default), the 20 builtin "
                   "prompts joined (prompts: held out from GSI), or a UTF-8 file")
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, metavar="T",
                   help=f"score the first T tokens of the text (default {DEFAULT_MAX_TOKENS})")
    p.add_argument("--repeats", type=int, default=3, metavar="R",
                   help="timed passes per drop set after one warm-up pass; the median is reported (default 3)")
    p.add_argument("--threads", type=int, metavar="N",
                   help="torch CPU threads for the passes (default: torch's own choice)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_prune_eval)

    s = asub.add_parser(
        "selectinfer", help="SelectInfer neuron selection on the real model vs random: perplexity, agreement",
        description="Mask every FFN to a selected neuron set (profiler ranking: base then secondary "
        "neurons up to gamma; of those, static + prefill-voted dynamic neurons up to the compute ratio) "
        "and measure perplexity and greedy-token agreement with the dense model on held-out prompts, "
        "against a seeded random selection of the same sizes.")
    s.add_argument("--model", default="smollm2-135m", help="smollm2-135m (embedded) or a Hugging Face model folder")
    s.add_argument("--trace", metavar="DIR",
                   help="trace to profile for the rankings (default: the shipped smollm2-135m-builtin trace); "
                   "builtin prompts in it are not evaluated")
    s.add_argument("--gamma", default="0.1,0.25,0.5", metavar="G,...",
                   help="fractions of each layer's neurons loaded (default 0.1,0.25,0.5)")
    s.add_argument("--compute-ratio", default="1.0,0.5", metavar="R,...",
                   help="fractions of the LOADED neurons computed at answer tokens (default 1.0,0.5)")
    s.add_argument("--static-share", type=float, default=None, metavar="S",
                   help="fraction of the loaded neurons taken from the task's base ranking and always "
                   "computed (default 0.25)")
    s.add_argument("--alpha", type=float, default=None, metavar="A",
                   help="fraction of the pool each prompt token votes for (default 0.1)")
    s.add_argument("--max-new-tokens", type=int, default=None, metavar="G",
                   help="dense greedy answer length per prompt (default 32)")
    s.add_argument("--tasks", metavar="T,...", help="only these tasks (default: every builtin task)")
    s.add_argument("--prompts-per-task", type=int, default=None, metavar="N",
                   help="held-out prompts per task (default: all)")
    s.add_argument("--seed", type=int, default=0, help="seed of the random selection (default 0)")
    s.add_argument("--threads", type=int, metavar="N",
                   help="torch CPU threads (default: torch's own choice)")
    s.add_argument("--out", metavar="FILE.csv", help="also write the table as CSV")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=_selectinfer)


# ---- shared checks ---------------------------------------------------------------------------------------
def _float_list(text: str, name: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise FlashsimError(f"{name} {text!r}: give numbers separated by commas, e.g. 0.1,0.25") from None
    if not values:
        raise FlashsimError(f"{name} {text!r}: give at least one number")
    return values


def _int_list(text: str, name: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise FlashsimError(f"{name} {text!r}: give integers separated by commas, e.g. 0,4,8,16") from None
    if not values or any(v < 0 for v in values):
        raise FlashsimError(f"{name} {text!r}: give one or more integers >= 0")
    return values


def _n_layers_before_load(model: str) -> int | None:
    """Layer count from the model's config without loading weights (None when only a load can tell)."""
    from traces.capture.models import EMBEDDED_MODELS, resolve_model_source

    kind, path, name = resolve_model_source(model)  # unknown model -> one line, before the slow load
    if kind == "hf":
        try:
            cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise FlashsimError(f"{path / 'config.json'}: not readable JSON ({e})") from None
        n = cfg.get("num_hidden_layers")
        return n if isinstance(n, int) and n > 0 else None
    if name in EMBEDDED_MODELS:
        from devices import load_model

        return load_model(name).n_layers
    return None


def _load(model: str) -> tuple[Any, Any, Any, float]:
    from traces.capture.models import load_hf_model

    t0 = time.perf_counter()
    loaded = load_hf_model(model, notify=lambda m: print(m, file=sys.stderr))
    return loaded.model, loaded.tokenizer, loaded.spec, time.perf_counter() - t0


def _fmt(x: float, digits: int = 3) -> str:
    return f"{x:.{digits}f}" if math.isfinite(x) else "inf"


# ---- prune-eval ------------------------------------------------------------------------------------------
def _eval_text(arg: str) -> tuple[str, str]:
    """(text, source) for --text."""
    from real.studies.gsi import BUILTIN_TEXT

    if arg == "builtin":
        return BUILTIN_TEXT, "builtin"
    if arg == "prompts":
        from traces.capture.prompts import load_prompts

        return "\n\n".join(p.text for p in load_prompts("builtin")), "prompts"
    try:
        return Path(arg).read_text(encoding="utf-8"), arg
    except FileNotFoundError:
        raise FlashsimError(f"--text {arg}: no such file (give builtin, prompts or a UTF-8 file)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise FlashsimError(f"--text {arg}: cannot read as UTF-8 text ({e})") from None


def _prune_eval(args: argparse.Namespace) -> int:
    from adapt.importance import read_gsi_file
    from sim.blocks import parse_blocks

    if args.drop is not None and args.gsi_steps is not None:
        raise FlashsimError("--drop and --gsi-steps: give one drop set (--drop) or GSI prefixes (--gsi-steps)")
    if args.drop is not None and args.gsi:
        raise FlashsimError("--drop and --gsi: give either one --drop set or a --gsi file, not both")
    if args.gsi_steps is not None and not args.gsi:
        raise FlashsimError("--gsi-steps needs --gsi FILE")
    if args.drop is None and not args.gsi:
        raise FlashsimError("prune-eval needs --drop BLOCKS or --gsi FILE (from `flashsim adapt gsi`)")
    if args.max_tokens < 2:
        raise FlashsimError(f"--max-tokens {args.max_tokens}: must be >= 2 (perplexity needs a next token)")
    if args.repeats < 1:
        raise FlashsimError(f"--repeats {args.repeats}: must be >= 1")
    if args.threads is not None and args.threads < 1:
        raise FlashsimError(f"--threads {args.threads}: must be >= 1")
    text, source = _eval_text(args.text)
    n_layers = _n_layers_before_load(args.model)
    doc = read_gsi_file(args.gsi) if args.gsi else None
    drop_sets: list[list[str]] = []
    steps: list[int | None] = []
    if doc is not None:
        file_layers = doc["model"]["n_layers"]
        if n_layers is not None and file_layers != n_layers:
            raise FlashsimError(f"--gsi {args.gsi}: computed for {doc['model'].get('name')!r} with {file_layers} "
                                f"layers, but --model {args.model} has {n_layers}")
        n_layers = file_layers
        from real.studies.pruning import gsi_prefixes

        if args.gsi_steps is None:
            steps = [k for k in DEFAULT_GSI_STEPS if k <= 2 * file_layers]
        else:
            steps = _int_list(args.gsi_steps, "--gsi-steps")
        drop_sets = gsi_prefixes(doc, steps)  # FlashsimError for a step the file does not reach
    elif n_layers is not None:
        drop = parse_blocks(args.drop, n_layers, where="--drop")
        from sim.blocks import block_names

        names = block_names(n_layers)
        drop_sets, steps = [[], [names[i] for i in drop.nonzero()[0]]], [None, None]

    model, tokenizer, spec, load_s = _load(args.model)
    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if doc is None and n_layers is None:  # a GGUF path: the layer count is known only now
        drop = parse_blocks(args.drop, spec.n_layers, where="--drop")
        from sim.blocks import block_names

        names = block_names(spec.n_layers)
        drop_sets, steps = [[], [names[i] for i in drop.nonzero()[0]]], [None, None]
    if doc is not None and doc["model"]["n_layers"] != spec.n_layers:
        raise FlashsimError(f"--gsi {args.gsi}: computed for {doc['model']['n_layers']} layers, the model has "
                            f"{spec.n_layers}")

    from real.studies.gsi import tokenize_text
    from real.studies.pruning import measure_drop_sets

    input_ids = tokenize_text(tokenizer, text, args.max_tokens)
    t0 = time.perf_counter()
    rows = measure_drop_sets(model, input_ids, drop_sets, repeats=args.repeats)
    eval_s = time.perf_counter() - t0
    sha = hashlib.sha256(text.encode("utf-8")).hexdigest()
    in_sample = doc is not None and doc["text"].get("sha256") == sha and \
        doc["text"].get("n_tokens") == int(input_ids.shape[1])
    gsi_ppl = {}
    if in_sample:  # the file's perplexity after k steps is measured on the same tokens: a cross-check
        gsi_ppl = {k + 1: r["ppl_after"] for k, r in enumerate(doc["gsi"])}
        gsi_ppl[0] = doc["dense_ppl"]
    for k, r in zip(steps, rows):
        r["gsi_steps"] = k
        if k is not None:  # how many of the k blocks are greedy GSI steps (the rest: one-shot order)
            r["from_gsi"] = min(k, len(doc["gsi"]))
        if k is not None and k in gsi_ppl:
            r["gsi_file_ppl"] = gsi_ppl[k]
    notes = []
    if doc is not None and any(k is not None and k > len(doc["gsi"]) for k in steps):
        notes.append(f"the GSI file has {len(doc['gsi'])} greedy steps; blocks beyond them follow the one-shot "
                     "order (the removal order the controllers use)")
    if in_sample:
        notes.append("the evaluation text is the GSI calibration text (in-sample); gsi_file_ppl is the file's "
                     "perplexity for the same blocks and must equal ppl")
    out = {"model": spec.name, "text": {"source": source, "sha256": sha, "n_tokens": int(input_ids.shape[1])},
           "gsi": args.gsi, "repeats": args.repeats, "torch_threads": torch.get_num_threads(),
           "rows": rows, "notes": notes,
           "timing": {"load_s": round(load_s, 3), "eval_s": round(eval_s, 3)}}
    if args.json:
        print_json(out)
        return 0
    print(f"{spec.name}: {int(input_ids.shape[1])} tokens of {source}; dense ppl {_fmt(rows[0]['dense_ppl'])}, "
          f"{rows[0]['dense_s_per_pass_min'] * 1000:.0f} ms/pass wall (fastest of {args.repeats}), "
          f"{rows[0]['dense_cpu_s_per_pass'] * 1000:.0f} ms CPU (median), {torch.get_num_threads()} torch thread(s)")
    table = []
    prev: list[str] = []
    for r in rows:
        added = [b for b in r["dropped"] if b not in prev] if r["gsi_steps"] is not None else r["dropped"]
        prev = r["dropped"]
        table.append(("-" if r["gsi_steps"] is None else r["gsi_steps"], r["n_dropped"],
                      ",".join(added) or "-", _fmt(r["ppl"]),
                      _fmt(r["gsi_file_ppl"]) if "gsi_file_ppl" in r else "-", _fmt(r["agreement"]),
                      f"{r['s_per_pass_min'] * 1000:.1f}", _fmt(r["time_ratio"]),
                      f"{r['cpu_s_per_pass'] * 1000:.1f}", _fmt(r["cpu_time_ratio"])))
    print_table(["steps", "dropped", "added blocks" if doc else "blocks", "ppl", "file_ppl", "agree",
                 "ms/pass", "time_ratio", "cpu_ms", "cpu_ratio"], table, align="rrlrrrrrrr")
    for n in notes:
        print(f"note: {n}")
    return 0


# ---- selectinfer -----------------------------------------------------------------------------------------
CSV_FIELDS = ("task", "gamma", "compute_ratio", "selection", "n_loaded", "n_computed", "ppl_answer", "agreement",
              "ppl_prompt", "agreement_prompt", "answer_tokens", "prompt_tokens", "passes", "seconds", "prompts")


def _write_csv(path: Path, rows: list[dict]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
            w.writeheader()
            for r in rows:
                w.writerow({**r, "prompts": ";".join(r["prompts"]), "n_loaded": r.get("n_loaded", ""),
                            "n_computed": r.get("n_computed", "")})
        replace_output(tmp, path)
    except OSError as e:
        raise FlashsimError(f"--out {path}: cannot write ({e.strerror})") from None
    finally:
        tmp.unlink(missing_ok=True)


def _selectinfer(args: argparse.Namespace) -> int:
    from real.studies import selectinfer_quality as sq
    from traces.capture.prompts import load_prompts
    from traces.data import shipped_trace_path
    from traces.format import open_trace
    from traces.profiler import profile_traces

    gammas = _float_list(args.gamma, "--gamma")
    ratios = _float_list(args.compute_ratio, "--compute-ratio")
    static_share = sq.DEFAULT_STATIC_SHARE if args.static_share is None else args.static_share
    alpha = sq.DEFAULT_ALPHA if args.alpha is None else args.alpha
    sq.check_settings(gammas, ratios, static_share, alpha)
    max_new = sq.DEFAULT_MAX_NEW_TOKENS if args.max_new_tokens is None else args.max_new_tokens
    if max_new < 1:
        raise FlashsimError(f"--max-new-tokens {max_new}: must be >= 1")
    if args.threads is not None and args.threads < 1:
        raise FlashsimError(f"--threads {args.threads}: must be >= 1")
    if args.prompts_per_task is not None and args.prompts_per_task < 1:
        raise FlashsimError(f"--prompts-per-task {args.prompts_per_task}: must be >= 1")
    out = output_file(args.out, "FILE.csv") if args.out else None
    trace_path = Path(args.trace) if args.trace else shipped_trace_path()
    trace = open_trace(trace_path)          # FlashsimError for a missing or damaged trace
    prompts = sq.held_out_prompts(load_prompts("builtin"), trace.manifest.prompts)
    all_tasks = sorted({p.task for p in prompts})
    if args.tasks:
        wanted = [t.strip() for t in args.tasks.split(",") if t.strip()]
        bad = [t for t in wanted if t not in all_tasks]
        if bad or not wanted:
            raise FlashsimError(f"--tasks {args.tasks}: unknown or fully profiled task(s) {', '.join(bad) or '(none)'}; "
                                f"held-out prompts exist for {', '.join(all_tasks)}")
        prompts = [p for p in prompts if p.task in wanted]
    if args.prompts_per_task:
        kept: list = []
        for p in prompts:
            if sum(q.task == p.task for q in kept) < args.prompts_per_task:
                kept.append(p)
        prompts = kept
    if not prompts:
        raise FlashsimError(f"--trace {trace_path}: every builtin prompt is in the trace; nothing is held out")
    n_layers = _n_layers_before_load(args.model)
    if n_layers is not None and n_layers != trace.n_layers:
        raise FlashsimError(f"--trace {trace_path}: {trace.n_layers} layers, but --model {args.model} has {n_layers}")
    profile = profile_traces([trace])

    model, tokenizer, spec, load_s = _load(args.model)
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    from traces.capture.generate import encode_prompt, eos_token_ids

    t0 = time.perf_counter()
    seqs = sq.answer_sequences(model, [(p.task, p.id, encode_prompt(tokenizer, p.text)) for p in prompts],
                               max_new, eos_token_ids(model, tokenizer))
    dense_s = time.perf_counter() - t0

    def progress(r: dict) -> None:
        if not args.json:
            print(f"{r['task']} gamma {r['gamma']} ratio {r['compute_ratio']} {r['selection']}: "
                  f"ppl {_fmt(r['ppl_answer'])}, agreement {r['agreement']:.3f}", file=sys.stderr)

    t0 = time.perf_counter()
    rows, notes = sq.run_selectinfer_quality(model, profile, seqs, gammas=gammas, ratios=ratios,
                                             static_share=static_share, alpha=alpha, seed=args.seed,
                                             progress=progress)
    eval_s = time.perf_counter() - t0
    if out is not None:
        _write_csv(out, rows)
    if args.trace is None:
        notes.insert(0, "rankings from the shipped trace smollm2-135m-builtin (builtin prompts 1-5, one per task; "
                     "scores from its top-31 |a| per token); evaluated on the other builtin prompts")
    doc = {"model": spec.name,
           "profile": {"trace": str(trace_path), "score": profile.meta["score"], "tasks": profile.tasks,
                       "tokens_per_task": profile.meta["tokens_per_task"],
                       "profiled_prompts": [p.id for p in trace.manifest.prompts]},
           "settings": {"gamma": gammas, "compute_ratio": ratios, "static_share": static_share, "alpha": alpha,
                        "max_new_tokens": max_new, "seed": args.seed},
           "held_out": {t: [s.prompt_id for s in seqs if s.task == t] for t in sorted({s.task for s in seqs})},
           "rows": rows, "summary": sq.summarize(rows), "notes": notes,
           "timing": {"load_s": round(load_s, 3), "dense_answers_s": round(dense_s, 3), "eval_s": round(eval_s, 3)},
           "out": str(out) if out else None}
    if args.json:
        print_json(doc)
        return 0
    print(f"{spec.name}: {len(seqs)} held-out prompts, {sum(s.n_answer for s in seqs)} answer tokens; "
          f"static_share {static_share}, alpha {alpha}, seed {args.seed}")
    table = [(r["task"], r["gamma"], r["compute_ratio"], r["selection"], _fmt(r["ppl_answer"]),
              _fmt(r["agreement"]), _fmt(r["ppl_prompt"])) for r in rows]
    print_table(["task", "gamma", "ratio", "selection", "ppl_answer", "agree", "ppl_prompt"], table,
                align="lrrlrrr")
    print("mean over tasks (ppl: geometric mean):")
    print_table(["gamma", "ratio", "selection", "ppl_answer", "agree"],
                [(s["gamma"], s["compute_ratio"], s["selection"], _fmt(s["ppl_answer_geomean"]),
                  _fmt(s["agreement_mean"])) for s in doc["summary"]], align="rrlrr")
    for n in notes:
        print(f"note: {n}")
    print(f"{eval_s:.1f} s ({sum(r['passes'] for r in rows)} masked passes); dense answers {dense_s:.1f} s")
    if out is not None:
        print(f"wrote {out}")
    return 0
