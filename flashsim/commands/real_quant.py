"""`flashsim real quant-quality`: int8 / int4 (Q8_0 / Q4_0-like) quantize-dequantize of a real model's
weights, alone and with oracle top-k FFN sparsity, measured against the native model (real/studies/quant_quality.py):
perplexity, next-token agreement and activation mass kept on the builtin prompts (or a text file).

`--out FILE.json` writes the quality table with its provenance (model and its native weight formats,
text and its sha256, command, date, torch version); the planner reads the shipped one,
analysis/data/quant_quality.json. Bad input fails with one line and exit 2 before the model loads.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import math
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from devices.errors import FlashsimError
from flashsim.output import output_file, print_json, print_table, to_jsonable
from traces.outputs import replace_output

DOC_KIND = "flashsim-quant-quality"
DOC_VERSION = 1


def register(rsub: argparse._SubParsersAction) -> None:
    q = rsub.add_parser(
        "quant-quality", help="int8/int4 weights (and oracle top-k FFN sparsity) on the real model: "
        "perplexity and next-token agreement vs the native model",
        description="Quantize-dequantize every weight matrix of the model (Q8_0 / Q4_0 rules: groups of 32, "
        "one fp16 scale each), optionally keep only the top-k FFN neurons per token by |a| (an exact "
        "predictor), and measure perplexity, greedy-token agreement with the native model and the "
        "activation mass kept, in one teacher-forced pass per configuration.")
    q.add_argument("--model", default="smollm2-135m", help="smollm2-135m (embedded), a Hugging Face model "
                   "folder, or a FILE.gguf")
    q.add_argument("--text", default="prompts", metavar="prompts|builtin|FILE",
                   help="evaluation text: the 20 builtin prompts joined by blank lines (prompts, default), the "
                   "GSI calibration paragraph (builtin), or a UTF-8 file")
    q.add_argument("--max-tokens", type=int, default=1024, metavar="T",
                   help="score the first T tokens of the text (default 1024: all of the builtin prompts)")
    q.add_argument("--bits", default="8,4", metavar="B,...", help="weight precisions: 8 (Q8_0) and/or 4 (Q4_0)")
    q.add_argument("--keep", default="1,0.9,0.75,0.5,0.3,0.2,0.1", metavar="F,...",
                   help="shares of FFN neurons kept per token by the oracle (1 = dense FFN)")
    q.add_argument("--threads", type=int, metavar="N", help="torch CPU threads (default: torch's own choice)")
    q.add_argument("--out", metavar="FILE.json", help="write the quality table (the planner's data file format)")
    q.add_argument("--json", action="store_true", help="print one JSON object")
    q.set_defaults(func=_quant_quality)


def _numbers(text: str, name: str, kind: type) -> list:
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise FlashsimError(f"{name} {text!r}: give numbers separated by commas") from None
    if not values:
        raise FlashsimError(f"{name} {text!r}: give at least one value")
    return values


def _text(arg: str) -> tuple[str, str]:
    if arg == "prompts":
        from traces.capture.prompts import load_prompts

        return "\n\n".join(p.text for p in load_prompts("builtin")), "prompts"
    if arg == "builtin":
        from real.studies.gsi import BUILTIN_TEXT

        return BUILTIN_TEXT, "builtin"
    try:
        return Path(arg).read_text(encoding="utf-8"), arg
    except FileNotFoundError:
        raise FlashsimError(f"--text {arg}: no such file (give prompts, builtin or a UTF-8 file)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise FlashsimError(f"--text {arg}: cannot read as UTF-8 text ({e})") from None


def native_formats(kind: str, path: Path) -> dict[str, int] | None:
    """Tensor type -> count of a GGUF file (what 'native' means for it); None for other sources."""
    if kind != "gguf":
        return None
    try:
        import gguf

        counts: dict[str, int] = {}
        for t in gguf.GGUFReader(str(path)).tensors:
            counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
        return dict(sorted(counts.items()))
    except Exception:  # provenance only: an unreadable header leaves the field empty
        return None


def _fmt(x: float, digits: int = 3) -> str:
    return f"{x:.{digits}f}" if math.isfinite(x) else "inf"


def _quant_quality(args: argparse.Namespace) -> int:
    from real.studies.quant_quality import check_settings, default_configs, measure_quality
    from traces.capture.models import load_hf_model, resolve_model_source

    bits = _numbers(args.bits, "--bits", int)
    keeps = _numbers(args.keep, "--keep", float)
    check_settings(bits, keeps)
    if args.max_tokens < 2:
        raise FlashsimError(f"--max-tokens {args.max_tokens}: must be >= 2 (perplexity needs a next token)")
    if args.threads is not None and args.threads < 1:
        raise FlashsimError(f"--threads {args.threads}: must be >= 1")
    text, source = _text(args.text)
    out = output_file(args.out, "FILE.json") if args.out else None
    kind, path, _ = resolve_model_source(args.model)   # unknown model -> one line, before the slow load
    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model, tokenizer, spec = load_hf_model(args.model, notify=lambda m: print(m, file=sys.stderr))
    load_s = time.perf_counter() - t0
    from real.studies.gsi import tokenize_text

    ids = tokenize_text(tokenizer, text, args.max_tokens)
    configs = default_configs(bits, keeps)

    def progress(r: dict) -> None:
        if not args.json:
            print(f"{r['label']}: ppl {_fmt(r['ppl'])}, agreement {r['agreement']:.3f} ({r['seconds']:.1f} s)",
                  file=sys.stderr)

    t1 = time.perf_counter()
    rows = measure_quality(model, ids, configs, progress=progress)
    eval_s = time.perf_counter() - t1
    doc: dict[str, Any] = {
        "kind": DOC_KIND, "version": DOC_VERSION,
        "model": {"name": spec.name, "total_params": spec.total_params, "source": os.path.basename(str(path)),
                  "native_formats": native_formats(kind, path),
                  "native": "the weights as loaded (dequantized to fp32 when the source is a GGUF), no sparsity"},
        "text": {"source": source, "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
                 "n_tokens": int(ids.shape[1])},
        "quantizer": {"group_size": 32, "scale": "fp16", "formats": {"int8": "Q8_0", "int4": "Q4_0"},
                      "tensors": "every nn.Linear / nn.Embedding weight matrix (tied weights once)"},
        "sparsity": "oracle top-k: per token, the round(keep*N) FFN neurons of largest |a| computed",
        "command": "flashsim real " + " ".join(shlex.quote(a) for a in sys.argv[sys.argv.index("quant-quality"):])
        if "quant-quality" in sys.argv else "flashsim real quant-quality",
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": {"machine": platform.machine(), "torch": torch.__version__, "torch_threads": torch.get_num_threads()},
        "rows": rows,
        "timing": {"load_s": round(load_s, 3), "eval_s": round(eval_s, 3)},
    }
    if out is not None:
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps(to_jsonable(doc), indent=1) + "\n", encoding="utf-8")
        replace_output(tmp, out)
    if args.json:
        print_json({**doc, "out": str(out) if out else None})
        return 0
    nf = doc["model"]["native_formats"]
    print(f"{spec.name}: {int(ids.shape[1])} tokens of {source}; native = the weights as loaded"
          + (f" ({', '.join(f'{k} x{v}' for k, v in nf.items())} in {doc['model']['source']})" if nf else ""))
    table = [[r["label"], _fmt(r["ppl"]), _fmt(r["ppl_ratio"], 4), f"{r['agreement']:.3f}", f"{r['mass_kept']:.3f}"]
             for r in rows]
    print_table(["configuration", "ppl", "ppl ratio", "agreement", "mass kept"], table, align="lrrrr")
    print(f"({len(rows)} passes in {eval_s:.1f} s; load {load_s:.1f} s; {torch.get_num_threads()} torch thread(s))")
    if out is not None:
        print(f"wrote {out}")
    return 0
