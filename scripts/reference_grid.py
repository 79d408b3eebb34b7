"""Regenerates a reference validation grid on this host, or slims a kept grid to commit it.

A reference grid is what `flashsim validate --keep DIR` leaves (real/validation/validate_keep.py: every
configuration's executed trace, run configuration and real per-token records, plus the profile the
grid was replayed with), made right after calibrating the host, so that `flashsim validate --rescore
DIR --profile kept` scores the simulator against those real runs on any machine, in seconds. The
repository carries three (tests/real/data/grids/; tests/real/test_reference_grids.py bounds the
simulator's error on them). To make one on your host:

    .venv/bin/python scripts/reference_grid.py tests/real/data/grids/NEW [--repeats 3] [--path DIR]

1. `flashsim calibrate --out WORK/profile.yaml`: bench flash (direct-I/O read grid on a bench file
   under --path) and bench compute, written as a profile of this host (never over
   devices/profiles/this-host.yaml), then calibrate's own quick validation;
2. `flashsim validate --profile WORK/profile.yaml --repeats N --keep WORK/grid`: the full grid
   (shape and model mode, 40 configurations each, 24 steps), N interleaved passes; about 10 minutes
   per pass on a 2-vCPU VM;
3. slim (below), then DIR is renamed into place. The calibration's JSON report is kept beside it as
   calibrate.json.

Slimming (`--slim-only DIR` does this step alone on an existing kept grid) drops what rescoring
never reads and compresses the rest, about 2.2 MB down to under 1 MB for a full grid:
* each executed trace is rewritten without its stored magnitudes (top_k 0: `top_idx`/`top_mag`
  hold the source trace's |a| for the quality proxy; the replay's reads, compute and timing follow
  the executed masks alone), renamed by its new digest, and grid.json points at the new name;
* runs.parquet is rewritten with zstd; grid.json without indentation.
The slimmed grid is rescored on its own profile and compared with the original, configuration by
configuration and metric by metric (real and simulated means of latency, I/O, compute, bytes and
the phases): any difference aborts and leaves DIR as it was.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devices.errors import FlashsimError  # noqa: E402
from real.validation.validate_keep import (  # noqa: E402
    GRID_FILE,
    RUNS_FILE,
    TRACES_DIR,
    load_kept_grid,
    rescore,
    trace_digest,
)

KEPT_ARRAYS = ("token_ids", "phase", "prompt_index", "masks", "abs_sum")


def _slim_trace(src: Path, out: Path) -> None:
    """`src` rewritten without stored magnitudes (top_k 0), same masks, ids and sums."""
    import numpy as np

    from traces.format import PromptInfo, TraceWriter, open_trace

    t = open_trace(src)
    m = t.manifest
    with TraceWriter(out, t.spec, m.n_tokens, 0, m.sparsity, [PromptInfo(**p.model_dump()) for p in m.prompts],
                     synthetic=m.synthetic, provenance={**m.provenance, "magnitudes": "dropped (top_k 0)"}) as w:
        for name in KEPT_ARRAYS:
            getattr(w, name)[...] = np.asarray(t._a[name])


def _scored(report: dict) -> list[dict]:
    """What a rescore compares: per configuration, each metric's real and simulated means."""
    return [{m: (v["real"], v["sim"]) for m, v in c["metrics"].items()} for c in report["configs"]]


def slim(keep: Path, check: bool = True) -> Path:
    """Rewrites the kept grid `keep` compactly in place (module docstring); returns it."""
    import pandas as pd

    keep = Path(keep)
    doc = load_kept_grid(keep)
    if doc["version"] != 2:
        raise FlashsimError(f"{keep}: format version {doc['version']}; slim reads version 2 grids")
    tmp = Path(tempfile.mkdtemp(prefix=f".{keep.name}.slim.", dir=keep.parent))
    try:
        for f in keep.iterdir():   # everything but the traces, runs and grid.json as it is
            if f.name not in (TRACES_DIR, RUNS_FILE, GRID_FILE):
                (shutil.copytree if f.is_dir() else shutil.copy2)(f, tmp / f.name)
        renamed = {}
        for c in doc["configs"]:
            if c["trace"] not in renamed:
                staged = tmp / ".trace"
                _slim_trace(keep / c["trace"], staged)
                name = f"{TRACES_DIR}/{trace_digest(staged)}"
                if (tmp / name).exists():
                    shutil.rmtree(staged)
                else:
                    (tmp / TRACES_DIR).mkdir(exist_ok=True)
                    os.replace(staged, tmp / name)
                renamed[c["trace"]] = name
            c["trace"] = renamed[c["trace"]]
        runs = pd.read_parquet(keep / RUNS_FILE)
        runs.to_parquet(tmp / RUNS_FILE, index=False, compression="zstd", compression_level=19)
        (tmp / GRID_FILE).write_text(json.dumps(doc, separators=(",", ":")))
        if check:
            before, after = _scored(rescore(keep)), _scored(rescore(tmp))
            if before != after:
                bad = next(i for i, (a, b) in enumerate(zip(before, after)) if a != b)
                raise FlashsimError(f"{keep}: the slimmed grid scores differently (configuration {bad}); left as it was")
        old = keep.with_name(f".{keep.name}.old")
        os.replace(keep, old)
        os.replace(tmp, keep)
        shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return keep


def _flashsim(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "flashsim", *args]
    print("+ flashsim " + " ".join(args), file=sys.stderr, flush=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.PIPE, text=True)


def regenerate(out: Path, repeats: int, path: str | None, threads: int) -> Path:
    """Calibrate this host, validate the full grid against that calibration with --keep, slim, and
    rename into `out` (module docstring)."""
    out = Path(out)
    if out.exists():
        raise FlashsimError(f"{out}: already exists; give a new folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.", dir=out.parent) as work:
        work = Path(work)
        profile = work / "profile.yaml"
        cal = _flashsim("calibrate", "--out", str(profile), "--name", f"reference-{out.name}",
                        "--threads", str(threads), "--workdir", str(work), "--json",
                        *(["--path", path] if path else []))
        _flashsim("validate", "--profile", str(profile), "--repeats", str(repeats), "--threads", str(threads),
                  "--workdir", str(work), "--keep", str(work / "grid"), "--json")
        (work / "grid" / "calibrate.json").write_text(cal.stdout)
        slim(work / "grid")
        os.replace(work / "grid", out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="the new grid folder (with --slim-only: an existing kept grid, slimmed in place)")
    p.add_argument("--slim-only", action="store_true", help="only slim an existing kept grid")
    p.add_argument("--no-check", action="store_true", help="slim without rescoring before and after")
    p.add_argument("--repeats", type=int, default=3, help="real passes over the grid (default 3)")
    p.add_argument("--threads", type=int, default=1, help="compute threads, calibrated and run (default 1)")
    p.add_argument("--path", help="folder on the disk to bench (default: the current directory)")
    args = p.parse_args(argv)
    try:
        if args.slim_only:
            slim(Path(args.out), check=not args.no_check)
        else:
            regenerate(Path(args.out), args.repeats, args.path, args.threads)
    except FlashsimError as e:
        print(f"reference_grid: {e}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as e:
        print(f"reference_grid: `{' '.join(e.cmd[3:])}` failed (exit {e.returncode}); see its message above",
              file=sys.stderr)
        return 2
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
