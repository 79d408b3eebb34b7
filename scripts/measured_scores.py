"""Writes docs/measured/grids/*/scores.json: each committed validation grid's latency error (median,
p90, max) on its own calibration (`kept`) and on the committed `this-host`, as the simulator of this
checkout scores it (tests/real/test_measured_grids.py checks them). Run after a change to the
simulator's model: `.venv/bin/python scripts/measured_scores.py`; the diff shows what it moved.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devices import load_profile  # noqa: E402
from real.validate_keep import rescore  # noqa: E402

KEYS = ("latency_error_median", "latency_error_p90", "latency_error_max")


def main() -> int:
    grids = sorted(p.parent for p in (ROOT / "docs" / "measured" / "grids").glob("*/grid.json"))
    for keep in grids:
        scores = {}
        for key, profile in (("kept", None), ("this-host", load_profile("this-host"))):
            rep = rescore(keep, profile)
            scores[key] = {k: rep[k] for k in KEYS}
        tmp = keep / ".scores.json.tmp"
        tmp.write_text(json.dumps(scores, indent=1) + "\n")
        os.replace(tmp, keep / "scores.json")
        print(f"{keep.name}: " + "; ".join(f"{k} {v['latency_error_median']:.2%} / {v['latency_error_p90']:.2%}"
                                           for k, v in scores.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
