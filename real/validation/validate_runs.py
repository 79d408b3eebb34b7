"""Running the validation grid in one mode: the real backend executes every configuration, repeated
over passes, and the simulator replays what each run did (times in seconds, sizes in bytes).

Owns, per mode, steps 1-3 of real/validation/validate.py's method and the rows they give: shape mode
(`shape_rows`: a random-weight store of `validation_spec`, active sets from a synthetic trace) and
model mode (`model_rows`: SmolLM2 token by token, `model_setup`), the real passes over the grid
(`_passes`, the drift checks between runs), the executed trace of each run written and replayed, and
one report row per configuration (`_row`, scored by real.validation.validate_score.compare). The grid
itself is real/validation/validate_grid.py; the whole validation and its report, validate.py.

Model mode's store (fp32, both layouts, ~1.1 GiB for SmolLM2) is converted once and cached under
the flashsim cache folder (`$FLASHSIM_CACHE`/stores/, `cached_store`), keyed by the model's weight
file (path, size, modification time) and the store settings; a damaged entry is converted again.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from devices.model_spec import ModelSpec
from real.validation.validate_grid import MODEL_KEEP, MODEL_NAME, STORE_SETTINGS, GridPoint
from real.validation.validate_score import compare


def _row(mode: str, gp: GridPoint, budget: int, metrics: dict, run: Any) -> dict[str, Any]:
    return {"mode": mode, "config": f"{mode}: {gp.label}", "k": gp.k, "bundled": gp.bundled, "prefetch": gp.prefetch,
            "budget_fraction": gp.budget_fraction, "budget_bytes": budget, "metrics": metrics,
            "direct_io": run.config["reader"]["direct_io"]}


def shape_rows(profile: Any, spec: ModelSpec, grid: list[GridPoint], n_tokens: int, seed: int, root: Path,
               threads: int | None, rows: list, progress: Any, n_total: int, repeats: int = 1,
               replays: list | None = None, drift: Any = None) -> dict[str, Any]:
    """Shape mode on `spec` (a random-weight store, a synthetic trace): every point of `grid` run
    `repeats` times, replayed and scored; a row each appended to `rows` (and its replay to `replays`)."""
    from real.runtime.run_outputs import write_executed_trace
    from real.runtime.shape_mode import run_shape, shape_config, shape_trace_like
    from real.weights.convert import write_shape_store
    from real.weights.store import open_store
    from sim.engine import simulate
    from traces.format import open_trace

    store = open_store(write_shape_store(spec, root / "store", seed=seed, dtype="fp32", layout="both"))
    trace = open_trace(shape_trace_like(spec, root / "trace", n_tokens, seed))
    points = []
    for gp in grid:
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
        # a damaged entry of the tool's own store cache (named by the source's key, under the cache
        # folder): removed before converting again; anything else at that path is left alone
        if path.is_dir() and not path.is_symlink():
            import shutil

            shutil.rmtree(path)
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


def model_rows(profile: Any, grid: list[GridPoint], n_tokens: int, seed: int, root: Path, threads: int | None,
               rows: list, progress: Any, n_total: int, repeats: int = 1, replays: list | None = None,
               drift: Any = None) -> dict[str, Any]:
    """Model mode (`model_setup`'s model and store, the oracle top-`MODEL_KEEP` active sets): every point
    of `grid` run `repeats` times, replayed and scored, as `shape_rows`; with the quality of the first run."""
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
    for gp in grid:
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
