"""One planner configuration at one budget: run it (memoised), say whether it fits and what limits it.

`Planner.evaluate(preset, overrides, budget_bytes, ideal=False)` returns an `Evaluation`: the run's
summary, or why it did not run as a typed `failure` (`DOES_NOT_FIT`: the simulator's `BudgetError`,
or the spec-only check below; `CANNOT_RUN`: any other refusal), never read from the message text.
`ideal=True` runs the configuration with its policy idealisations switched on (oracle predictor,
perfect prefetch; sim.policies.presets.ideal_policy): the ideal-policy bound; a configuration that
is already ideal shares its own run.

Before any run (and before any trace is loaded or synthesised: the trace is a callable, resolved on
the first run) each configuration's resident weights are checked against the budget from the model
spec alone: the non-FFN weights every non-paging residency keeps (at the configuration's precision).
A budget below that cannot fit whatever the trace, and says so.

Binding constraint, from the simulated per-token breakdown (ms): the largest of flash stall (time
the decoder waits for reads: "flash bandwidth"), compute and memory management (moving cache rows:
"memory management"). Compute is split by what bounds it: the decode step's weight and KV bytes
streamed at the DRAM bandwidth against its FLOPs at the FLOP rate (sim/components/compute.py:
t = max(FLOPs / rate, bytes / bandwidth) per phase); where the bytes take longer the limit is "DRAM
bandwidth" (faster memory helps, a faster GPU does not), else "compute". A flash-bound configuration
whose cache already fills the budget (peak >= `CACHE_FULL_SHARE` of it) is "memory capacity" bound:
more DRAM means fewer reads. A configuration that does not fit is bound by memory capacity.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from devices.errors import BudgetError, FlashsimError
from devices.model_spec import ModelSpec
from devices.schema import DeviceProfile
from devices.units import format_bytes
from sim.config import RunConfig
from sim.energy import step_traffic
from sim.engine import SetAlgebraCache, Simulation, build
from sim.policies.presets import ideal_policy, preset_config
from traces.format import DECODE, Trace

FLASH, COMPUTE, DRAM_BW, MEM_MGMT, MEM_CAP = (
    "flash bandwidth", "compute", "DRAM bandwidth", "memory management", "memory capacity")
CACHE_FULL_SHARE = 0.97          # DRAM peak / budget at which a cache counts as full
DOES_NOT_FIT, CANNOT_RUN = "does not fit", "cannot run"


@dataclass
class Evaluation:
    """One configuration at one budget."""

    preset: str
    overrides: tuple[str, ...]
    budget_bytes: int
    summary: dict[str, Any] | None = None  # None: it did not run
    error: str | None = None               # the refusal's message
    failure: str | None = None             # DOES_NOT_FIT or CANNOT_RUN when it did not run

    @property
    def label(self) -> str:
        return " ".join((self.preset, *self.overrides))

    @property
    def ran(self) -> bool:
        return self.summary is not None

    def metric(self, key: str) -> float:
        return float(self.summary[key]) if self.summary is not None else math.nan


def binding_constraint(summary: dict[str, Any] | None, budget_bytes: int) -> str:
    """The resource that limits a configuration, from its per-token breakdown (see the module doc)."""
    if summary is None:
        return MEM_CAP
    flop_ms, dram_ms = summary.get("compute_flop_ms_per_token"), summary.get("compute_dram_ms_per_token")
    compute = DRAM_BW if flop_ms is not None and dram_ms is not None and dram_ms >= flop_ms else COMPUTE
    parts = {FLASH: summary["stall_ms_per_token"], compute: summary["compute_ms_per_token"],
             MEM_MGMT: summary["memory_mgmt_ms_per_token"]}
    top = max(parts, key=lambda k: parts[k])
    if top == FLASH and summary["dram_peak_bytes"] >= CACHE_FULL_SHARE * budget_bytes:
        return MEM_CAP
    return top


def compute_split(sim: Any) -> dict[str, float]:
    """Per decode step (ms): its FLOPs at the FLOP rate and its DRAM bytes (weights, KV cache, row
    moves) at the DRAM bandwidth, as the run's compute model prices them."""
    traffic = step_traffic(sim.planner, sim.planner.arr)
    dec = sim.steps.phase == DECODE
    if not dec.any():
        return {}
    c = sim.planner.compute
    return {"compute_flop_ms_per_token": 1e3 * float(np.mean(traffic.flops[dec])) / c.flops_per_s,
            "compute_dram_ms_per_token": 1e3 * float(np.mean(traffic.dram_bytes[dec])) / c.dram_bytes_per_s}


def resident_floor_bytes(config: RunConfig, spec: ModelSpec) -> int:
    """Bytes a configuration keeps resident whatever the trace: the non-FFN weights at its precision,
    unless its residency pages the whole file or it streams them (0 with pruning: blocks leave)."""
    if config.prune.blocks or config.memory.stream_non_ffn or config.residency.instantiate().page_granular:
        return 0
    return int(config.precision.instantiate().transform(spec).non_ffn_bytes)


def default_workers() -> int:
    """Threads `Planner.evaluate_many` uses: the cores this process may run on (at most 4), or
    FLASHSIM_PLAN_THREADS."""
    env = os.environ.get("FLASHSIM_PLAN_THREADS", "").strip()
    if env.isdigit() and int(env) >= 1:
        return int(env)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, 4))


class Planner:
    """Evaluates configurations of one (trace, model, device) at any budget, memoised. `trace` may be
    a callable that returns it: it is called once, on the first configuration that must run.

    `evaluate_many` runs independent configurations on `workers` threads: a run is NumPy work on
    arrays of a layer's sets, which releases the GIL, and each run's result depends only on its
    configuration (its policies and generators are its own; the shared caches hold values that any
    thread computes alike), so the answers do not depend on the number of threads or their order."""

    def __init__(self, trace: Trace | Callable[[], Trace], spec: ModelSpec, profile: DeviceProfile, *,
                 rescale: bool | None = False, seed: int = 0, progress: Callable[[], None] | None = None,
                 cache: SetAlgebraCache | None = None, runtime: str | None = None, workers: int | None = None,
                 clock: RunClock | None = None):
        self._trace = trace
        self.runtime = runtime      # compute.runtime of every configuration (None: the preset's)
        self.spec, self.profile = spec, profile
        self.rescale, self.seed, self.progress = rescale, seed, progress
        self.cache = cache or SetAlgebraCache()
        self.workers = workers or default_workers()
        self._memo: dict[tuple, Evaluation] = {}
        self._lock = threading.RLock()
        self.n_runs = 0
        self.clock = clock or RunClock()

    @property
    def trace(self) -> Trace:
        with self._lock:
            if callable(self._trace) and not isinstance(self._trace, Trace):
                self._trace = self._trace()
            return self._trace

    @property
    def trace_loaded(self) -> bool:
        return isinstance(self._trace, Trace)

    def config(self, preset: str, overrides: Sequence[str], budget_bytes: int) -> RunConfig:
        """The configuration at this budget and seed (rescaling, which needs the trace, is added by the run)."""
        sets = [*overrides, f"memory.dram_budget_bytes={int(budget_bytes)}", f"sim.seed={self.seed}"]
        if self.runtime is not None:
            sets.append(f"compute.runtime={self.runtime}")
        return preset_config(preset).with_overrides(sets)

    def _rescale(self, trace: Trace) -> bool:
        """`rescale` as given, or (None) whether the trace's shape differs from the model's."""
        if self.rescale is None:
            return (trace.n_layers, trace.n_neurons) != (self.spec.n_layers, self.spec.d_ff)
        return self.rescale

    def evaluate_many(self, requests: Sequence[tuple[str, Sequence[str], int]], *, ideal: bool = False) -> list[Evaluation]:
        """`evaluate` of each (preset, overrides, budget_bytes), in order, run by `run_all`."""
        self.run_all([(p, o, b, ideal) for p, o, b in requests])
        return [self.evaluate(p, o, b, ideal=ideal) for p, o, b in requests]

    def run_all(self, requests: Sequence[tuple[str, Sequence[str], int, bool]]) -> None:
        """Run every (preset, overrides, budget_bytes, ideal) not yet memoised, on `workers` threads.
        The first request is built alone (it loads the trace and builds the shared view), then every
        request whose predictor is drawn (simulated from statistics) before any runs: bound, they
        announce themselves, and noisy predictors that differ only in recall and precision draw each
        layer's latents once for all (sim/policies/predictor.py). The others are built by the task
        that runs them. Runs start with one configuration of each preset, the drawn ones first (the
        longest runs, which draw together when they start together): runs of one preset share their
        predictor's draws, which one thread makes while the others would wait for it."""
        todo = [r for r in dict.fromkeys((p, tuple(o), int(b), bool(i)) for p, o, b, i in requests)
                if r not in self._memo]
        drawn = [r for r in todo if self._drawn(r)]
        built = {r: self._built(*r) for r in dict.fromkeys([*todo[:1], *drawn])}
        first: dict[str, tuple] = {}
        for r in [*drawn, *todo]:
            first.setdefault(r[0], r)
        order = list(dict.fromkeys([*first.values(), *todo]))

        def task(r: tuple) -> None:
            b = built[r] if r in built else self._built(*r)
            if b is not None:
                self._finish(b)

        if self.workers > 1 and len(order) > 1:
            with ThreadPoolExecutor(self.workers, thread_name_prefix="flashsim-plan") as pool:
                list(pool.map(task, order))
        else:
            for r in order:
                task(r)

    def _drawn(self, request: tuple) -> bool:
        """Whether the request's predictor is simulated from statistics (drawn), from its configuration alone."""
        cfg: RunConfig | None = self.config(*request[:3])
        if request[3]:
            cfg = ideal_policy(cfg)
        return cfg is not None and not cfg.predictor.instantiate().sets_from_the_model()

    def evaluate(self, preset: str, overrides: Sequence[str], budget_bytes: int, *, ideal: bool = False) -> Evaluation:
        key = (preset, tuple(overrides), int(budget_bytes), ideal)
        if key in self._memo:
            return self._memo[key]
        if ideal and ideal_policy(self.config(preset, overrides, budget_bytes)) is None:
            # already ideal: its own run is the bound
            return self._keep(key, self.evaluate(preset, overrides, budget_bytes))
        b = self._built(preset, overrides, budget_bytes, ideal)
        if b is not None:
            self._finish(b)
        return self._memo[key]

    def _built(self, preset: str, overrides: Sequence[str], budget_bytes: int, ideal: bool) -> _Built | None:
        """The request's run, built and not yet run; None when there is nothing to run: memoised,
        already ideal (`evaluate` shares its own run), or refused before running (memoised now)."""
        key = (preset, tuple(overrides), int(budget_bytes), ideal)
        if key in self._memo:
            return None
        cfg: RunConfig | None = self.config(preset, overrides, budget_bytes)
        if ideal:
            cfg = ideal_policy(cfg)
            if cfg is None:
                return None
        ev = Evaluation(preset, tuple(overrides), int(budget_bytes))
        floor = resident_floor_bytes(cfg, self.spec)
        if floor > budget_bytes:
            ev.failure = DOES_NOT_FIT
            ev.error = (f"DRAM budget {format_bytes(int(budget_bytes))} is too small: the resident non-FFN weights "
                        f"alone are {format_bytes(floor)} (from the model spec)")
            self._keep(key, ev)
            return None
        trace = self.trace
        if self._rescale(trace):
            cfg = cfg.with_overrides(["sim.rescale=true"])
        with self.clock.running():
            try:
                return _Built(key, ev, build(trace, self.spec, self.profile, cfg, cache=self.cache))
            except FlashsimError as e:
                self._refused(ev, e)
        self._counted()
        self._keep(key, ev)
        return None

    def _finish(self, b: _Built) -> None:
        """Run a built request and memoise its evaluation."""
        with self.clock.running():
            try:
                b.ev.summary = b.sim.run().summary()
                b.ev.summary.update(compute_split(b.sim))
            except FlashsimError as e:
                self._refused(b.ev, e)
        self._counted()
        self._keep(b.key, b.ev)

    @staticmethod
    def _refused(ev: Evaluation, e: FlashsimError) -> None:
        # the budget check and cache-capacity refusals name the shortfall
        ev.failure, ev.error = (DOES_NOT_FIT if isinstance(e, BudgetError) else CANNOT_RUN), str(e)

    def _keep(self, key: tuple, ev: Evaluation) -> Evaluation:
        with self._lock:
            return self._memo.setdefault(key, ev)

    def _counted(self) -> None:
        with self._lock:
            self.n_runs += 1
        if self.progress:
            self.progress()

class RunClock:
    """Wall seconds during which at least one simulated run is being built or run (`seconds`), for
    any number of threads and of planners sharing it (a plan's runs on the achievable numbers and
    its peak-bound runs overlap)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._active = 0
        self._since = 0.0
        self._lock = threading.Lock()

    @contextmanager
    def running(self) -> Iterator[None]:
        with self._lock:
            if self._active == 0:
                self._since = time.perf_counter()
            self._active += 1
        try:
            yield
        finally:
            with self._lock:
                self._active -= 1
                if self._active == 0:
                    self.seconds += time.perf_counter() - self._since


@dataclass
class _Built:
    """A request's run, built (its policies bound) and not yet run."""

    key: tuple
    ev: Evaluation
    sim: Simulation
