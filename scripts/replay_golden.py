"""Dump `flashsim replay --json` (and a hash of the per-token records) for every preset under several
devices, budgets, engines and prefetchers on the shipped trace, or compare two dumps: a refactor that
must not change any result is checked by dumping before and after and comparing.

    python scripts/replay_golden.py dump OUT.json     # run from the checkout to measure
    python scripts/replay_golden.py cmp A.json B.json # exit 1 when any run differs
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

TRACE = "traces/data/smollm2-135m-builtin"
PRESETS = ("naive", "hybrid", "mmap", "dense", "quantized", "llm-in-a-flash", "neuroprefetcher", "selectinfer")
VARIANTS = {
    "orin": ["--device", "jetson-orin-nano-8gb"],
    "orin-des": ["--device", "jetson-orin-nano-8gb", "--engine", "des"],
    "orin-small": ["--device", "jetson-orin-nano-8gb", "--dram-budget", "300MiB", "--engine", "des"],
    "m1-7b": ["--device", "apple-m1-max", "--model", "llama-2-7b", "--rescale", "--dram-budget", "14GiB",
              "--tokens", "30"],
    "host-lookahead": ["--device", "this-host", "--dram-budget", "280MiB", "--set", "prefetch=lookahead"],
    "host-delta-noisy": ["--device", "this-host", "--dram-budget", "280MiB", "--set", "prefetch=delta",
                         "--set", "delta.recall=0.8", "--set", "predictor=noisy"],
    "host-fast": ["--device", "this-host", "--engine", "fast", "--dram-budget", "290MiB"],
}


def run(item: tuple[str, str], tmp: Path) -> tuple[str, dict]:
    preset, variant = item
    records = tmp / f"{preset}-{variant}.parquet"
    cmd = [sys.executable, "-m", "flashsim", "replay", "--trace", TRACE, "--preset", preset, "--json",
           "--records", str(records), *VARIANTS[variant]]
    p = subprocess.run(cmd, capture_output=True, text=True)
    digest = None
    if records.exists():
        import pandas as pd

        digest = hashlib.sha256(pd.read_parquet(records).to_csv().encode()).hexdigest()
    return f"{preset}/{variant}", {"rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr.strip()[-300:],
                                   "records_sha256": digest}


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "dump":
        with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(2) as ex:
            runs = dict(ex.map(lambda it: run(it, Path(tmp)), itertools.product(PRESETS, VARIANTS)))
        Path(argv[1]).write_text(json.dumps(runs, indent=1))
        print(f"{sum(r['rc'] == 0 for r in runs.values())} of {len(runs)} runs exit 0")
        return 0
    if len(argv) == 3 and argv[0] == "cmp":
        a, b = (json.loads(Path(p).read_text()) for p in argv[1:])
        differ = [k for k in a if a[k] != b.get(k)]
        for k in differ[:5]:
            print(k, *difflib.unified_diff(a[k]["stdout"].splitlines(), b[k]["stdout"].splitlines(), lineterm=""),
                  sep="\n")
        print(f"{len(differ)} of {len(a)} runs differ")
        return 1 if differ else 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
