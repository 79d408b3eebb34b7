"""Validation: run a grid of configurations on the real backend, replay what each run did in the
simulator, and report the simulator's relative error per metric (times in seconds, sizes in bytes).

For each configuration (window k x bundling x prefetch x budget) and mode:
1. the real backend executes it: shape mode (`real.runtime.shape_mode.run_shape`: a random-weight store of a
   small llama shape, active sets from a synthetic trace) and model mode (`real.runtime.model_mode`:
   SmolLM2-135M token by token on a fixed text, its real FFN weights streamed from a store converted
   from the embedded model, active sets the oracle top-`MODEL_KEEP` of the dense activations); real
   direct-I/O reads, real sparse compute in both;
2. the computed sets it executed are written as a trace (`real.runtime.run_outputs.write_executed_trace`);
3. the simulator replays that trace with the same policies (predictor = oracle on the executed sets,
   so both see exactly the same neurons), the same budget and the device profile (`this-host` or
   --profile);
4. per metric the error is |mean_sim - mean_real| / mean_real over the run's steps (the first
   `WARMUP_STEPS` steps skipped on both sides: cold caches, thread start-up and allocator warm-up
   belong to neither model).

The moe mode scores expert caches on an expert store the same way (interleaved passes, the same
metrics, floor and pass rule), its simulator being the MoE timeline: real/validation/validate_moe.py.

The modules: the grid (configurations, budgets, model mode's settings) is
real/validation/validate_grid.py; steps 1-3 per mode, real/validation/validate_runs.py; the scoring
(metrics, summaries, groups, each pass alone), real/validation/validate_score.py; the scatter plot,
real/validation/validate_plot.py. This module owns the whole validation (`run_validation`: the modes
in turn, the drift checks and recalibrations between real runs, `--keep`) and assembles its report
(the summaries, the drift-corrected errors, the host's load, provenance).

Nothing is fitted: the simulator runs with the profile as written. The replay uses the store's layout
alignment (`real.runtime.executor_plan.store_config`: `bundling.align_bytes` = 4096 for the padded
stores used here), so bytes read agree exactly in both modes.

The run records the host's load at start and end (real/bench/host_load.py); other work keeping cores
busy at the start means the timing errors are not trustworthy (a warning is printed on stderr).
The end value includes the grid's own reader threads.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from real.bench.host_load import host_load, load_warning
from real.validation.validate_grid import DEFAULT_REPEATS, MODES, grid, model_grid, validation_spec
from real.validation.validate_runs import model_rows, shape_rows
from real.validation.validate_score import WARMUP_STEPS, compare, per_group, summarize


def run_validation(profile: Any, *, quick: bool = False, tokens: int | None = None, seed: int = 0,
                   workdir: str | Path | None = None, progress: Any = None, threads: int | None = None,
                   modes: tuple[str, ...] = MODES, repeats: int = DEFAULT_REPEATS,
                   check_every_s: float | None = None, keep: str | Path | None = None,
                   recalibrate_every_s: float | None = None, moe_store: str = "small") -> dict[str, Any]:
    """Runs the grid in each mode; returns the JSON report (summary, per-mode summaries, one row per
    configuration, provenance). threads None: the profile's `compute.threads` (1 if it has none).
    repeats: the real side runs the whole grid that many times over (interleaved passes, so drift of
    the host over minutes shows too); errors use the mean, `noise_floor` reports the runs' spread and
    `floor` the simulator's error beside the passes' repeat spread with the pass rule
    (real.validation.validate_score.floor), scored on the configurations no fitting step saw (`calibration`: what
    the profile's calibration measured; none of it is a grid configuration). `drift`:
    the host against the profile at the start and the end; `drift_checks`: those and the checks
    between real runs every `check_every_s` (None: real.validation.drift.CHECK_EVERY_S; 0: after every real run, so
    each run sits between two checks); `drift_corrected`: the errors with each
    configuration replayed on the profile as the checks found the host while it ran (real/validation/drift.py).
    `keep`: a new folder to keep the executed traces and the real runs' records in, for
    `flashsim validate --rescore` (real/validation/validate_keep.py); refused before any run if it exists.
    `recalibrate_every_s`: calibrate the host (bench flash + bench compute, real.validation.calibration) at the
    start, between real runs once that many seconds of runs have passed since the last calibration,
    and at the end, and score the runs against the calibrations' mean (real.validation.profile_merge) instead of
    `profile`, which stays the base of each calibration and the drift checks' reference;
    `recalibration` reports the calibrations' times and the errors against `profile` too.
    `moe_store`: the expert store of the moe mode (real.validation.validate_moe: "small", or
    "large", 3 GiB); MoE rows are scored against `profile` as given (not kept, drift-corrected or
    recalibrated)."""
    from devices.errors import FlashsimError
    from real.validation.drift import CHECK_EVERY_S, DriftLog, drift_warning
    from real.validation.validate_keep import check_keep_target, write_kept_grid
    from real.validation.validate_moe import moe_grid, moe_rows, store_shape

    if repeats < 1:
        raise FlashsimError(f"--repeats {repeats}: give 1 or more real runs per configuration")
    if check_every_s is None:
        check_every_s = CHECK_EVERY_S
    if not check_every_s >= 0:
        raise FlashsimError(f"--check-every {check_every_s}: give seconds >= 0 (0 checks the host after every real run)")
    if recalibrate_every_s is not None and not recalibrate_every_s > 0:
        raise FlashsimError(f"--recalibrate-every {recalibrate_every_s}: give seconds > 0 of real runs between "
                            "calibrations")
    if workdir is not None and not Path(workdir).is_dir():
        raise FlashsimError(f"--workdir {workdir}: no such folder; create it, or omit --workdir for the system temp folder")
    if threads is None:
        threads = profile.compute.threads or 1
    moe_shape = store_shape(quick, moe_store)
    keep_path = check_keep_target(keep) if keep is not None else None
    load_start = host_load()
    t0 = time.perf_counter()
    n_tokens = tokens or (12 if quick else 24)
    tmp = tempfile.TemporaryDirectory(prefix="flashsim-validate-", dir=workdir)
    root = Path(tmp.name)
    rows: list[dict[str, Any]] = []
    info: dict[str, Any] = {}
    n_total = ((len(grid(quick)) if "shape" in modes else 0) + (len(model_grid(quick)) if "model" in modes else 0)
               + (len(moe_grid(quick)) if "moe" in modes else 0))
    log = DriftLog(profile, root, seed, every_s=check_every_s)
    recal = None
    if recalibrate_every_s is not None:
        from real.validation.calibration import Recalibrator

        recal = Recalibrator(root / "calibration", profile, recalibrate_every_s, threads=threads, seed=seed)
    between = _Between(log, recal)
    replays: list[tuple] = []     # (row, trace path, spec, config, real token runs, their times) for drift_corrected
    scored_with, recalibration = profile, None
    try:
        if recal is not None:
            recal.run()
        log.check()
        if "shape" in modes:
            info["shape"] = shape_rows(profile, validation_spec(quick), grid(quick), n_tokens, seed, root / "shape",
                                       threads, rows, progress, n_total, repeats, replays=replays, drift=between)
        if "model" in modes:
            info["model"] = model_rows(profile, model_grid(quick), n_tokens, seed, root / "model", threads, rows,
                                       progress, n_total, repeats, replays=replays, drift=between)
        if "moe" in modes:
            info["moe"] = moe_rows(profile, moe_grid(quick), moe_shape, n_tokens, seed, root / "moe", threads, rows,
                                   progress, n_total, repeats, drift=between)
        log.check()
        corrected = _drift_corrected(profile, log, replays, t0)
        if recal is not None:
            recal.finish()
            given = summarize(rows)
            scored_with = recal.merged()
            _rescore_rows(scored_with, replays)
            recalibration = {"every_s": recalibrate_every_s, "calibrations": recal.summary(t0),
                             "given_profile": {k: given[k] for k in ("latency_error_median", "latency_error_p90",
                                                                     "latency_error_max")}}
        if keep_path is not None:
            extra = ({f"calibrations/{c.name}": c.read_text() for c in recal.calibrations}
                     if recal is not None else {})
            try:
                write_kept_grid(keep_path, replays, {"profile": profile.name, "tokens": n_tokens, "quick": quick,
                                                     "seed": seed, "repeats": repeats, "threads": threads,
                                                     "modes": list(modes),
                                                     "recalibrate_every_s": recalibrate_every_s}, t0,
                                profile=scored_with, extra_files=extra)
            except OSError as e:    # the grid's report is worth more than the failed keep: say so, go on
                print(f"WARNING: --keep {keep}: could not write it ({e.strerror or e}); nothing was kept, the report "
                      "is complete", file=sys.stderr)
                keep_path = None
    finally:
        tmp.cleanup()
    checks = [{**c, "t_s": round(c["t_s"] - t0, 1)} for c in log.checks]     # seconds into the validation
    drift = {"start": checks[0], "end": checks[-1]}
    drift_msg = drift_warning({"start": checks[0], **{f"at {c['t_s']:.0f} s": c for c in checks[1:-1]},
                               "end": checks[-1]})
    if drift_msg:
        print(drift_msg, file=sys.stderr)
    load_end = host_load()
    warning = load_warning(load_start, load_end)
    if warning:
        print(warning, file=sys.stderr)
    from real.validation.calibration import calibration_points

    calibration = calibration_points(scored_with, [r["config"] for r in rows])
    fitted = calibration["grid_configs"]
    report = summarize(rows, fitted)
    report["per_mode"] = {m: {**summarize([r for r in rows if r["mode"] == m], fitted), **info[m]} for m in modes}
    report["calibration"] = calibration
    report["per_group"] = per_group(rows)
    report.update({"modes": list(modes), "mode": "+".join(modes), "model": next(iter(info.values()), {}).get("model"),
                   "profile": profile.name, "tokens": n_tokens, "warmup_steps": WARMUP_STEPS, "quick": quick,
                   "seed": seed, "compute_threads": threads, "threads": threads, "repeats": repeats,
                   "check_every_s": check_every_s,
                   "load_avg_start": load_start["load_avg"], "load_avg_end": load_end["load_avg"],
                   "busy_cores_start": load_start.get("busy_cores"), "busy_cores_end": load_end.get("busy_cores"),
                   "cores": load_start["cores"], "load_warning": warning, "drift": drift, "drift_checks": checks,
                   "drift_warning": drift_msg,
                   "drift_corrected": corrected, "recalibration": recalibration,
                   "kept": str(keep_path) if keep_path is not None else None,
                   "direct_io": all(r["direct_io"] for r in rows),
                   "configs": rows, "wall_s": time.perf_counter() - t0})
    return report


class _Between:
    """What runs between two real runs when it is due: the drift check, then a recalibration."""

    def __init__(self, log: Any, recal: Any = None):
        self.log, self.recal = log, recal

    def maybe_check(self) -> None:
        self.log.maybe_check()
        if self.recal is not None:
            self.recal.maybe_run()


def _rescore_rows(profile: Any, replays: list[tuple]) -> None:
    """Every replayed configuration simulated again on `profile`; its row's metrics replaced."""
    from sim.engine import simulate
    from traces.format import open_trace

    for row, path, spec, cfg, runs, _times in replays:
        sim = simulate(open_trace(path), spec, profile, cfg, fast=False)
        row["metrics"] = compare(runs[0], sim.tokens, runs[1:])


def _drift_corrected(profile: Any, log: Any, replays: list[tuple], t0: float) -> dict[str, Any] | None:
    """Latency errors with every configuration replayed on the profile as the host checks found it
    while that configuration ran (real.validation.drift.profile_at_drift at the ratios `log` interpolates at
    each real run's midpoint, averaged over its runs); each row gets its ratios and error as
    `drift_corrected`. None without a disk ratio or without configurations. A diagnostic next to the
    errors, which stay those of the profile as given."""
    from real.validation.drift import RATIOS, profile_at_drift
    from sim.engine import simulate
    from traces.format import open_trace

    if not replays or log.ratios_at(t0) is None:
        return None
    errors, used = [], []
    for row, path, spec, cfg, runs, times in replays:
        at = [log.ratios_at(t) for t in times]
        r = {k: float(np.mean([a[k] for a in at])) for k in RATIOS}
        sim = simulate(open_trace(path), spec,
                       profile_at_drift(profile, r["disk"], r["cpu"], log.read_ratios_at(r),
                                        log.width_ratios_at(r)), cfg,
                       fast=False)
        e = compare(runs[0], sim.tokens, runs[1:])["latency_s"]["error"]
        row["drift_corrected"] = {**{f"{k}_ratio": v for k, v in r.items()}, "latency_error": e,
                                  # each run's midpoint (seconds into the validation) and the host there
                                  "runs": [{"t_s": round(t - t0, 1), **{k: float(a[k]) for k in RATIOS}}
                                           for t, a in zip(times, at, strict=True)]}
        errors.append(e)
        used.append(r)
    e_arr = np.array(errors, float)
    return {**{f"{k}_ratio": float(np.mean([r[k] for r in used])) for k in RATIOS}, "checks": len(log.checks),
            "latency_error_median": float(np.median(e_arr)), "latency_error_p90": float(np.percentile(e_arr, 90)),
            "latency_error_max": float(e_arr.max())}
