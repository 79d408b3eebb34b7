"""`flashsim capture`: run prompts through a real model and write an activation trace.

Wires `traces.capture` (model loading, hooks, decoding, sparsity) to the command line; the
summary it prints is read back from the written trace. Bad input (unknown model, malformed
prompts file, an existing --out) fails before the model is loaded, with exit code 2.
"""

from __future__ import annotations

import argparse
import math
import shlex
import time
from pathlib import Path

import numpy as np

from devices.errors import FlashsimError
from devices.progress import note, phase
from devices.units import format_bytes
from flashsim.output import print_json, print_table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "capture", help="capture FFN activations of a real model into a trace",
        description="Run prompts through a real model (prefill + greedy or sampled decode) with hooks on "
        "every FFN and write a trace directory (format v1, see docs/capture-and-traces.md).",
    )
    p.add_argument("--model", default="smollm2-135m",
                   help="smollm2-135m (embedded), a Hugging Face model folder, or a FILE.gguf (default smollm2-135m)")
    p.add_argument("--prompts", default="builtin",
                   help='"builtin" or a JSON-lines file of {"id", "task", "text"} (default builtin)')
    p.add_argument("--max-new-tokens", type=int, default=32, metavar="N",
                   help="tokens to generate per prompt; stops early at end-of-sequence (default 32)")
    p.add_argument("--out", required=True, metavar="DIR", help="trace directory to create")
    p.add_argument("--seed", type=int, default=0, help="seed for sampled decoding (default 0)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0 = greedy (default); > 0 samples from softmax(logits / T) with --seed")
    p.add_argument("--sparsity", metavar="RULE",
                   help="relu | threshold:F | topk:F (default: relu for ReLU FFNs, threshold:0.5 otherwise)")
    p.add_argument("--magnitude-fraction", type=_fraction_or_auto, default=None, metavar="F",
                   help="share of neurons whose |a| is stored per token, for re-thresholding; 'auto' "
                   "(default) stores just enough to re-derive the masks and any sparser rule")
    p.add_argument("--limit-prompts", type=int, metavar="N", help="use only the first N prompts")
    p.add_argument("--no-chat-template", action="store_true", help="feed the raw prompt text")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out trace")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.set_defaults(func=_capture)


def _fraction_or_auto(text: str) -> float | None:
    if text == "auto":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction in [0, 1] or 'auto'") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be in [0, 1]")
    return value


def command_line(args: argparse.Namespace) -> str:
    """The full command, every setting explicit, that reproduces this capture (for provenance)."""
    argv = ["flashsim", "capture", "--model", str(args.model), "--prompts", str(args.prompts),
            "--max-new-tokens", str(args.max_new_tokens), "--out", str(args.out), "--seed", str(args.seed)]
    if args.temperature:
        argv += ["--temperature", str(args.temperature)]
    if args.sparsity:
        argv += ["--sparsity", args.sparsity]
    argv += ["--magnitude-fraction", "auto" if args.magnitude_fraction is None else str(args.magnitude_fraction)]
    if args.limit_prompts:
        argv += ["--limit-prompts", str(args.limit_prompts)]
    if args.no_chat_template:
        argv.append("--no-chat-template")
    return shlex.join(argv)


def _capture(args: argparse.Namespace) -> int:
    from traces.capture import capture_trace, load_hf_model, load_prompts, resolve_model_source
    from traces.format import open_trace
    from traces.sparsity import parse_rule

    # Everything that can be checked without the model is checked first (seconds, not minutes).
    if args.sparsity:
        parse_rule(args.sparsity)
    if args.max_new_tokens < 0:
        raise FlashsimError(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        raise FlashsimError(f"--temperature must be a number >= 0, got {args.temperature}")
    out = Path(args.out)
    if out.exists() and not args.overwrite:
        raise FlashsimError(f"{out}: already exists; choose another --out, remove it or pass --overwrite")
    prompts = load_prompts(args.prompts, limit=args.limit_prompts)
    resolve_model_source(args.model)
    if _is_moe_folder(args.model):
        return _capture_routing(args, prompts)

    t0 = time.perf_counter()
    with phase(f"loading {args.model}"):
        loaded = load_hf_model(args.model, notify=note)
    t1 = time.perf_counter()
    capture_trace(loaded, prompts, out, max_new_tokens=args.max_new_tokens, sparsity=args.sparsity,
                  magnitude_fraction=args.magnitude_fraction, seed=args.seed, temperature=args.temperature,
                  chat_template=not args.no_chat_template, provenance={"command": command_line(args)},
                  progress=True, overwrite=args.overwrite)
    t2 = time.perf_counter()
    summary = trace_summary(open_trace(out))
    summary.update(load_s=round(t1 - t0, 3), capture_s=round(t2 - t1, 3),
                   tokens_per_s=round(summary["n_tokens"] / (t2 - t1), 2))
    if args.json:
        print_json(summary)
        return 0
    sp = summary["sparsity"]
    rule = sp["rule"] + (f":{sp['target_fraction']}" if sp["target_fraction"] else "")
    print(f"trace {summary['trace']}: {summary['model']}, {summary['n_prompts']} prompts, "
          f"{summary['n_tokens']} tokens ({summary['n_prefill_tokens']} prefill + "
          f"{summary['n_decode_tokens']} decode), {format_bytes(summary['size_bytes'])}")
    print(f"  sparsity {rule}: active fraction {summary['active_fraction']:.3f} "
          f"(layers {min(summary['active_fraction_per_layer']):.3f}..{max(summary['active_fraction_per_layer']):.3f}); "
          f"top {summary['top_k']} magnitudes stored per token")
    print(f"  model load {summary['load_s']:.1f} s, capture {summary['capture_s']:.1f} s "
          f"({summary['tokens_per_s']:.1f} tokens/s)")
    print_table(["task", "prompts", "prefill", "decode"],
                [[t, v["prompts"], v["prefill_tokens"], v["decode_tokens"]] for t, v in summary["tasks"].items()])
    return 0


def _is_moe_folder(model: str) -> bool:
    from devices.moe_spec import is_moe_model

    return Path(model).expanduser().is_dir() and is_moe_model(Path(model).expanduser())


def _capture_routing(args: argparse.Namespace, prompts: list) -> int:
    """An MoE model folder: record its routers (traces/capture/routing.py) into a routing trace."""
    from traces.capture.routing import capture_routing
    from traces.routing import open_routing_trace

    if args.sparsity or args.magnitude_fraction is not None:
        raise FlashsimError("capture: --sparsity and --magnitude-fraction are for FFN activation traces; an MoE "
                            "model folder gives a routing trace")
    t0 = time.perf_counter()
    out = capture_routing(args.model, prompts, args.out, max_new_tokens=args.max_new_tokens, seed=args.seed,
                          temperature=args.temperature, chat_template=not args.no_chat_template,
                          provenance={"command": command_line(args)}, overwrite=args.overwrite)
    t = open_routing_trace(out)
    phase = np.asarray(t.phase)
    summary = {"trace": str(out), "kind": "routing", "model": t.manifest.model, "n_prompts": len(prompts),
               "n_tokens": t.n_tokens, "n_prefill_tokens": int((phase == 0).sum()),
               "n_decode_tokens": int((phase == 1).sum()), "moe_layers": t.manifest.moe_layers,
               "n_experts": t.n_experts, "top_k": t.top_k, "capture_s": round(time.perf_counter() - t0, 3)}
    if args.json:
        print_json(summary)
        return 0
    print(f"routing trace {out}: {summary['model']}, {len(prompts)} prompts, {t.n_tokens} tokens "
          f"({summary['n_prefill_tokens']} prefill + {summary['n_decode_tokens']} decode), "
          f"{t.n_moe_layers} MoE layers x {t.n_experts} experts, top-{t.top_k}; see `flashsim trace stats {out}`")
    return 0


def trace_summary(trace) -> dict:
    """Counts and active fractions of a trace, read from its arrays."""
    phase = np.asarray(trace.phase)
    per_layer = [float(np.bitwise_count(trace.packed_masks(layer)).sum()) / (trace.n_tokens * trace.n_neurons)
                 for layer in range(trace.n_layers)]
    tasks: dict[str, dict[str, int]] = {}
    for p in trace.manifest.prompts:
        t = tasks.setdefault(p.task, {"prompts": 0, "prefill_tokens": 0, "decode_tokens": 0})
        t["prompts"] += 1
        t["prefill_tokens"] += p.n_prompt_tokens
        t["decode_tokens"] += p.n_generated_tokens
    return {
        "trace": str(trace.path), "model": trace.spec.name, "n_prompts": len(trace.manifest.prompts),
        "n_tokens": trace.n_tokens, "n_prefill_tokens": int((phase == 0).sum()),
        "n_decode_tokens": int((phase == 1).sum()), "n_layers": trace.n_layers, "n_neurons": trace.n_neurons,
        "sparsity": trace.manifest.sparsity.model_dump(mode="json", exclude={"thresholds"}),
        "active_fraction": float(np.mean(per_layer)), "active_fraction_per_layer": per_layer,
        "top_k": trace.top_k, "size_bytes": sum(f.stat().st_size for f in Path(trace.path).iterdir()),
        "tasks": tasks,
    }
