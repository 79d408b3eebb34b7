"""`flashsim adapt`: runtime adaptation to a memory budget (issue 7). For now: `adapt gsi`.

`adapt gsi` loads a real model, measures the perplexity of a calibration text, and writes the Greedy
Sequential Importance ordering of its MHA/FFN blocks plus the one-shot ordering (file format: the
docstring of real/studies/gsi.py). Bad input (unknown model, --steps < 1, a missing text file, an existing
directory as --out) fails before the model is loaded, with exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

from devices.errors import FlashsimError
from flashsim.output import output_file, print_json, print_table

# Passes for S steps: 1 (dense) + 2L (one-shot, also step 1) + sum over k=1..S-1 of (2L - k). SmolLM2-135M
# (2L = 60) at 256 tokens measured 0.44 s per pass in fp32 on 2 CPU cores, so the default 8 steps
# (453 passes) take ~3.3 min; `--steps all` (1831 passes) ~13.5 min (docs/adapt.md).
DEFAULT_STEPS = 8
DEFAULT_MAX_TOKENS = 256

# Further `adapt` sub-commands, one module each under flashsim/commands/ with `register(asub)` (asub: the
# `adapt` sub-parsers action); each module owns its sub-command's options and handler.
SUBCOMMAND_MODULES: tuple[str, ...] = ("adapt_real", "adapt_eval", "adapt_train")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("adapt", help="runtime adaptation to a memory budget (GSI block importance)",
                       description="Runtime adaptation: block importance orderings for pruning.")
    asub = p.add_subparsers(dest="adapt_command", metavar="SUBCOMMAND", parser_class=type(p))
    g = asub.add_parser(
        "gsi", help="Greedy Sequential Importance of MHA/FFN blocks on a real model",
        description="Repeatedly drop the MHA or FFN block whose removal raises the calibration "
        "perplexity least, re-scoring the rest after each drop; also the one-shot ordering. "
        "Cost: about 2L passes per step (see docs/adapt.md).",
    )
    g.add_argument("--model", default="smollm2-135m",
                   help="smollm2-135m (embedded), a Hugging Face model folder, or a FILE.gguf")
    g.add_argument("--text", metavar="FILE",
                   help="UTF-8 calibration text (default: a built-in paragraph)")
    g.add_argument("--steps", default=str(DEFAULT_STEPS), metavar="N",
                   help=f"greedy removals to make, 1..2L, or 'all' (default {DEFAULT_STEPS})")
    g.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, metavar="T",
                   help=f"score the first T tokens of the text (default {DEFAULT_MAX_TOKENS})")
    g.add_argument("--out", required=True, metavar="FILE.json", help="GSI file to write")
    g.add_argument("--json", action="store_true", help="print a JSON summary")
    g.set_defaults(func=_gsi)
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(f"flashsim.commands.{name}").register(asub)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _parse_steps(text: str) -> int | None:
    """--steps: an integer >= 1, or 'all' (None: every block)."""
    if text == "all":
        return None
    try:
        value = int(text)
    except ValueError:
        raise FlashsimError(f"--steps {text!r}: give an integer >= 1 or 'all'") from None
    if value < 1:
        raise FlashsimError(f"--steps {value}: must be >= 1 (or 'all')")
    return value


def _gsi(args: argparse.Namespace) -> int:
    from real.studies.gsi import BUILTIN_TEXT, gsi_document, run_gsi, tokenize_text, write_gsi_file
    from traces.capture.models import load_hf_model, resolve_model_source

    steps = _parse_steps(args.steps)
    if args.max_tokens < 2:
        raise FlashsimError(f"--max-tokens {args.max_tokens}: must be >= 2 (perplexity needs a next token)")
    out = output_file(args.out, "FILE.json")
    if args.text:
        try:
            text = Path(args.text).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise FlashsimError(f"--text {args.text}: no such file") from None
        except (OSError, UnicodeDecodeError) as e:
            raise FlashsimError(f"--text {args.text}: cannot read as UTF-8 text ({e})") from None
        source = str(args.text)
    else:
        text, source = BUILTIN_TEXT, "builtin"
    resolve_model_source(args.model)  # unknown model → one line, before the slow load

    t0 = time.perf_counter()
    model, tokenizer, spec = load_hf_model(args.model, notify=lambda m: print(m, file=sys.stderr))
    load_s = time.perf_counter() - t0
    input_ids = tokenize_text(tokenizer, text, args.max_tokens)
    n_tokens = int(input_ids.shape[1])

    def progress(step: int, block: str, ppl: float) -> None:
        if not args.json:
            print(f"step {step}: drop {block} -> ppl {ppl:.3f}", file=sys.stderr)

    result = run_gsi(model, input_ids, steps=steps, progress=progress)
    doc = gsi_document(result, model_name=spec.name, n_layers=spec.n_layers, text=text,
                       text_source=source, n_tokens=n_tokens)
    write_gsi_file(out, doc)
    timing = {"load_s": round(load_s, 3), "gsi_s": round(result.seconds, 3), "passes": result.n_passes,
              "s_per_pass": round(result.seconds_per_pass, 4)}
    if args.json:
        print_json({**doc, "out": str(out), "timing": timing})
        return 0
    print(f"{spec.name}: {n_tokens} tokens, dense ppl {result.dense_ppl:.3f}; "
          f"{result.n_passes} passes in {result.seconds:.1f} s ({result.seconds_per_pass * 1000:.0f} ms/pass)")
    alone = dict(result.one_shot)
    rows = [(k + 1, b, f"{p:.3f}", f"{alone[b]:.3f}") for k, (b, p) in enumerate(result.gsi)]
    print_table(["step", "block", "ppl_after", "ppl_alone"], rows)
    print(f"wrote {out}")
    return 0
