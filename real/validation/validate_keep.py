"""What `flashsim validate --keep DIR` leaves behind, and `flashsim validate --rescore DIR`, which
scores the simulator again against those real runs without running them again.

A full validation grid costs its real runs (tens of minutes for 80 configurations and three
passes); replaying it in the simulator costs seconds. Keeping what ran (each configuration's
executed trace, its run configuration and every real run's per-token records) lets a profile, or
a change to the simulator's model, be judged against the same measurements: the error of a second
profile is then a comparison on equal terms, not one against another grid whose host drifted.

Layout of DIR (written under a temporary name and renamed when complete, so a folder named DIR is
always a whole one). Version 2, compact enough to commit (a full grid of 80 configurations and
three passes: about 2 MB), so reference grids travel with the repository:

    grid.json              format version, the validation's settings, one entry per configuration:
                           mode, grid point, budget, run configuration (`RunConfig.to_dict`), model
                           spec, direct I/O, its executed trace, its number of passes and each real
                           run's midpoint (seconds into the validation)
    traces/HASH/           each distinct executed trace once (trace format v1;
                           real.runtime.run_outputs.write_executed_trace), named by a digest of its files: with
                           the oracle every configuration of a mode executes the same sets
    runs.parquet           every real run's per-token records (sim.records.TOKEN_COLUMNS), keyed by
                           the columns `config` (its index in grid.json) and `pass`
    profile.yaml           the device profile the validation replayed with (its calibration), so
                           `--rescore DIR --profile kept` scores the grid as it ran, on any machine

Version 1 (one folder per configuration with its own trace and a Parquet file per pass, no
profile) is still read.

Rescoring replays each executed trace on the given profile, compares as `validate` does
(real.validation.validate_score.compare: the mean over the passes, their spread as the noise floor, each pass
scored alone by the simulator and by the other passes) and reports the same summary, per mode and
per group. It has no drift correction: the host checks measured the host against the profile
validate ran with, not against the one rescored.

`rescore_many` scores one profile on several kept grids: each grid's summary, the spread of their
median and p90 errors, the single passes' scores (real.validation.validate_score.repeatability) and the
groups, both pooled over every configuration of every grid (a bias whose sign holds over grids
calibrated at different times is the model's, not one host state's) and the grids' real runs
against each other (`between_grids`: how far the host reproduces itself from grid to grid).
`profile=None` (the CLI's `--profile kept`) scores each grid on its own profile.yaml.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from devices.errors import FlashsimError

KEEP_VERSION = 2
READ_VERSIONS = (1, 2)
GRID_FILE = "grid.json"
RUNS_FILE = "runs.parquet"
PROFILE_FILE = "profile.yaml"
TRACES_DIR = "traces"
# the fields of a validate report row (real.validation.validate_runs._row) a kept configuration carries
ROW_KEYS = ("mode", "config", "k", "bundled", "prefetch", "budget_fraction", "budget_bytes", "direct_io")


def check_keep_target(keep: str | Path) -> Path:
    """The folder `--keep` will create, refused before any real run when it cannot be."""
    path = Path(keep)
    if path.exists():
        raise FlashsimError(f"--keep {keep}: already exists; give a new folder (validate never overwrites a kept grid)")
    if not path.parent.is_dir():
        raise FlashsimError(f"--keep {keep}: no such folder {path.parent}; create it first")
    if not os.access(path.parent, os.W_OK):
        raise FlashsimError(f"--keep {keep}: cannot write into {path.parent}")
    return path


def trace_digest(trace_dir: Path) -> str:
    """A digest of a trace folder's files (names and bytes): equal traces share one copy in DIR."""
    h = hashlib.sha256()
    for f in sorted(p for p in Path(trace_dir).iterdir() if p.is_file()):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def write_kept_grid(keep: Path, replays: list[tuple], settings: dict[str, Any], t0: float,
                    profile: Any = None, extra_files: dict[str, str] | None = None) -> Path:
    """Writes DIR from the validation's replays [(row, executed trace path, spec, run config, each
    pass's token records, each pass's perf_counter midpoint)] and the profile they were replayed
    with (written as profile.yaml when given); `extra_files`: {path in DIR: text} (a recalibrated
    validation's calibrations); returns DIR."""
    import pandas as pd

    from sim.records import Recorder

    tmp = Path(tempfile.mkdtemp(prefix=f".{keep.name}.", dir=keep.parent))
    try:
        entries, frames = [], []
        for i, (row, trace_path, spec, cfg, runs, times) in enumerate(replays):
            trace = f"{TRACES_DIR}/{trace_digest(trace_path)}"
            if not (tmp / trace).exists():
                shutil.copytree(trace_path, tmp / trace)
            for p, tokens in enumerate(runs):
                rec = Recorder()
                rec.tokens = tokens
                frame = rec.frame()
                frame.insert(0, "pass", p)
                frame.insert(0, "config", i)
                frames.append(frame)
            entries.append({**{k: row[k] for k in ROW_KEYS}, "trace": trace, "passes": len(runs),
                            "run_times_s": [round(t - t0, 3) for t in times],
                            "run_config": cfg.to_dict(), "spec": spec.model_dump(mode="json")})
        pd.concat(frames, ignore_index=True).to_parquet(tmp / RUNS_FILE, index=False)
        if profile is not None:
            from real.validation.profile_writer import profile_yaml

            (tmp / PROFILE_FILE).write_text(profile_yaml(profile, "flashsim validate --keep: the profile the grid "
                                                                  "was replayed with"))
        for rel, text in (extra_files or {}).items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_text(text)
        doc = {"format": "flashsim-validate-keep", "version": KEEP_VERSION, **settings, "configs": entries}
        (tmp / GRID_FILE).write_text(json.dumps(doc, indent=1))
        os.replace(tmp, keep)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return keep


def load_kept_grid(keep: str | Path) -> dict[str, Any]:
    """grid.json of a kept grid, checked (one-line FlashsimError naming the file otherwise)."""
    path = Path(keep) / GRID_FILE
    if not path.is_file():
        raise FlashsimError(f"--rescore {keep}: no {GRID_FILE} in it; give a folder written by `flashsim validate --keep`")
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise FlashsimError(f"{path}: not readable JSON ({e}); keep the grid again with `flashsim validate --keep`") from None
    if not isinstance(doc, dict) or doc.get("format") != "flashsim-validate-keep":
        raise FlashsimError(f"{path}: not a kept validation grid (format {doc.get('format') if isinstance(doc, dict) else None!r})")
    if doc.get("version") not in READ_VERSIONS:
        raise FlashsimError(f"{path}: version {doc.get('version')!r}, this flashsim reads versions "
                            f"{', '.join(map(str, READ_VERSIONS))}; keep the grid again with this version")
    if not isinstance(doc.get("configs"), list) or not doc["configs"]:
        raise FlashsimError(f"{path}: no configurations in it")
    return doc


LATER_COLUMNS = ("ffn_compute_s",)   # record columns added after KEEP_VERSION 1's first grids


def _tokens(df: Any, where: Any) -> list[Any]:
    """TokenRecords of one run's rows (sim.records.TOKEN_COLUMNS; the LATER_COLUMNS NaN if absent)."""
    from sim.records import TOKEN_COLUMNS, TokenRecord

    for c in LATER_COLUMNS:   # a grid kept before the records had them: NaN, which scoring leaves out
        if c not in df.columns:
            df[c] = float("nan")
    missing = [c for c in TOKEN_COLUMNS if c not in df.columns]
    if missing:
        raise FlashsimError(f"{where}: no column {missing[0]!r}; not per-token records of this flashsim")
    return [TokenRecord(**{c: (v.item() if hasattr(v, "item") else v) for c, v in zip(TOKEN_COLUMNS, row, strict=True)})
            for row in df[list(TOKEN_COLUMNS)].itertuples(index=False, name=None)]


def _read_parquet(path: Path) -> Any:
    import pandas as pd

    if not path.is_file():
        raise FlashsimError(f"{path}: missing; the kept grid is incomplete, keep it again")
    try:
        return pd.read_parquet(path)
    except Exception as e:   # pyarrow raises several types for a damaged file
        raise FlashsimError(f"{path}: not a readable Parquet file ({type(e).__name__}); keep the grid again") from None


def _records(path: Path) -> list[Any]:
    """A version 1 grid's run file."""
    return _tokens(_read_parquet(path), path)


def kept_runs(root: Path, doc: dict[str, Any]) -> list[list[list[Any]]]:
    """Every configuration's real runs (a list of passes, each a list of TokenRecords), in grid.json's
    order, from either version's files."""
    if doc["version"] == 1:
        return [[_records(root / f) for f in c["runs"]] for c in doc["configs"]]
    path = root / RUNS_FILE
    df = _read_parquet(path)
    if not {"config", "pass"} <= set(df.columns):
        raise FlashsimError(f"{path}: no config and pass columns; not the runs of a kept grid")
    groups = {key: g for key, g in df.groupby(["config", "pass"], sort=True)}
    out = []
    for i, c in enumerate(doc["configs"]):
        passes = c.get("passes")
        if not isinstance(passes, int) or passes < 1:
            raise FlashsimError(f"{root / GRID_FILE}: configuration {i}: no passes count; keep the grid again")
        runs = []
        for p in range(passes):
            if (i, p) not in groups:
                raise FlashsimError(f"{path}: no records of configuration {i}, pass {p}; the kept grid is incomplete")
            runs.append(_tokens(groups[(i, p)].drop(columns=["config", "pass"]).reset_index(drop=True),
                                f"{path} (configuration {i}, pass {p})"))
        out.append(runs)
    return out


def kept_profile(keep: str | Path) -> Any:
    """The profile a kept grid was replayed with (its profile.yaml), for `--profile kept`."""
    from devices import load_profile

    path = Path(keep) / PROFILE_FILE
    if not path.is_file():
        raise FlashsimError(f"--rescore {keep} --profile kept: no {PROFILE_FILE} in it (grids kept before format "
                            "version 2 did not keep their profile); give --profile NAME or a YAML file")
    return load_profile(str(path))


def rescore(keep: str | Path, profile: Any = None, progress: Any = None) -> dict[str, Any]:
    """The validate report of a kept grid's real runs against `profile` (module docstring; None: the
    grid's own profile.yaml)."""
    from devices.model_spec import ModelSpec
    from real.validation.validate_score import WARMUP_STEPS, compare, per_group, summarize
    from sim.config import RunConfig
    from sim.engine import simulate
    from traces.format import open_trace

    t0 = time.perf_counter()
    root = Path(keep)
    doc = load_kept_grid(root)
    own = profile is None
    if own:
        profile = kept_profile(root)
    try:
        all_runs = kept_runs(root, doc)
    except (KeyError, TypeError) as e:
        raise FlashsimError(f"{root / GRID_FILE}: {type(e).__name__}: {e}; keep the grid again") from None
    rows = []
    for i, c in enumerate(doc["configs"]):
        where = f"{root / GRID_FILE}: configuration {i}"
        runs = all_runs[i]
        try:
            cfg = RunConfig.from_dict(c["run_config"], where=where)
            spec = ModelSpec.model_validate(c["spec"])
            trace_dir = root / c["trace"]
        except (KeyError, TypeError, ValueError) as e:
            raise FlashsimError(f"{where}: {type(e).__name__}: {e}; keep the grid again") from None
        if not runs or any(len(r) <= WARMUP_STEPS for r in runs):
            raise FlashsimError(f"{where}: a real run has {WARMUP_STEPS} or fewer steps; nothing to compare")
        sim = simulate(open_trace(trace_dir), spec, profile, cfg, fast=False)
        rows.append({**{k: c[k] for k in ROW_KEYS}, "metrics": compare(runs[0], sim.tokens, runs[1:])})
        if progress:
            progress(len(rows), len(doc["configs"]), c["config"], rows[-1]["metrics"]["latency_s"]["error"])
    from real.validation.calibration import calibration_points

    modes = list(dict.fromkeys(r["mode"] for r in rows))
    calibration = calibration_points(profile, [r["config"] for r in rows])
    fitted = calibration["grid_configs"]
    report = summarize(rows, fitted)
    report["per_mode"] = {m: summarize([r for r in rows if r["mode"] == m], fitted) for m in modes}
    report["calibration"] = calibration
    report["per_group"] = per_group(rows)
    report.update({"rescored_from": str(root), "validated_with_profile": doc.get("profile"), "modes": modes,
                   "mode": "+".join(modes), "profile": profile.name, "profile_kept": own, "tokens": doc.get("tokens"),
                   "warmup_steps": WARMUP_STEPS, "quick": doc.get("quick"), "seed": doc.get("seed"),
                   "repeats": doc.get("repeats"), "direct_io": all(r["direct_io"] for r in rows),
                   "configs": rows, "wall_s": time.perf_counter() - t0})
    return report


# a grid's summary in `rescore_many`: these keys of its rescore report, and its latency noise floor
GRID_SUMMARY_KEYS = ("rescored_from", "validated_with_profile", "n_configs", "repeats", "latency_error_median",
                     "latency_error_p90", "latency_error_max")


def rescore_many(keeps: list[str | Path], profile: Any = None, progress: Any = None) -> dict[str, Any]:
    """One profile on several kept grids (module docstring): `grids` (each grid's summary; its
    real passes' latency spread, `noise_latency_median` / `_p90`; each pass scored alone by the
    simulator, `pass_latency_error_median` / `_p90`, and by the other passes' mean,
    `rest_latency_error_median` / `_p90` (real.validation.validate_score.repeatability); None with one pass),
    `latency_error_median` / `latency_error_p90` ({median, min, max} over the grids' own values),
    `repeatability`, `convergence` and `per_group` (real.validation.validate_score's, over the configurations of
    all the grids), `between_grids` (real.validation.validate_score's: how far the grids' real runs of the same
    configurations agree, the host's reproducibility from one grid to another) and `per_grid` (each
    grid's whole rescore report). A grid's `unlimited_latency_error_median` / `_p90` are its
    `convergence` estimate for unlimited passes, `level_removed_latency_error_median` / `_p90`
    its `level_removed` error (one factor per mode out), and `floor` its simulator-beside-repeat
    figures and pass line (real.validation.validate_score.floor)."""

    from real.validation.validate_score import (
        between_grids,
        convergence,
        median_range,
        per_group,
        repeatability,
    )

    t0 = time.perf_counter()
    for k in keeps:     # every folder checked before any is replayed: a bad one fails fast
        load_kept_grid(Path(k))
        if profile is None:
            kept_profile(k)

    def labelled(keep: str | Path) -> Any:     # each progress line names its grid
        if progress is None:
            return None
        return lambda i, n, label, err: progress(i, n, f"{Path(keep).name}: {label}", err)

    reports = [rescore(k, profile, labelled(k)) for k in keeps]
    grids = []
    for rep in reports:
        noise = (rep.get("noise_floor") or {}).get("latency_s") or {}
        alone = (rep.get("repeatability") or {}).get("latency_s") or {}
        sim, rest = alone.get("simulator") or {}, alone.get("other_passes") or {}
        left = ((rep.get("convergence") or {}).get("latency_s") or {}).get("unlimited") or {}
        level = rep.get("level_removed") or {}
        grids.append({**{k: rep.get(k) for k in GRID_SUMMARY_KEYS},
                      "noise_latency_median": noise.get("median"), "noise_latency_p90": noise.get("p90"),
                      "pass_latency_error_median": sim.get("median"), "pass_latency_error_p90": sim.get("p90"),
                      "rest_latency_error_median": rest.get("median"), "rest_latency_error_p90": rest.get("p90"),
                      "unlimited_latency_error_median": left.get("median"), "unlimited_latency_error_p90": left.get("p90"),
                      "level_removed_latency_error_median": level.get("median"),
                      "level_removed_latency_error_p90": level.get("p90"), "floor": rep.get("floor")})

    def spread(key: str) -> dict[str, float]:
        return median_range([g[key] for g in grids])

    rows = [row for rep in reports for row in rep["configs"]]    # every configuration of every grid
    return {"profile": profile.name if profile is not None else "kept", "n_grids": len(grids), "grids": grids,
            "latency_error_median": spread("latency_error_median"), "latency_error_p90": spread("latency_error_p90"),
            "n_configs": len(rows), "repeatability": repeatability(rows),
            "convergence": {"latency_s": convergence(rows)}, "per_group": per_group(rows),
            "between_grids": between_grids(reports), "per_grid": reports, "wall_s": time.perf_counter() - t0}
