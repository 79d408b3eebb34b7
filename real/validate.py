"""Validation: run a grid of configurations on the real backend, replay what each run did in the
simulator, and report the simulator's relative error per metric (times in seconds, sizes in bytes).

For each configuration (window k x bundling x prefetch x budget) and mode:
1. the real backend executes it: shape mode (`real.shape_mode.run_shape`: a random-weight store of a
   small llama shape, active sets from a synthetic trace) and model mode (`real.model_mode`:
   SmolLM2-135M token by token on a fixed text, its real FFN weights streamed from a store converted
   from the embedded model, active sets the oracle top-`MODEL_KEEP` of the dense activations); real
   direct-I/O reads, real sparse compute in both;
2. the computed sets it executed are written as a trace (`real.records.write_executed_trace`);
3. the simulator replays that trace with the same policies (predictor = oracle on the executed sets,
   so both see exactly the same neurons), the same budget and the device profile (`this-host` or
   --profile);
4. per metric the error is |mean_sim - mean_real| / mean_real over the run's steps (the first
   `WARMUP_STEPS` steps skipped on both sides: cold caches, thread start-up and allocator warm-up
   belong to neither model).

Metrics: latency_s (per-token latency), io_s, compute_s, bytes_read, and stall_s and mem_mgmt_s
(the parts of the latency spent waiting for reads and moving cache rows) where both sides' records
have them. Summaries over configurations: median, p90 and max, over all configurations and per mode
(`per_mode`). Nothing is fitted: the simulator runs with the profile as written. The replay uses the
store's layout alignment (`real.backend.store_config`: `bundling.align_bytes` = 4096 for the padded
stores used here), so bytes read agree exactly in both modes.

With repeated real runs (--repeats), how far the host repeats itself is scored on the same scale
(`repeatability`): each real pass alone, against the simulator and against the mean of the other
passes. On a shared host whose state moves over minutes the second is the floor under the first: no
model of the machine's typical run can be checked closer than the runs agree with each other.

Budgets: DRAM for the neuron caches = a fraction of the FFN's bytes as the caches hold them
(bundles padded to the store's alignment, `budget_for`). Shape mode's trace activates 10% of the
neurons: 25% and 50% of the FFN. Model mode's oracle computes the top `MODEL_KEEP` = 25% of every
layer: a 25% budget is exactly the computed set, and window k = 0 with delta prefetch keeps every
layer's prefetched next set (~25% of the FFN) across the step plus the layer being computed, which
cannot fit (the simulator's DRAM check refused it at step 0; the real run, which checks no total, ran
over the budget). Model mode's budgets are therefore 37.5% and 50%
(`MODEL_BUDGET_FRACTIONS`: 1.5x and 2x the computed set).

The run records the host's load average at start and end (`os.getloadavg`); a 1-minute load above
the core count at the start means other work shares the cores and the timing errors are not
trustworthy (a warning is printed on stderr). The end value includes the grid's own reader threads.

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
from sim.policies.bundling import padded_bytes

METRICS = ("latency_s", "io_s", "compute_s", "bytes_read")
OPTIONAL_METRICS = ("stall_s", "mem_mgmt_s")   # compared when both sides' records carry them
WARMUP_STEPS = 2
FULL_K = (0, 1, 2, 4, 8)
QUICK_K = (0, 2, 8)
BUDGET_FRACTIONS = (0.25, 0.5)   # DRAM for neuron caches, as a fraction of the FFN's bytes
# model mode computes MODEL_KEEP of every layer: the lower budget must hold more than that (module docstring)
MODEL_BUDGET_FRACTIONS = (0.375, 0.5)
MODES = ("shape", "model")
MODEL_NAME = "smollm2-135m"
MODEL_QUICK_K = (0, 4)
# oracle active fraction of model mode: SmolLM2's SwiGLU is not naturally sparse, so a quarter of the
# neurons (top |a| per token) gives caches and prefetch something to do (quality: docs/validation.md)
MODEL_KEEP = 0.25
BUSY_SAMPLE_S = 0.5      # host_load: how long /proc/stat is sampled for other work's busy cores
BUSY_WARN_CORES = 0.5    # ... and how many busy cores make the timing untrustworthy (a quarter of this 2-core host)
STORE_SETTINGS = {"dtype": "fp32", "layout": "both", "alignment": "padded", "file_mode": "per-layer",
                  "order": "original"}


def validation_spec(quick: bool) -> ModelSpec:
    """A small llama shape, stored fp32 (rows of 4 KiB: no padding in either layout; fp32 because
    PyTorch's CPU fp16 GEMV kernels are 2-20x slower than fp32 on this host, see docs/validation-history.md)."""
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
        (real.backend.store_config). Shape mode runs it under `shape_config`."""
        from real.backend import store_alignment_bytes, store_config
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


def rel_error(sim: float, real: float) -> float:
    if real == 0:
        return 0.0 if sim == 0 else float("inf")
    return abs(sim - real) / abs(real)


def compare(real_tokens: list, sim_tokens: list, repeats: list[list] | None = None) -> dict[str, dict[str, float]]:
    """Per metric: real and simulated means over the measured steps, and the relative error (the
    OPTIONAL_METRICS only when both sides' records have them). `repeats`: the records of further
    real runs of the same configuration; the real mean is then the mean over all runs, `spread`
    = (max - min) / min of the runs' means (the real runs' own disagreement), and each run is also
    scored alone (leave one out, `summarize`'s `repeatability`): `pass_errors`, the simulator's
    error against that run, and `rest_errors`, the error of the other runs' mean against it."""
    out = {}
    runs = [real_tokens, *(repeats or [])]
    both = real_tokens[:1] + sim_tokens[:1]
    extra = [m for m in OPTIONAL_METRICS if both and all(hasattr(t, m) for t in both)]
    for m in (*METRICS, *extra):
        means = np.array([np.mean([getattr(t, m) for t in toks[WARMUP_STEPS:]]) for toks in runs], float)
        s = float(np.mean([getattr(t, m) for t in sim_tokens[WARMUP_STEPS:]]))
        real = float(means.mean())
        out[m] = {"real": real, "sim": s, "error": rel_error(s, real)}
        if len(runs) > 1:
            out[m]["spread"] = rel_error(float(means.max()), float(means.min())) if real else 0.0
            out[m]["real_runs"] = means.tolist()
            rest = (means.sum() - means) / (len(means) - 1)
            out[m]["pass_errors"] = [rel_error(s, float(x)) for x in means]
            out[m]["rest_errors"] = [rel_error(float(r), float(x)) for r, x in zip(rest, means)]
    return out


def error_stats(errors: Any) -> dict[str, float]:
    """median, p90 and max of relative errors."""
    e = np.asarray(errors, float)
    return {"median": float(np.median(e)), "p90": float(np.percentile(e, 90)), "max": float(e.max())}


def repeatability(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Each real pass of each configuration scored alone, on the same footing by the simulator and
    by the mean of the configuration's other passes (`compare`'s `pass_errors` / `rest_errors`,
    pooled over configurations and passes): per metric {"simulator": stats, "other_passes": stats}
    (`error_stats`). The other passes' error is what the host's own repeatability allows: a model
    that predicted the typical real run exactly would score about that against a single pass, so a
    simulator error at or below it cannot be told from the host's noise. {} without repeated runs."""
    out = {}
    for m in metrics_of(rows):
        sim = [e for r in rows for e in r["metrics"].get(m, {}).get("pass_errors", [])]
        rest = [e for r in rows for e in r["metrics"].get(m, {}).get("rest_errors", [])]
        if sim and rest:
            out[m] = {"simulator": error_stats(sim), "other_passes": error_stats(rest)}
    return out


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    if not rows:
        return {"n_configs": 0, "latency_error_median": None, "latency_error_p90": None, "latency_error_max": None,
                "per_metric": {}}
    per, noise = {}, {}
    for m in metrics_of(rows):
        per[m] = error_stats([r["metrics"][m]["error"] for r in rows if m in r["metrics"]])
        sp = [r["metrics"][m]["spread"] for r in rows if "spread" in r["metrics"].get(m, {})]
        if sp:
            noise[m] = error_stats(sp)
    lat = per["latency_s"]
    out = {"n_configs": len(rows), "latency_error_median": lat["median"], "latency_error_p90": lat["p90"],
           "latency_error_max": lat["max"], "per_metric": per}
    if noise:   # (max - min) / min of the repeated real runs: errors below this are noise
        out["noise_floor"] = noise
    rep = repeatability(rows)
    if rep:
        out["repeatability"] = rep
    return out


def signed_error(metric: dict[str, float]) -> float:
    """(sim - real) / real of one metric's entry in `compare`: > 0 = the simulator is slow."""
    return (metric["sim"] - metric["real"]) / metric["real"] if metric["real"] else 0.0


def per_group(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The configurations grouped by mode x bundling x prefetch (the windows and budgets pooled),
    in grid order: per group the signed median latency and I/O errors (the direction the model is
    off in: a group whose sign holds over grids is the model's, one that flips with the host's
    state at calibration is the host's) with the signed latency error's quartiles, the signed
    median compute error (in unbundled model mode with a delta prefetch the real decoder computes
    slowly through the time the simulator books as a stall: compare compute plus stall there), the
    |latency error|
    median and p90, the median |drift-corrected| error where the rows have one, and with repeated
    runs each pass scored alone (`repeatability`'s latency medians: `pass_latency_error_median`,
    the simulator's, and `rest_latency_error_median`, the other passes'; None with one run): a
    group whose simulator error stays above its other passes' is where the model, not the host, is
    off."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["mode"], r["bundled"], r["prefetch"]), []).append(r)
    out = []
    for (mode, bundled, prefetch), rs in groups.items():
        lat = np.array([signed_error(r["metrics"]["latency_s"]) for r in rs])
        g = {"mode": mode, "bundled": bundled, "prefetch": prefetch, "n_configs": len(rs),
             "latency_signed_median": float(np.median(lat)), "latency_error_median": float(np.median(np.abs(lat))),
             "latency_error_p90": float(np.percentile(np.abs(lat), 90)),
             "latency_signed_q25": float(np.percentile(lat, 25)), "latency_signed_q75": float(np.percentile(lat, 75)),
             "io_signed_median": float(np.median([signed_error(r["metrics"]["io_s"]) for r in rs])),
             "compute_signed_median": float(np.median([signed_error(r["metrics"]["compute_s"]) for r in rs]))}
        dc = [r["drift_corrected"]["latency_error"] for r in rs if r.get("drift_corrected")]
        g["drift_corrected_median"] = float(np.median(dc)) if dc else None
        alone = repeatability(rs).get("latency_s")
        g["pass_latency_error_median"] = alone["simulator"]["median"] if alone else None
        g["rest_latency_error_median"] = alone["other_passes"]["median"] if alone else None
        out.append(g)
    return out


def metrics_of(rows: list[dict[str, Any]]) -> list[str]:
    """METRICS, then each optional metric some row has."""
    return [*METRICS, *(m for m in OPTIONAL_METRICS if any(m in r["metrics"] for r in rows))]


def host_load(sample_s: float = BUSY_SAMPLE_S) -> dict[str, Any]:
    """1-, 5- and 15-minute load averages, the usable cores, and `busy_cores`: the cores other work
    kept busy over `sample_s` seconds while this process slept (/proc/stat; None where the OS has no
    such file or sample_s is 0). None where the OS gives none."""
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"load_avg": load, "cores": cores, "busy_cores": busy_cores(sample_s) if sample_s > 0 else None}


def _cpu_jiffies() -> tuple[int, int, int] | None:
    """(busy, total, CPUs) jiffies summed over the CPUs this process may run on (/proc/stat's cpuN
    lines; all CPUs where the OS gives no affinity); None without /proc/stat. Busy is all but idle
    and iowait: a thread waiting for I/O holds no core."""
    mine = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    busy = total = n = 0
    try:
        with open("/proc/stat") as f:
            for line in f:
                name, *vals = line.split()
                if not name.startswith("cpu") or name == "cpu":
                    continue
                if mine is not None and int(name[3:]) not in mine:
                    continue
                v = [int(x) for x in vals[:8]]   # user nice system idle iowait irq softirq steal (guest is in user)
                busy += sum(v) - v[3] - v[4]
                total += sum(v)
                n += 1
    except (OSError, ValueError, IndexError):
        return None
    return (busy, total, n) if n else None


def busy_cores(sample_s: float) -> float | None:
    """Cores busy with other work: busy / all jiffies of this process's CPUs x their count, over
    sample_s seconds of this process sleeping; None without /proc/stat."""
    a = _cpu_jiffies()
    time.sleep(sample_s)
    b = _cpu_jiffies()
    if a is None or b is None or b[1] <= a[1]:
        return None
    return round((b[0] - a[0]) / (b[1] - a[1]) * b[2], 2)


def load_warning(start: dict[str, Any], end: dict[str, Any]) -> str | None:
    """A warning when other work kept more than BUSY_WARN_CORES busy at the start (where /proc/stat
    says; else when the 1-minute load at start exceeded the core count). None otherwise.

    Only the start counts: during the run the grid's own reader threads raise the load by themselves,
    so the end value is recorded but measures validate as much as other work. And the measured busy
    cores come first: Linux counts a thread in uninterruptible I/O wait in the load average, so right
    after `bench flash` (32 reads in flight for minutes) an idle host reads a 1-minute load of 7-10
    on 2 cores for a minute or two, while /proc/stat finds no core busy."""
    cores = start["cores"]
    busy = start.get("busy_cores")
    if busy is not None:
        if busy <= BUSY_WARN_CORES:
            return None
        return (f"WARNING: other work kept {busy:.1f} of {cores} core(s) busy when validation started: the "
                "timing errors measure the load as much as the model; re-run on an idle host")
    first = start["load_avg"][0] if start["load_avg"] else None
    if first is None or not cores or first <= cores:
        return None
    return (f"WARNING: 1-minute load average was {first:.1f} on {cores} core(s) when validation started: other "
            "work shares the cores, so the timing errors measure the load as much as the model; re-run on an "
            "idle host")


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
                   modes: tuple[str, ...] = MODES, repeats: int = 1,
                   check_every_s: float | None = None, keep: str | Path | None = None) -> dict[str, Any]:
    """Runs the grid in each mode; returns the JSON report (summary, per-mode summaries, one row per
    configuration, provenance). threads None: the profile's `compute.threads` (1 if it has none).
    repeats > 1: the real side runs the whole grid that many times over (passes, so drift of the host
    over minutes shows too); errors use the mean and `noise_floor` reports the runs' spread. `drift`:
    the host against the profile at the start and the end; `drift_checks`: those and the checks
    between real runs every `check_every_s` (None: real.drift.CHECK_EVERY_S; 0: after every real run, so
    each run sits between two checks); `drift_corrected`: the errors with each
    configuration replayed on the profile as the checks found the host while it ran (real/drift.py).
    `keep`: a new folder to keep the executed traces and the real runs' records in, for
    `flashsim validate --rescore` (real/validate_keep.py); refused before any run if it exists."""
    from devices.errors import FlashsimError
    from real.drift import CHECK_EVERY_S, DriftLog, drift_warning
    from real.validate_keep import check_keep_target, write_kept_grid

    if repeats < 1:
        raise FlashsimError(f"--repeats {repeats}: give 1 or more real runs per configuration")
    if check_every_s is None:
        check_every_s = CHECK_EVERY_S
    if not check_every_s >= 0:
        raise FlashsimError(f"--check-every {check_every_s}: give seconds >= 0 (0 checks the host after every real run)")
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
    replays: list[tuple] = []     # (row, trace path, spec, config, real token runs, their times) for drift_corrected
    try:
        log.check()
        if "shape" in modes:
            info["shape"] = _shape_rows(profile, quick, n_tokens, seed, root / "shape", threads, rows, progress, n_total,
                                        repeats, replays=replays, drift=log)
        if "model" in modes:
            info["model"] = _model_rows(profile, quick, n_tokens, seed, root / "model", threads, rows, progress, n_total,
                                        repeats, replays=replays, drift=log)
        log.check()
        corrected = _drift_corrected(profile, log, replays, t0)
        if keep_path is not None:
            try:
                write_kept_grid(keep_path, replays, {"profile": profile.name, "tokens": n_tokens, "quick": quick,
                                                     "seed": seed, "repeats": repeats, "threads": threads,
                                                     "modes": list(modes)}, t0)
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
    report = summarize(rows)
    report["per_mode"] = {m: {**summarize([r for r in rows if r["mode"] == m]), **info[m]} for m in modes}
    report["per_group"] = per_group(rows)
    report.update({"modes": list(modes), "mode": "+".join(modes), "model": info.get("shape", info.get("model", {})).get("model"),
                   "profile": profile.name, "tokens": n_tokens, "warmup_steps": WARMUP_STEPS, "quick": quick,
                   "seed": seed, "compute_threads": threads, "threads": threads, "repeats": repeats,
                   "check_every_s": check_every_s,
                   "load_avg_start": load_start["load_avg"], "load_avg_end": load_end["load_avg"],
                   "busy_cores_start": load_start.get("busy_cores"), "busy_cores_end": load_end.get("busy_cores"),
                   "cores": load_start["cores"], "load_warning": warning, "drift": drift, "drift_checks": checks,
                   "drift_warning": drift_msg,
                   "drift_corrected": corrected, "kept": str(keep_path) if keep_path is not None else None,
                   "direct_io": all(r["direct_io"] for r in rows),
                   "configs": rows, "wall_s": time.perf_counter() - t0})
    return report


def _drift_corrected(profile: Any, log: Any, replays: list[tuple], t0: float) -> dict[str, Any] | None:
    """Latency errors with every configuration replayed on the profile as the host checks found it
    while that configuration ran (real.drift.profile_at_drift at the ratios `log` interpolates at
    each real run's midpoint, averaged over its runs); each row gets its ratios and error as
    `drift_corrected`. None without a disk ratio or without configurations. A diagnostic next to the
    errors, which stay those of the profile as given."""
    from real.drift import RATIOS, profile_at_drift
    from sim.engine import simulate
    from traces.format import open_trace

    if not replays or log.ratios_at(t0) is None:
        return None
    errors, used = [], []
    for row, path, spec, cfg, runs, times in replays:
        at = [log.ratios_at(t) for t in times]
        r = {k: float(np.mean([a[k] for a in at])) for k in RATIOS}
        sim = simulate(open_trace(path), spec,
                       profile_at_drift(profile, r["disk"], r["cpu"], r["after_io"], log.read_ratios_at(r)), cfg,
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
    from real.convert import write_shape_store
    from real.records import write_executed_trace
    from real.shape_mode import run_shape, shape_config, shape_trace_like
    from real.store import open_store
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
    from real.store import open_store
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

    from real.store import SCHEMA_VERSION

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
    from real.convert import convert_model
    from real.store import open_store
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
    [point][pass] perf_counter midpoints). `drift` (a real.drift.DriftLog): checks the host between
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
    from real.model_mode import prepare, run_prepared
    from real.records import write_executed_trace
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
    """sim-vs-real scatter, one panel per metric (PNG, atomic)."""
    import os

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
        for mode, marker in zip(MODES, "o^"):
            sel = [i for i, row in enumerate(rows) if row.get("mode", "shape") == mode]
            if sel:
                ax.scatter([r[i] for i in sel], [s[i] for i in sel], s=14, marker=marker, label=mode)
        ax.legend(fontsize=7)
        hi = max(r + s) * 1.05 if r else 1.0
        ax.plot([0, hi], [0, hi], "k--", lw=0.8)
        ax.set_xlabel(f"real {m}")
        ax.set_ylabel(f"simulated {m}")
        ax.set_title(f"{m}: median err {report['per_metric'][m]['median']:.0%}")
    fig.tight_layout()
    path = out_dir / "validate_scatter.png"
    tmp = out_dir / ".validate_scatter.png.tmp.png"
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return [path]
