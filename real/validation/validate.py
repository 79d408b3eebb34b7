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

The scoring (metrics, summaries, groups, each pass alone) is real/validation/validate_score.py. Nothing is
fitted: the simulator runs with the profile as written. The replay uses the store's layout
alignment (`real.runtime.backend.store_config`: `bundling.align_bytes` = 4096 for the padded stores used
here), so bytes read agree exactly in both modes.

Budgets: DRAM for the neuron caches = a fraction of the FFN's bytes as the caches hold them
(bundles padded to the store's alignment, `budget_for`). Shape mode's trace activates 10% of the
neurons: 25% and 50% of the FFN. Model mode's oracle computes the top `MODEL_KEEP` = 25% of every
layer: a 25% budget is exactly the computed set, and window k = 0 with delta prefetch keeps every
layer's prefetched next set (~25% of the FFN) across the step plus the layer being computed, which
cannot fit (the simulator's DRAM check refused it at step 0; the real run, which checks no total, ran
over the budget). Model mode's budgets are therefore 37.5% and 50%
(`MODEL_BUDGET_FRACTIONS`: 1.5x and 2x the computed set).

The run records the host's load at start and end (real/bench/host_load.py); other work keeping cores
busy at the start means the timing errors are not trustworthy (a warning is printed on stderr).
The end value includes the grid's own reader threads.

Model mode's store (fp32, both layouts, ~1.1 GiB for SmolLM2) is converted once and cached under
the flashsim cache folder (`$FLASHSIM_CACHE`/stores/), keyed by the model's weight file (path, size,
modification time) and the store settings; a damaged entry is converted again.
"""

from __future__ import annotations

import itertools
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from devices.model_spec import ModelSpec
from real.bench.host_load import host_load, load_warning
from real.validation.validate_score import WARMUP_STEPS, compare, metrics_of, per_group, summarize
from sim.policies.bundling import padded_bytes

FULL_K = (0, 1, 2, 4, 8)
QUICK_K = (0, 2, 8)
BUDGET_FRACTIONS = (0.25, 0.5)   # DRAM for neuron caches, as a fraction of the FFN's bytes
# model mode computes MODEL_KEEP of every layer: the lower budget must hold more than that (module docstring)
MODEL_BUDGET_FRACTIONS = (0.375, 0.5)
MODES = ("shape", "model")
MODEL_NAME = "smollm2-135m"
MODEL_QUICK_K = (0, 4)
# oracle active fraction of model mode: SmolLM2's SwiGLU is not naturally sparse, so a quarter of the
# neurons (top |a| per token) gives caches and prefetch something to do (quality: docs/calibrate-and-validate.md)
MODEL_KEEP = 0.25
# real passes over the grid by default: each pass is then scored against the mean of the other two,
# the host's repeat spread that the simulator's error is read against (real.validation.validate_score.floor)
DEFAULT_REPEATS = 3
STORE_SETTINGS = {"dtype": "fp32", "layout": "both", "alignment": "padded", "file_mode": "per-layer",
                  "order": "original"}


def validation_spec(quick: bool) -> ModelSpec:
    """A small llama shape, stored fp32: rows of 4 KiB, so no padding in either layout, and fp32
    because PyTorch's CPU fp16 GEMV kernels convert as they go and run several times slower than
    fp32, which would make the grid measure the conversion rather than the policies."""
    return ModelSpec(name="validate-shape", family="llama", n_layers=4 if quick else 8, d_model=1024,
                     d_ff=2048, dtype="fp32", n_heads=8, n_kv_heads=4, head_dim=128, vocab_size=4096, ffn_kind="swiglu")


@dataclass(frozen=True)
class GridPoint:
    k: int
    bundled: bool
    prefetch: str
    budget_fraction: float

    @property
    def label(self) -> str:
        return f"k={self.k} {'bundled' if self.bundled else 'unbundled'} prefetch={self.prefetch} budget={self.budget_fraction:g}FFN"

    def overrides(self, budget_bytes: int) -> list[str]:
        return ["residency=window", f"window.k={self.k}", "predictor=oracle", "predictor.rank=0",
                "layout=bundling", f"bundling.bundled={str(self.bundled).lower()}", f"prefetch={self.prefetch}",
                "workload.prompt_tokens=0", f"memory.dram_budget_bytes={budget_bytes}"]

    def run_config(self, store: Any, n_steps: int, seed: int) -> tuple[int, Any]:
        """(DRAM budget in bytes, RunConfig) of this point on `store` for a run of n_steps: the
        budget from `budget_for` at the store's alignment, the layout set from its manifest
        (real.runtime.backend.store_config). Shape mode runs it under `shape_config`."""
        from real.runtime.backend import store_alignment_bytes, store_config
        from sim.config import RunConfig

        budget = budget_for(store.spec, n_steps, self.budget_fraction, store_alignment_bytes(store))
        cfg, _ = store_config(RunConfig().with_overrides(self.overrides(budget) + [f"seed={seed}"]), store)
        return budget, cfg


def grid(quick: bool) -> list[GridPoint]:
    ks = QUICK_K if quick else FULL_K
    budgets = BUDGET_FRACTIONS[1:] if quick else BUDGET_FRACTIONS
    return [GridPoint(k, b, p, f) for k, b, p, f in itertools.product(ks, (True, False), ("none", "delta"), budgets)]


def model_grid(quick: bool) -> list[GridPoint]:
    """Model mode: the same k x bundling x prefetch grid with MODEL_BUDGET_FRACTIONS (quick: k in
    MODEL_QUICK_K, 50% budget: 8 configurations)."""
    ks, budgets = (MODEL_QUICK_K, MODEL_BUDGET_FRACTIONS[1:]) if quick else (FULL_K, MODEL_BUDGET_FRACTIONS)
    return [GridPoint(k, b, p, f) for k, b, p, f in itertools.product(ks, (True, False), ("none", "delta"), budgets)]


def budget_for(spec: ModelSpec, n_steps: int, fraction: float, align_bytes: int = 0) -> int:
    """Fixed weights + the largest KV cache + `fraction` of the FFN bytes as the neuron caches hold them
    (each neuron a bundle rounded up to `align_bytes`, the store's: the real cache's rows, which the
    simulator's memory model charges too), so a fraction is the same share of neurons in any store."""
    ffn = spec.n_layers * spec.d_ff * padded_bytes(spec.ffn_neuron_bytes, align_bytes)
    return int(spec.non_ffn_bytes + (n_steps + 1) * spec.kv_bytes_per_token + fraction * ffn)


def parse_modes(text: str | None) -> tuple[str, ...]:
    from devices.errors import FlashsimError

    if text is None:
        return MODES
    modes = tuple(dict.fromkeys(m.strip() for m in text.split(",") if m.strip()))
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise FlashsimError(f"--modes {text!r}: give one or both of {', '.join(MODES)} (comma-separated)")
    return modes


def run_validation(profile: Any, *, quick: bool = False, tokens: int | None = None, seed: int = 0,
                   workdir: str | Path | None = None, progress: Any = None, threads: int | None = None,
                   modes: tuple[str, ...] = MODES, repeats: int = DEFAULT_REPEATS,
                   check_every_s: float | None = None, keep: str | Path | None = None,
                   recalibrate_every_s: float | None = None) -> dict[str, Any]:
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
    `recalibration` reports the calibrations' times and the errors against `profile` too."""
    from devices.errors import FlashsimError
    from real.validation.drift import CHECK_EVERY_S, DriftLog, drift_warning
    from real.validation.validate_keep import check_keep_target, write_kept_grid

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
    keep_path = check_keep_target(keep) if keep is not None else None
    load_start = host_load()
    t0 = time.perf_counter()
    n_tokens = tokens or (12 if quick else 24)
    tmp = tempfile.TemporaryDirectory(prefix="flashsim-validate-", dir=workdir)
    root = Path(tmp.name)
    rows: list[dict[str, Any]] = []
    info: dict[str, Any] = {}
    n_total = (len(grid(quick)) if "shape" in modes else 0) + (len(model_grid(quick)) if "model" in modes else 0)
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
            info["shape"] = _shape_rows(profile, quick, n_tokens, seed, root / "shape", threads, rows, progress, n_total,
                                        repeats, replays=replays, drift=between)
        if "model" in modes:
            info["model"] = _model_rows(profile, quick, n_tokens, seed, root / "model", threads, rows, progress, n_total,
                                        repeats, replays=replays, drift=between)
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
    report.update({"modes": list(modes), "mode": "+".join(modes), "model": info.get("shape", info.get("model", {})).get("model"),
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
                       profile_at_drift(profile, r["disk"], r["cpu"], r["after_io"], log.read_ratios_at(r),
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


def _row(mode: str, gp: GridPoint, budget: int, metrics: dict, run: Any) -> dict[str, Any]:
    return {"mode": mode, "config": f"{mode}: {gp.label}", "k": gp.k, "bundled": gp.bundled, "prefetch": gp.prefetch,
            "budget_fraction": gp.budget_fraction, "budget_bytes": budget, "metrics": metrics,
            "direct_io": run.config["reader"]["direct_io"]}


def _shape_rows(profile: Any, quick: bool, n_tokens: int, seed: int, root: Path, threads: int | None,
                rows: list, progress: Any, n_total: int, repeats: int = 1, replays: list | None = None,
                drift: Any = None) -> dict[str, Any]:
    from real.runtime.run_outputs import write_executed_trace
    from real.runtime.shape_mode import run_shape, shape_config, shape_trace_like
    from real.weights.convert import write_shape_store
    from real.weights.store import open_store
    from sim.engine import simulate
    from traces.format import open_trace

    spec = validation_spec(quick)
    store = open_store(write_shape_store(spec, root / "store", seed=seed, dtype="fp32", layout="both"))
    trace = open_trace(shape_trace_like(spec, root / "trace", n_tokens, seed))
    points = []
    for gp in grid(quick):
        budget, cfg = gp.run_config(store, n_tokens, seed)
        points.append((gp, budget, shape_config(cfg)))
    runs, times = _passes(points, repeats, lambda cfg: run_shape(store, trace, profile, cfg, seed=seed, threads=threads),
                          drift)
    for i, ((gp, budget, cfg), (run, *more)) in enumerate(zip(points, runs, strict=True)):
        tpath = write_executed_trace(root / f"executed-{i}", run, run.view, spec)
        res = simulate(open_trace(tpath), spec, profile, cfg, fast=False)
        rows.append(_row("shape", gp, budget, compare(run.tokens, res.tokens, [r.tokens for r in more]), run))
        if replays is not None:
            replays.append((rows[-1], tpath, spec, cfg, [run.tokens, *(r.tokens for r in more)], times[i]))
        if progress:
            progress(len(rows), n_total, rows[-1]["config"], rows[-1]["metrics"]["latency_s"]["error"])
    return {"model": spec.name}


def model_setup(n_tokens: int, workdir: Path) -> tuple[Any, Any, Any, np.ndarray]:
    """(torch model, ModelSpec, opened store, token ids [n_tokens]) of model mode: SmolLM2 from the
    capture cache, its store from the store cache, the builtin prompts' text (no chat template)."""
    from real.weights.store import open_store
    from traces.capture.models import load_hf_model
    from traces.capture.prompts import load_prompts

    loaded = load_hf_model(MODEL_NAME)
    store = open_store(cached_store(MODEL_NAME, loaded.source), verify="sizes")
    text = "\n".join(p.text for p in load_prompts("builtin"))
    ids = np.asarray(loaded.tokenizer(text)["input_ids"], np.int64)[:n_tokens]
    return loaded.model, loaded.spec, store, ids


def store_cache_key(model: str, source: str) -> str:
    import hashlib
    import json

    from real.weights.store import SCHEMA_VERSION

    p = Path(source)
    st = p.stat()
    desc = {"model": model, "source": str(p.resolve()), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns,
            "store_schema": SCHEMA_VERSION, **STORE_SETTINGS}
    return hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:12]


def cached_store(model: str, source: str) -> Path:
    """The model's store under the cache folder, converted on first use (atomic: a half-written
    store never appears under the final name)."""
    import contextlib

    from devices.errors import FlashsimError
    from real.weights.convert import convert_model
    from real.weights.store import open_store
    from traces.capture.models import cache_dir

    path = cache_dir() / "stores" / f"{model}-{store_cache_key(model, source)}"
    if path.exists():
        with contextlib.suppress(FlashsimError):
            open_store(path, verify="sizes")
            return path
    path.parent.mkdir(parents=True, exist_ok=True)
    return convert_model(model, path, overwrite=True, progress=False, **STORE_SETTINGS)


def _passes(points: list, repeats: int, run_one: Any, drift: Any = None) -> tuple[list[list[Any]], list[list[float]]]:
    """Real runs of every point, `repeats` passes over the whole grid: ([point][pass] results,
    [point][pass] perf_counter midpoints). `drift` (a real.validation.drift.DriftLog): checks the host between
    runs when it is due, never during one."""
    runs: list[list[Any]] = [[] for _ in points]
    times: list[list[float]] = [[] for _ in points]
    for _ in range(repeats):
        for i, (_gp, _budget, cfg) in enumerate(points):
            t = time.perf_counter()
            runs[i].append(run_one(cfg))
            times[i].append((t + time.perf_counter()) / 2)
            if drift is not None:
                drift.maybe_check()
    return runs, times


def _model_rows(profile: Any, quick: bool, n_tokens: int, seed: int, root: Path, threads: int | None,
                rows: list, progress: Any, n_total: int, repeats: int = 1, replays: list | None = None,
                drift: Any = None) -> dict[str, Any]:
    from real.runtime.model_mode import prepare, run_prepared
    from real.runtime.run_outputs import write_executed_trace
    from sim.engine import simulate
    from traces.format import open_trace

    t0 = time.perf_counter()
    model, spec, store, ids = model_setup(n_tokens, root)
    ref = prepare(model, spec, store, ids, keep_fraction=MODEL_KEEP, workdir=root)
    setup_s = time.perf_counter() - t0
    quality = []
    points = []
    for gp in model_grid(quick):
        points.append((gp, *gp.run_config(store, len(ids), seed)))
    runs, times = _passes(points, repeats, lambda cfg: run_prepared(ref, model, spec, store, profile, cfg,
                                                                    device="cpu", threads=threads), drift)
    for i, ((gp, budget, cfg), ((run, q), *more)) in enumerate(zip(points, runs, strict=True)):
        tpath = write_executed_trace(root / f"executed-{i}", run, run.view, store.spec)
        res = simulate(open_trace(tpath), store.spec, profile, cfg, fast=False)
        rows.append(_row("model", gp, budget, compare(run.tokens, res.tokens, [r.tokens for r, _ in more]), run))
        if replays is not None:
            replays.append((rows[-1], tpath, store.spec, cfg, [run.tokens, *(r.tokens for r, _ in more)], times[i]))
        quality.append(q)
        if progress:
            progress(len(rows), n_total, rows[-1]["config"], rows[-1]["metrics"]["latency_s"]["error"])
    q0 = quality[0] if quality else {}
    return {"model": spec.name, "store": str(store.path), "keep_fraction": MODEL_KEEP, "setup_s": setup_s,
            "active_sets": "oracle (dense top-|a| of the same tokens)",
            "quality": {k: q0.get(k) for k in ("greedy_agreement", "perplexity", "dense_perplexity")}}


def scatter_plot(report: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """sim-vs-real scatter, one panel per metric (PNG, atomic). With repeated real runs each point
    carries the range of its runs as a horizontal bar, and the title each run's score alone (the
    simulator's and the other runs', `validate_score.repeatability`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics = metrics_of(report["configs"])
    fig, axes = plt.subplots(1, len(metrics), figsize=(4 * len(metrics), 4))
    for ax, m in zip(axes, metrics):
        rows = [row for row in report["configs"] if m in row["metrics"]]
        r = [row["metrics"][m]["real"] for row in rows]
        s = [row["metrics"][m]["sim"] for row in rows]
        runs = [row["metrics"][m].get("real_runs") for row in rows]
        for mode, marker in zip(MODES, "o^"):
            sel = [i for i, row in enumerate(rows) if row.get("mode", "shape") == mode]
            if sel:
                dots = ax.scatter([r[i] for i in sel], [s[i] for i in sel], s=14, marker=marker, label=mode)
                bars = [i for i in sel if runs[i]]
                if bars:     # the real runs' range: how far the host moved between passes
                    ax.errorbar([r[i] for i in bars], [s[i] for i in bars], fmt="none", lw=0.7, alpha=0.5,
                                ecolor=dots.get_facecolor()[0],
                                xerr=[[max(0.0, r[i] - min(runs[i])) for i in bars],
                                      [max(0.0, max(runs[i]) - r[i]) for i in bars]])
        ax.legend(fontsize=7)
        vals = r + s + [x for rr in runs if rr for x in rr]
        hi = max(vals) * 1.05 if vals else 1.0
        lo = min(vals) / 1.05 if vals else 0.0
        if lo > 0 and hi / lo > 10:     # shape and model mode an order of magnitude apart: log axes
            ax.set_xscale("log")
            ax.set_yscale("log")
        else:
            lo = 0.0
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
        ax.set_xlabel(f"real {m}" + (" (bars: the runs' range)" if any(runs) else ""))
        ax.set_ylabel(f"simulated {m}")
        title = f"{m}: median err {report['per_metric'][m]['median']:.0%}"
        alone = (report.get("repeatability") or {}).get(m)
        if alone:
            title += (f"\none run: sim {alone['simulator']['median']:.0%}, "
                      f"other runs {alone['other_passes']['median']:.0%}")
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    path = out_dir / "validate_scatter.png"
    tmp = out_dir / ".validate_scatter.png.tmp.png"
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return [path]
