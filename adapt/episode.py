"""Episodes: replay a memory timeline and a workload with a controller; count violations, time, quality.

Owns: `Workload` (batch, prompt tokens, decode tokens), `StepTimer` (simulated time per decode step
for a dropped set, one `sim.engine.simulate` run per distinct set, cached), `EpisodeSetup` (model,
blocks, importance, quality, timer: what every episode of one evaluation shares), `run_episode`
and `EpisodeResult` (the per-step records as a pandas frame and the summary).

An episode is the decode phase of the workload: step j (0-based) decodes one token for each of the
`batch` sequences, whose KV cache then holds kv_tokens_j = batch x (prompt_tokens + j + 1) entries
(the prefill has run before t = 0; its KV cache is there at step 0). Simulated time starts at 0 at
the first decode step and advances by each step's simulated latency, so a faster (pruned) model
moves through the timeline faster.

At step j, at time t_j:
  1. available_j = timeline.at(t_j): a budget change inside a step is seen at the next step
     boundary (the runtime can only act between steps, ~ms apart);
  2. decision point when j = 0, j is a multiple of `decide_every`, available_j differs from the
     previous step's, or the current dropped set no longer fits (the KV cache grew past the budget:
     the runtime notices when it cannot allocate the step's KV entries) -> `controller.decide(state)`;
  3. footprint_j = BlockMemory.footprint_bytes(dropped, kv_tokens_j): resident weights of the kept
     blocks + always-resident parts + KV of the kept MHA blocks (RAP's setting: all weights in DRAM).
     A controller that streams FFN weights from flash instead (`sim_settings`, see below) is charged
     the simulator's own DRAM accounting of the step (`resident_bytes`).
     violation_j = footprint_j > available_j;
  4. step_s_j = the simulated latency of decode step j with the current dropped set (`prune.blocks`);
  5. log_ppl_j = the quality model's log perplexity of the dropped set.

Summary: violations (steps over budget), max_over_bytes, ppl = exp(mean_j log_ppl_j) (the perplexity
of the generated stream if each token suffers its step's dropped set), worst_ppl, tokens_per_s =
batch x steps / sum_j step_s_j, decisions, changes (decisions that changed the set), mean_dropped,
decide_us (mean wall time of one `decide` call, for the < 1% of a token's latency target).

A controller may define `sim_settings(state) -> tuple[str, ...]`: `--set` overrides (e.g. a hybrid
residency) applied to every simulator run of its episode, called once at the start; then its
footprint is the simulator's DRAM record of each step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from adapt.controllers.base import AdaptState, Controller
from adapt.drop_quality import Perplexity
from adapt.timelines import TimelineContext
from devices.errors import FlashsimError
from devices.model_spec import ModelSpec
from devices.schema import DeviceProfile
from sim.blocks import BlockMemory, format_blocks, parse_blocks
from sim.components.memory import BudgetTimeline
from sim.config import RunConfig
from sim.engine import SetAlgebraCache, simulate
from traces.format import Trace

# The simulator's budget for timing runs: timing never depends on it for resident-weight residencies
# (dense), so a budget that always fits is used; memory is checked by the episode, not the simulator.
TIMING_BUDGET_SLACK = 2


@dataclass(frozen=True)
class Workload:
    """Sequences decoded together, their prompt length and the decode steps of an episode."""

    batch: int = 16
    prompt_tokens: int = 40
    decode_tokens: int = 128

    def __post_init__(self) -> None:
        for name, flag, lo in (("batch", "--batch", 1), ("prompt_tokens", "--prompt-tokens", 0),
                               ("decode_tokens", "--tokens", 1)):
            if getattr(self, name) < lo:
                raise FlashsimError(f"{flag} must be >= {lo}, got {getattr(self, name)}")

    def kv_tokens(self) -> np.ndarray:
        """int64 [decode_tokens]: KV entries over all sequences during each decode step."""
        return self.batch * (self.prompt_tokens + 1 + np.arange(self.decode_tokens, dtype=np.int64))

    def settings(self) -> list[str]:
        return [f"workload.batch={self.batch}", f"workload.prompt_tokens={self.prompt_tokens}",
                f"workload.tokens={self.decode_tokens}"]


class StepTimer:
    """Simulated seconds (and DRAM bytes) of every decode step for a dropped set: one simulator run of
    the whole workload per distinct (dropped set, settings), cached."""

    def __init__(self, trace: Trace, spec: ModelSpec | None, profile: DeviceProfile, base: RunConfig,
                 workload: Workload):
        self.trace, self.spec, self.profile, self.workload = trace, spec, profile, workload
        self.base = base.with_overrides(workload.settings())
        self._cache: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self._sac = SetAlgebraCache()
        self.runs = 0

    def steps(self, dropped: np.ndarray, settings: tuple[str, ...] = ()) -> tuple[np.ndarray, np.ndarray]:
        """(latency_s float64 [steps], resident_bytes int64 [steps]) of the decode steps."""
        key = (np.packbits(dropped).tobytes(), settings)
        hit = self._cache.get(key)
        if hit is None:
            cfg = self.base.with_overrides([*settings, f"prune.blocks={format_blocks(dropped)}"])
            res = simulate(self.trace, self.spec, self.profile, cfg, cache=self._sac)
            frame = res.records()
            dec = frame[frame["phase"] == "decode"]
            hit = (dec["latency_s"].to_numpy(np.float64), dec["resident_bytes"].to_numpy(np.int64))
            if len(hit[0]) != self.workload.decode_tokens:
                raise AssertionError("simulator returned a different number of decode steps")
            self._cache[key] = hit
            self.runs += 1
        return hit


@dataclass
class EpisodeSetup:
    """What all episodes of one evaluation share."""

    blocks: BlockMemory
    importance: np.ndarray
    quality: Perplexity
    timer: StepTimer
    workload: Workload
    decide_every: int = 8

    def __post_init__(self) -> None:
        if self.decide_every < 1:
            raise FlashsimError(f"--decide-every must be >= 1, got {self.decide_every}")
        n = len(self.blocks.names)
        if self.importance.shape != (n,):
            raise ValueError(f"importance must have shape ({n},)")
        self.kv_tokens = self.workload.kv_tokens()

    @property
    def n_blocks(self) -> int:
        return len(self.blocks.names)

    def full_need_bytes(self) -> int:
        return self.blocks.full_need_bytes(int(self.kv_tokens[-1]))

    def horizon_s(self) -> float:
        return float(self.timer.steps(np.zeros(self.n_blocks, bool))[0].sum())

    def context(self) -> TimelineContext:
        return TimelineContext(self.full_need_bytes(), self.horizon_s())


@dataclass
class EpisodeResult:
    controller: str
    timeline: str
    records: Any                      # pandas.DataFrame, one row per decode step (columns: RECORD_COLUMNS)
    summary: dict[str, Any] = field(default_factory=dict)
    batch: int = 1
    decide_s: list[float] = field(default_factory=list)


RECORD_COLUMNS = ("step", "t_s", "available_bytes", "footprint_bytes", "kv_tokens", "n_dropped", "dropped",
                  "decision", "action", "violation", "step_s", "log_ppl")


def _action(before: np.ndarray, after: np.ndarray, names: tuple[str, ...]) -> str:
    drop = [names[i] for i in np.flatnonzero(after & ~before)]
    back = [names[i] for i in np.flatnonzero(before & ~after)]
    parts = ([f"drop {','.join(drop)}"] if drop else []) + ([f"restore {','.join(back)}"] if back else [])
    return "; ".join(parts)


def run_episode(setup: EpisodeSetup, controller: Controller, timeline: BudgetTimeline,
                label: str = "") -> EpisodeResult:
    """Replay `timeline` with `controller` (see the module docstring)."""
    import pandas as pd

    blocks, wl = setup.blocks, setup.workload
    n = setup.n_blocks
    names = blocks.names
    controller.reset()
    dropped = np.zeros(n, bool)
    sim_settings: tuple[str, ...] | None = None
    t_s, prev_avail = 0.0, None
    rows: list[tuple] = []
    decide_s: list[float] = []
    for j in range(wl.decode_tokens):
        kv = int(setup.kv_tokens[j])
        avail = timeline.at(t_s, default=timeline.available_bytes[0])
        fp_now = _footprint(setup, dropped, kv, j, sim_settings)
        decide = (j == 0 or j % setup.decide_every == 0 or avail != prev_avail or fp_now > avail)
        action = ""
        if decide:
            state = AdaptState(step=j, batch=wl.batch, seq_len=wl.prompt_tokens + j + 1, kv_tokens=kv,
                               available_bytes=int(avail), importance=setup.importance, dropped=dropped.copy(),
                               blocks=blocks)
            if sim_settings is None:
                fn = getattr(controller, "sim_settings", None)
                sim_settings = tuple(fn(state)) if fn is not None else ()
            t0 = time.perf_counter()
            new = np.asarray(controller.decide(state))
            decide_s.append(time.perf_counter() - t0)
            if new.shape != (n,) or new.dtype != bool:
                raise ValueError(f"controller {controller.name!r} returned {new.dtype} {new.shape}, "
                                 f"expected bool ({n},)")
            action = _action(dropped, new, names)
            dropped = new.copy()
        fp = _footprint(setup, dropped, kv, j, sim_settings or ())
        step_s = float(setup.timer.steps(dropped, sim_settings or ())[0][j])
        rows.append((j, t_s, int(avail), fp, kv, int(dropped.sum()), format_blocks(dropped), decide, action,
                     fp > avail, step_s, setup.quality.log_ppl(dropped)))
        t_s += step_s
        prev_avail = avail
    frame = pd.DataFrame(rows, columns=list(RECORD_COLUMNS))
    return EpisodeResult(controller.name, label, frame, summarize(frame, wl.batch, decide_s), wl.batch, decide_s)


def requality(results: list[EpisodeResult], quality: Perplexity, n_layers: int) -> list[EpisodeResult]:
    """The same episodes with `log_ppl` from another quality model (e.g. measured on the real model):
    controllers never see the quality, so the trajectories do not change. Every distinct dropped set
    is measured once (in one `prefetch` call when the quality model has one)."""
    texts = sorted({t for r in results for t in r.records["dropped"].unique()})
    masks = {t: parse_blocks(t, n_layers) for t in texts}
    prefetch = getattr(quality, "prefetch", None)
    if prefetch is not None:
        prefetch(list(masks.values()))
    log_ppl = {t: quality.log_ppl(m) for t, m in masks.items()}
    out = []
    for r in results:
        frame = r.records.assign(log_ppl=r.records["dropped"].map(log_ppl).astype(float))
        out.append(EpisodeResult(r.controller, r.timeline, frame, summarize(frame, r.batch, r.decide_s),
                                 r.batch, r.decide_s))
    return out


def _footprint(setup: EpisodeSetup, dropped: np.ndarray, kv: int, j: int,
               sim_settings: tuple[str, ...] | None) -> int:
    if sim_settings:
        return int(setup.timer.steps(dropped, sim_settings)[1][j])
    return setup.blocks.footprint_bytes(dropped, kv)


def summarize(frame: Any, batch: int, decide_s: list[float]) -> dict[str, Any]:
    over = (frame["footprint_bytes"] - frame["available_bytes"]).clip(lower=0)
    log_ppl = frame["log_ppl"].to_numpy()
    mean_lp = float(np.mean(log_ppl))
    changes = int((frame["action"] != "").sum())
    return {
        "steps": int(len(frame)),
        "violations": int(frame["violation"].sum()),
        "max_over_bytes": int(over.max()),
        "ppl": float(np.exp(mean_lp)) if mean_lp < 700 else float("inf"),
        "worst_ppl": float(np.exp(log_ppl.max())) if log_ppl.max() < 700 else float("inf"),
        "tokens_per_s": float(batch * len(frame) / frame["step_s"].sum()),
        "duration_s": float(frame["step_s"].sum()),
        "decisions": int(frame["decision"].sum()),
        "changes": changes,
        "mean_dropped": float(frame["n_dropped"].mean()),
        "peak_footprint_bytes": int(frame["footprint_bytes"].max()),
        "decide_us": float(1e6 * np.mean(decide_s)) if decide_s else 0.0,
    }
