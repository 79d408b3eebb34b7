"""What a read wait costs the real decoder's layer, next to what the simulator adds for it
(the profile's `flash.cold_compute_s`, measured on bench_cold's tiny probe layer).

Validate's shape store and trace, grid points without prefetch at 25% of the FFN: each runs in
shape mode with its real reads, and again with the reads' I/O skipped (`BundleReader._run` does
nothing: the plan, the cache and the compute are the same, but nothing waits), alternating. The
difference in compute per layer is the wait's cost on this layer; printed next to the profile's
penalty at the run's wait per layer, and their ratio. Printed, not asserted (a ratio above 1 is
compute the simulator misses without prefetch; an Intel Xeon VM measured 1.3-2.6).

Where the cost lands: the difference split over the FFN (the records' `ffn_compute_s`), the cache
work (`mem_mgmt_s`) and the rest of the compute (attention side), next to the simulator's
`COLD_SPLIT` (an Intel Xeon VM measured 42-58 / 16-24 / 21-38%); the same in model mode
(SmolLM2, validate's store and text) when transformers is installed."""

from __future__ import annotations

import numpy as np
import pytest

from devices import load_profile

pytest.importorskip("torch")

POINTS = ((0, True), (2, True), (8, True), (8, False))   # (window k, bundled)
RUNS = 3                                                   # per side, alternating
TOKENS = 24


def _compute_per_token(run) -> tuple[float, float, float]:  # type: ignore[no-untyped-def]
    """(mean compute seconds, mean reads, mean seconds waited) per token after validate's warm-up steps."""
    from real.validate_score import WARMUP_STEPS

    toks = run.tokens[WARMUP_STEPS:]
    return (float(np.mean([t.compute_s for t in toks])), float(np.mean([t.reads_issued for t in toks])),
            float(np.mean([t.stall_s for t in toks])))


def _penalty_row(label: str, runs: dict[str, list], n_layers: int, profile, framework: bool) -> tuple:  # type: ignore[no-untyped-def]
    """(label, reads and seconds waited per layer, compute per token with and without the wait, the
    wait's cost per layer, the profile's penalty at that wait) from paired runs."""
    sides = {side: np.median([_compute_per_token(r) for r in rs], axis=0) for side, rs in runs.items()}
    with_reads, reads, stall = sides["reads"]
    without = sides["no wait"][0]
    reads_per_batch, wait_s = reads / n_layers, stall / n_layers
    priced = float(profile.flash.cold_compute_at(np.array([wait_s]), np.array([reads_per_batch]), framework)[0])
    return label, reads_per_batch, wait_s, with_reads, without, (with_reads - without) / n_layers, priced


def _print_penalties(title: str, rows: list) -> None:
    print(f"\nthe read wait's cost per layer, {title}, no prefetch ({RUNS} runs a side, medians) | "
          "the profile's penalty at that wait")
    for label, reads, wait, a, b, pen, priced in rows:
        print(f"  {label:42s} {reads:6.1f} reads, {wait * 1e3:5.2f} ms waited per layer; compute {a * 1e3:6.2f} vs "
              f"{b * 1e3:6.2f} ms/token: {pen * 1e6:6.1f} us/layer | priced {priced * 1e6:6.1f} us "
              f"({pen / priced if priced else float('nan'):.2f}x)")


def _phases(run) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Mean seconds per token after warm-up: FFN, cache work, the rest of the compute."""
    from real.validate_score import WARMUP_STEPS

    toks = run.tokens[WARMUP_STEPS:]
    return np.array([np.mean([t.ffn_compute_s for t in toks]), np.mean([t.mem_mgmt_s for t in toks]),
                     np.mean([t.compute_s - t.ffn_compute_s for t in toks])])


def _paired_runs(monkeypatch, run) -> dict[str, list]:  # type: ignore[no-untyped-def]
    """RUNS real runs a side, alternating reads, no wait, no wait, reads, ...: `run()` with the
    reader's I/O real ("reads") or skipped ("no wait": `BundleReader._run` does nothing)."""
    from real.reader import BundleReader

    real_run = BundleReader._run
    runs: dict[str, list] = {"reads": [], "no wait": []}
    for i in range(2 * RUNS):
        side = ("reads", "no wait")[(i + i // 2) % 2]
        monkeypatch.setattr(BundleReader, "_run", real_run if side == "reads" else lambda *a, **kw: 0)
        runs[side].append(run())
    monkeypatch.setattr(BundleReader, "_run", real_run)
    return runs


def _split(runs: dict[str, list]) -> np.ndarray:
    """Per phase (`_phases`): the median with reads less the median without a wait."""
    return np.median([_phases(r) for r in runs["reads"]], axis=0) - np.median([_phases(r) for r in runs["no wait"]],
                                                                                 axis=0)


def _print_split(title: str, rows: list) -> None:
    from sim.components.compute import COLD_SPLIT

    print(f"\n{title}: where the wait's cost lands (reads - no wait, medians), ms per token: FFN, cache work, "
          f"attention side | shares (the simulator's COLD_SPLIT: {', '.join(f'{x:.0%}' for x in COLD_SPLIT)})")
    for label, d in rows:
        shares = d / d.sum() if d.sum() > 0 else d * np.nan
        print(f"  {label:42s} " + " ".join(f"{x * 1e3:6.2f}" for x in d) + " | "
              + " ".join(f"{x:4.0%}" for x in shares))


def test_bench_wait_penalty(tmp_path, monkeypatch):
    from real.convert import write_shape_store
    from real.shape_mode import run_shape, shape_config, shape_trace_like
    from real.store import open_store
    from real.validate import GridPoint, validation_spec
    from traces.format import open_trace

    profile = load_profile("this-host")
    spec = validation_spec(quick=False)
    store = open_store(write_shape_store(spec, tmp_path / "store", seed=0, dtype="fp32", layout="both"))
    trace = open_trace(shape_trace_like(spec, tmp_path / "trace", TOKENS, 0))
    rows, splits = [], []
    for k, bundled in POINTS:
        gp = GridPoint(k, bundled, "none", 0.25)
        _, cfg = gp.run_config(store, TOKENS, 0)
        cfg = shape_config(cfg)
        runs = _paired_runs(monkeypatch, lambda cfg=cfg: run_shape(store, trace, profile, cfg, seed=0, threads=1))
        splits.append((gp.label, _split(runs)))
        rows.append(_penalty_row(gp.label, runs, spec.n_layers, profile, framework=False))
    _print_penalties("validate's shape", rows)
    _print_split("shape mode", splits)
    assert all(np.isfinite(r[5]) for r in rows)


MODEL_POINTS = ((2, True, 0.5), (4, False, 0.5), (0, False, 0.5))   # (window k, bundled, budget): grid points of model mode


def test_bench_wait_split_model_mode(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from real.model_mode import prepare, run_prepared
    from real.validate import MODEL_KEEP, GridPoint, model_setup

    profile = load_profile("this-host")
    model, spec, store, ids = model_setup(TOKENS, tmp_path)
    ref = prepare(model, spec, store, ids, keep_fraction=MODEL_KEEP, workdir=tmp_path)
    splits, rows = [], []
    for k, bundled, budget in MODEL_POINTS:
        gp = GridPoint(k, bundled, "none", budget)
        _, cfg = gp.run_config(store, len(ids), 0)
        runs = _paired_runs(monkeypatch, lambda cfg=cfg: run_prepared(ref, model, spec, store, profile, cfg, device="cpu",
                                                                      threads=1)[0])
        splits.append((gp.label, _split(runs)))
        rows.append(_penalty_row(gp.label, runs, spec.n_layers, profile, framework=True))
    _print_penalties("SmolLM2 (model mode)", rows)
    _print_split("model mode (SmolLM2)", splits)
    assert all(np.all(np.isfinite(d)) for _, d in splits)
