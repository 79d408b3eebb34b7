"""A real predictor replayed (`predictor=recorded`) beside the `noisy` predictor with the same
recall, precision and error memory, and memoryless: the table in docs/replay.md ("Predictor
errors with memory").

    .venv/bin/python scripts/recorded_vs_noisy.py --trace TRACE --recorded REC [--device apple-m1-max]
        [--dram-budget B] [--rank 32] [--window 5]

TRACE is a captured trace (`flashsim capture --sparsity RULE`), REC the predicted sets of its tokens
(`flashsim real predictor-errors --trace TRACE --record-out REC`). Recall, precision and the memories
are measured from the two traces on the generated tokens (`real.studies.predictor_errors`); every row is
`flashsim replay --trace TRACE --preset llm-in-a-flash --set window.k=K --json` plus the row's flags.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flashsim.main import main as flashsim  # noqa: E402
from real.studies.predictor_error_stats import measure  # noqa: E402
from real.studies.predictor_errors import tokens_from_traces  # noqa: E402
from traces.format import open_trace  # noqa: E402


def replay(args: argparse.Namespace, flags: list[str]) -> dict:
    base = ["replay", "--trace", args.trace, "--device", args.device, "--preset", "llm-in-a-flash",
            "--set", f"window.k={args.window}", "--json"]
    if args.dram_budget:
        base += ["--dram-budget", args.dram_budget]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = flashsim(base + flags)
    if rc != 0:
        raise SystemExit(f"flashsim replay {' '.join(flags)} exited {rc}")
    return json.loads(buf.getvalue())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--recorded", required=True)
    ap.add_argument("--device", default="apple-m1-max")
    ap.add_argument("--dram-budget")
    ap.add_argument("--rank", type=int, default=32, help="the recorded predictor's rank (its cost)")
    ap.add_argument("--window", type=int, default=5)
    args = ap.parse_args()
    o = measure(tokens_from_traces(open_trace(args.trace), open_trace(args.recorded)), 5)["decode"]["overall"]
    mem = {k: round(o[k], 3) for k in ("fp_memory", "fp_memory_far", "fn_memory", "fn_memory_far")}
    noisy = ["--set", "predictor=noisy", "--set", f"noisy.recall={o['recall']:.4f}",
             "--set", f"noisy.precision={o['precision']:.4f}", "--set", f"noisy.rank={args.rank}"]
    rows = [("oracle", ["--set", "predictor=oracle", "--set", f"oracle.rank={args.rank}"]),
            ("recorded (the real predictor)", ["--set", "predictor=recorded", "--set", f"recorded.path={args.recorded}",
                                               "--set", f"recorded.rank={args.rank}"]),
            ("noisy, measured memory", noisy + [a for k, v in mem.items() for a in ("--set", f"noisy.{k}={v}")]),
            ("noisy, memoryless", noisy + [a for k in mem for a in ("--set", f"noisy.{k}=0")])]
    print(f"generated tokens: recall {o['recall']:.3f}, precision {o['precision']:.3f}, FP rate {o['fp_rate']:.3f} "
          f"(repeats {o['fp_persistence'][0]:.3f} at the next token, {o['fp_persistence'][-1]:.3f} at 5), miss rate "
          f"{o['fn_rate']:.3f} (repeats {o['fn_persistence'][0]:.3f}, {o['fn_persistence'][-1]:.3f}); "
          + ", ".join(f"{k} {v}" for k, v in mem.items()))
    print()
    print("| predictor | recall | GB read/token | hit rate | I/O ms | ms/token |")
    print("|---|---|---|---|---|---|")
    for label, flags in rows:
        s = replay(args, flags)
        print(f"| {label} | {s['recall']:.3f} | {s['flash_bytes_per_token'] / 1e9:.4f} | {s['hit_rate']:.3f} | "
              f"{s['io_ms_per_token']:.2f} | {s['ms_per_token']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
