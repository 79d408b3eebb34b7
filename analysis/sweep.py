"""Running a sweep: every point of a spec, on a local process pool or a Dask cluster, resumably.

`run_sweep(spec, out_dir)` expands the spec, checks the names it uses, writes (or checks) the
manifest, skips the points already in `out_dir/results`, and evaluates the rest:
  - engine "local": a `concurrent.futures.ProcessPoolExecutor` with the forkserver start method
    (spawn where there is none); workers exit by themselves if the sweep process dies; one worker
    runs the points in-process;
  - engine "dask": a `distributed` cluster at `scheduler` (an address), or a LocalCluster of
    `workers` single-threaded worker processes when none is given.
Finished rows are flushed to Parquet in batches (every `_FLUSH_S` seconds or `_flush_every` rows,
and at the end, on Ctrl-C and on errors), so killing the sweep loses only unflushed points; a rerun
computes exactly those. Each row holds the point's columns (see `POINT_COLUMNS`), its status
("ok" or "error" with the one-line message of the FlashsimError that stopped it) and the evaluator's
flat metrics. Rows carry no timings, so the same spec and seed give the same table whatever the
engine, the worker count or how often the sweep was interrupted.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import multiprocessing as mp
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis import sweep_store as store
from analysis.sweep_spec import (
    LoadedSpec,
    SweepPoint,
    expand,
    load_spec,
    resolve_device,
    resolve_trace,
    trace_sha256,
)
from devices.errors import FlashsimError
from devices.progress import Stage
from devices.suggest import hint

DEFAULT_EVALUATOR = "analysis.sweep_point:evaluate_point"
ENGINES = ("local", "dask")
POINT_COLUMNS = ("point_id", "point_index", "trace", "trace_sha256", "model", "device",
                 "dram_budget_bytes", "preset", "overrides_json", "seed", "status", "error")
_FLUSH_S = 2.0  # a kill loses at most this long of finished work (plus what was running)
DASK_CONNECT_S = 10.0  # how long to try reaching a --scheduler before giving up


@dataclass(frozen=True)
class SweepOutcome:
    """What one `run_sweep` call did."""

    out_dir: Path
    n_points: int
    n_skipped: int      # already in the results before this call
    n_run: int          # evaluated by this call
    n_errors: int       # of those, points whose evaluation raised a FlashsimError
    wall_s: float
    engine: str
    workers: int

    @property
    def points_per_s(self) -> float:
        return self.n_run / self.wall_s if self.wall_s > 0 else math.inf

    def to_dict(self) -> dict[str, Any]:
        return {"out_dir": str(self.out_dir), "n_points": self.n_points, "n_skipped": self.n_skipped,
                "n_run": self.n_run, "n_errors": self.n_errors, "wall_s": self.wall_s,
                "points_per_s": self.points_per_s, "engine": self.engine, "workers": self.workers}


# ---- evaluators --------------------------------------------------------------------------------

def resolve_evaluator(ref: str) -> Callable[[SweepPoint], dict[str, Any]]:
    """`"package.module:function"` -> the function (imported in whichever process needs it)."""
    mod_name, _, fn_name = ref.partition(":")
    if not mod_name or not fn_name:
        raise FlashsimError(f"evaluator {ref!r}: expected 'package.module:function'")
    try:
        fn = getattr(importlib.import_module(mod_name), fn_name)
    except (ImportError, AttributeError) as e:
        raise FlashsimError(f"evaluator {ref!r}: cannot import it ({e})") from None
    if not callable(fn):
        raise FlashsimError(f"evaluator {ref!r}: not a function")
    return fn


def evaluate_row(evaluator: str, point: dict[str, Any]) -> dict[str, Any]:
    """Evaluate one point (given as plain data) and build its result row. Runs in the workers."""
    p = SweepPoint.from_dict(point)
    row: dict[str, Any] = {
        "point_id": p.point_id, "point_index": p.index, "trace": p.trace, "trace_sha256": p.trace_sha256,
        "model": p.model, "device": p.device, "dram_budget_bytes": p.dram_budget_bytes,
        "preset": p.preset, "overrides_json": json.dumps(p.overrides, sort_keys=True),
        "seed": p.seed, "status": "ok", "error": None,
    }
    try:
        metrics = resolve_evaluator(evaluator)(p)
    except FlashsimError as e:
        row.update(status="error", error=str(e))
        return row
    if not isinstance(metrics, dict):
        raise TypeError(f"evaluator {evaluator} returned {type(metrics).__name__}, not a dict")
    for k, v in metrics.items():
        if k in row:
            raise ValueError(f"evaluator {evaluator} returned column {k!r}, which names a point column")
        if not (v is None or isinstance(v, (bool, int, float, str))):
            raise TypeError(f"evaluator {evaluator}: column {k!r} holds {type(v).__name__}, not a scalar")
    row.update(metrics)
    return row


# ---- the sweep ---------------------------------------------------------------------------------

def build_manifest(loaded: LoadedSpec, points: list[SweepPoint], evaluator: str) -> dict[str, Any]:
    """Provenance of a sweep directory; `sweep_store.COMPATIBLE_FIELDS` must match on a rerun."""
    from devices.model_spec import load_model
    from devices.schema import profile_file

    spec = loaded.spec
    traces = {t: trace_sha256(resolve_trace(loaded, t)) for t in spec.traces}
    devices = {}
    for d in spec.devices:
        path = profile_file(resolve_device(loaded, d))
        devices[d] = store.file_sha256(path)
    models = {}
    for m in spec.models:
        if m is not None:
            dumped = load_model(m).model_dump(mode="json")
            models[m] = hashlib.sha256(json.dumps(dumped, sort_keys=True).encode()).hexdigest()
    return {
        "format": store.FORMAT, "schema_version": store.SCHEMA_VERSION,
        "flashsim_version": store.flashsim_version(), "git": store.git_commit(),
        "evaluator": evaluator, "spec_path": str(loaded.path), "spec_sha256": loaded.spec_sha256,
        "spec": spec.model_dump(mode="json"), "seed": spec.seed,
        "inputs": {"traces": traces, "devices": devices, "models": models},
        "n_points": len(points), "point_ids": [p.point_id for p in points],
    }


def run_sweep(spec: str | Path | LoadedSpec, out_dir: str | Path, *, workers: int | None = None,
              engine: str = "local", scheduler: str | None = None, evaluator: str = DEFAULT_EVALUATOR,
              progress: bool | None = None) -> SweepOutcome:
    """Run (or resume) a sweep into `out_dir`; see the module docstring. `progress=None`/True: a bar on a
    terminal, one line at the end in a log (devices/progress.py); False: none."""
    t0 = time.perf_counter()
    if engine not in ENGINES:
        raise FlashsimError(f"unknown engine {engine!r}; {hint(engine, ENGINES, 'use one of')}")
    if scheduler and engine != "dask":
        raise FlashsimError("--scheduler needs --engine dask")
    workers = default_workers() if workers is None else workers
    if workers < 1:
        raise FlashsimError(f"--workers must be >= 1, got {workers}")
    loaded = spec if isinstance(spec, LoadedSpec) else load_spec(spec)
    points = expand(loaded)
    fn = resolve_evaluator(evaluator)
    check = getattr(sys.modules[fn.__module__], "check_points", None)
    if callable(check):
        try:
            check(points)
        except FlashsimError as e:
            raise FlashsimError(f"{loaded.path}: {e}") from None
    out = Path(out_dir)
    store.check_out_dir(out)
    created = not out.exists()
    try:
        outcome, first_error = _run_points(loaded, points, out, evaluator, engine, workers, scheduler, progress, t0)
    except BaseException:
        if created and out.exists() and not store.finished_point_ids(out):   # nothing written: leave nothing
            shutil.rmtree(out, ignore_errors=True)
        raise
    if outcome.n_points and outcome.n_errors == outcome.n_points:
        if created:
            shutil.rmtree(out, ignore_errors=True)
        raise FlashsimError(f"every one of the {outcome.n_points} sweep points failed"
                            f"{' (nothing kept)' if created else ''}; the first: {first_error}")
    return outcome


def _run_points(loaded: LoadedSpec, points: list[SweepPoint], out: Path, evaluator: str, engine: str,
                workers: int, scheduler: str | None, progress: bool | None,
                t0: float) -> tuple[SweepOutcome, str | None]:
    """Run the points not yet in `out` (locked); (outcome, the first error message of this run)."""
    first_error = None
    with store.locked(out):
        store.ensure_manifest(out, build_manifest(loaded, points, evaluator))
        store.remove_stale_temporaries(out)
        done = store.finished_point_ids(out)
        unknown = done - {p.point_id for p in points}
        if unknown:  # cannot happen with a matching manifest unless files were copied in
            raise FlashsimError(f"{out}: results hold {len(unknown)} point(s) this spec does not have; "
                                "use a new --out")
        todo = [p for p in points if p.point_id not in done]
        writer = store.ResultWriter(out)
        n_errors = 0
        flush_every = max(1, min(100, math.ceil(len(points) / 50)))
        bar = Stage(f"sweep {out}", len(points), "points", initial=len(done), enabled=progress is not False)
        last_flush = time.monotonic()
        rows = (_run_local(todo, evaluator, workers) if engine == "local"
                else _run_dask(todo, evaluator, workers, scheduler))
        finished = False
        try:
            for row in rows:
                writer.add(row)
                n_errors += row["status"] != "ok"
                first_error = first_error or row.get("error")
                bar.update(1)
                if len(writer.rows) >= flush_every or time.monotonic() - last_flush >= _FLUSH_S:
                    writer.flush()
                    last_flush = time.monotonic()
            finished = True
        finally:
            rows.close()  # stops the engine: pending points cancelled, running ones finished
            writer.flush()
            bar.close(finished=finished)
    return SweepOutcome(out, len(points), len(done), writer.n_written, n_errors,
                        time.perf_counter() - t0, engine, workers), first_error


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


# ---- engines -----------------------------------------------------------------------------------

def _run_local(todo: list[SweepPoint], evaluator: str, workers: int) -> Iterator[dict[str, Any]]:
    if not todo:
        return
    if workers == 1:
        for p in todo:
            yield evaluate_row(evaluator, p.to_dict())
        return
    method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    ctx = mp.get_context(method)
    if method == "forkserver":  # workers fork from a server that imported these once
        ctx.set_forkserver_preload(["analysis.sweep", evaluator.partition(":")[0]])
    ex = ProcessPoolExecutor(max_workers=min(workers, len(todo)), mp_context=ctx,
                             initializer=_worker_init)
    try:
        futures = [ex.submit(evaluate_row, evaluator, p.to_dict()) for p in todo]
        for f in as_completed(futures):
            yield f.result()
    except BrokenProcessPool:
        raise FlashsimError("a sweep worker process died (out of memory?); the finished points are "
                            "kept: rerun, perhaps with fewer --workers") from None
    finally:
        ex.shutdown(wait=True, cancel_futures=True)


def _worker_init() -> None:
    """Exit a worker as soon as the sweep process is gone (kill -9 leaves no orphans behind);
    leave Ctrl-C to the sweep process, which stops the pool and keeps the finished points."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = mp.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_with_parent, args=(parent.sentinel,), daemon=True).start()


def _exit_with_parent(sentinel: int) -> None:
    from multiprocessing.connection import wait

    wait([sentinel])
    os._exit(1)


def _run_dask(todo: list[SweepPoint], evaluator: str, workers: int,
              scheduler: str | None) -> Iterator[dict[str, Any]]:
    try:
        from distributed import Client, LocalCluster
        from distributed import as_completed as dask_completed
    except ImportError:
        raise FlashsimError("--engine dask needs the 'cluster' extra: pip install -e '.[cluster]'") from None
    if not todo:
        return
    cluster = None
    try:
        if scheduler:
            client = Client(scheduler, timeout=f"{DASK_CONNECT_S}s")
        else:
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                   dashboard_address=None)
            client = Client(cluster)
    except (OSError, TimeoutError) as e:
        raise FlashsimError(f"cannot reach the Dask scheduler at {scheduler}: {e}") from None
    try:
        futures = client.map(evaluate_row, [evaluator] * len(todo), [p.to_dict() for p in todo],
                             key=[f"flashsim-point-{p.point_id}" for p in todo], pure=False)
        for f in dask_completed(futures):
            yield f.result()
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
