"""Validation: run a grid of configurations on the real backend, replay what each run did in the
simulator, and report the simulator's relative error per metric (times in seconds, sizes in bytes).

For each configuration (window k x bundling x prefetch x budget):
1. the real backend executes it (`real.shape_mode.run_shape`: a random-weight store of a small
   llama shape, active sets from a synthetic trace; real direct-I/O reads, real sparse compute);
2. the computed sets it executed are written as a trace (`real.records.write_executed_trace`);
3. the simulator replays that trace with the same policies (predictor = oracle on the executed sets,
   so both see exactly the same neurons), the same budget and the device profile (`this-host` or
   --profile);
4. per metric the error is |mean_sim - mean_real| / mean_real over the run's steps (the first
   `WARMUP_STEPS` steps skipped on both sides: cold caches, thread start-up and allocator warm-up
   belong to neither model).

Metrics: latency_s (per-token latency), io_s, compute_s, bytes_read. Summaries over configurations:
median, p90 and max. Nothing is fitted: the simulator runs with the profile as written.
"""

from __future__ import annotations

import itertools
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from devices.model_spec import ModelSpec

METRICS = ("latency_s", "io_s", "compute_s", "bytes_read")
WARMUP_STEPS = 2
FULL_K = (0, 1, 2, 4, 8)
QUICK_K = (0, 2, 8)
BUDGET_FRACTIONS = (0.25, 0.5)   # DRAM for neuron caches, as a fraction of the FFN's bytes


def validation_spec(quick: bool) -> ModelSpec:
    """A small llama shape, stored fp32 (rows of 4 KiB: no padding in either layout; fp32 because
    PyTorch's CPU fp16 GEMV kernels are 2-20x slower than fp32 on this host, see docs/validation.md)."""
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


def grid(quick: bool) -> list[GridPoint]:
    ks = QUICK_K if quick else FULL_K
    budgets = BUDGET_FRACTIONS[1:] if quick else BUDGET_FRACTIONS
    return [GridPoint(k, b, p, f) for k, b, p, f in itertools.product(ks, (True, False), ("none", "delta"), budgets)]


def budget_for(spec: ModelSpec, n_steps: int, fraction: float) -> int:
    """Fixed weights + the largest KV cache + `fraction` of the FFN bytes."""
    ffn = spec.n_layers * spec.d_ff * spec.ffn_neuron_bytes
    return int(spec.non_ffn_bytes + (n_steps + 1) * spec.kv_bytes_per_token + fraction * ffn)


def rel_error(sim: float, real: float) -> float:
    if real == 0:
        return 0.0 if sim == 0 else float("inf")
    return abs(sim - real) / abs(real)


def compare(real_tokens: list, sim_tokens: list) -> dict[str, dict[str, float]]:
    """Per metric: real and simulated means over the measured steps, and the relative error."""
    out = {}
    for m in METRICS:
        r = np.array([getattr(t, m) for t in real_tokens[WARMUP_STEPS:]], float)
        s = np.array([getattr(t, m) for t in sim_tokens[WARMUP_STEPS:]], float)
        out[m] = {"real": float(r.mean()), "sim": float(s.mean()), "error": rel_error(float(s.mean()), float(r.mean()))}
    return out


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    per = {}
    for m in METRICS:
        e = np.array([r["metrics"][m]["error"] for r in rows], float)
        per[m] = {"median": float(np.median(e)), "p90": float(np.percentile(e, 90)), "max": float(e.max())}
    lat = per["latency_s"]
    return {"n_configs": len(rows), "latency_error_median": lat["median"], "latency_error_p90": lat["p90"],
            "latency_error_max": lat["max"], "per_metric": per}


def run_validation(profile: Any, *, quick: bool = False, tokens: int | None = None, seed: int = 0,
                   workdir: str | Path | None = None, progress: Any = None, threads: int | None = 1) -> dict[str, Any]:
    """Runs the grid; returns the JSON report (summary, one row per configuration, provenance)."""
    from real.convert import write_shape_store
    from real.records import write_executed_trace
    from real.shape_mode import run_shape, shape_trace_like
    from real.store import open_store
    from sim.config import RunConfig
    from sim.engine import simulate
    from traces.format import open_trace

    t0 = time.perf_counter()
    spec = validation_spec(quick)
    n_tokens = tokens or (12 if quick else 24)
    tmp = tempfile.TemporaryDirectory(prefix="flashsim-validate-", dir=workdir)
    root = Path(tmp.name)
    try:
        store = open_store(write_shape_store(spec, root / "store", seed=seed, dtype="fp32", layout="both"))
        trace = open_trace(shape_trace_like(spec, root / "trace", n_tokens, seed))
        rows = []
        points = grid(quick)
        for i, gp in enumerate(points):
            budget = budget_for(spec, n_tokens, gp.budget_fraction)
            cfg = RunConfig().with_overrides(gp.overrides(budget) + [f"seed={seed}"])
            run = run_shape(store, trace, profile, cfg, seed=seed, threads=threads)
            tpath = write_executed_trace(root / f"executed-{i}", run, run.view, spec)
            res = simulate(open_trace(tpath), spec, profile, cfg, fast=False)
            rows.append({"config": gp.label, "k": gp.k, "bundled": gp.bundled, "prefetch": gp.prefetch,
                         "budget_fraction": gp.budget_fraction, "budget_bytes": budget,
                         "metrics": compare(run.tokens, res.tokens), "direct_io": run.config["reader"]["direct_io"]})
            if progress:
                progress(i + 1, len(points), gp.label, rows[-1]["metrics"]["latency_s"]["error"])
        report = summarize(rows)
        report.update({"mode": "shape", "model": spec.name, "profile": profile.name, "tokens": n_tokens,
                       "warmup_steps": WARMUP_STEPS, "quick": quick, "seed": seed, "compute_threads": threads,
                       "direct_io": all(r["direct_io"] for r in rows), "configs": rows,
                       "wall_s": time.perf_counter() - t0})
        return report
    finally:
        tmp.cleanup()


def scatter_plot(report: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """sim-vs-real scatter, one panel per metric (PNG, atomic)."""
    import os

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, len(METRICS), figsize=(4 * len(METRICS), 4))
    for ax, m in zip(axes, METRICS):
        r = [row["metrics"][m]["real"] for row in report["configs"]]
        s = [row["metrics"][m]["sim"] for row in report["configs"]]
        ax.scatter(r, s, s=14)
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
