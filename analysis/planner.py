"""The what-if planner: which policy runs model M on device D within a DRAM budget, how fast, at
what quality, and what is the smallest DRAM that meets a tok/s target?

`plan(spec, profile, trace, ...)` replays one trace through every configuration of `PLAN_GRID` (the
presets of `sim.policies.presets` and a modest grid of their parameters) with `sim.engine.simulate`
(the analytic fast path where it applies, the DES for prefetchers; one `SetAlgebraCache` so the
trace's sets are computed once) at the DRAM budget, and returns a `Plan`:

  * per configuration: whether it is feasible and, if not, every reason (`does not fit` with the
    simulator's shortfall message, `too slow` below --target-tps, `quality too low` below
    --min-quality, agreement below --min-agreement, perplexity above --max-ppl-ratio, `quality unknown`), `too much energy` above
    --max-joules-per-token), tok/s, DRAM peak (bytes), the quality proxy (activation mass kept), the
    quality measured on the embedded model (next-token agreement and perplexity ratio, from
    analysis/quality_table.py: quantized and sparse configurations on one scale), the energy per token
    (J, and mJ by component; sim/energy.py), the breakdown (flash stall / compute / memory management ms
    per token) and its binding constraint;
  * the Pareto front over the configurations that ran: max tok/s, min DRAM, max measured agreement
    (max mass kept without a quality table), and min joules per token where the device profile has
    energy numbers;
  * `best`: the fastest feasible configuration (ties: less DRAM), or None;
  * the smallest DRAM that meets the target (and the quality floor): for each preset family, its
    feasible configuration with the smallest DRAM peak at the search ceiling (the device's
    available DRAM, or the budget if larger), bisection over budgets on a grid of
    `tolerance_bytes`; the answer is the smallest over families, B, which meets the target while
    B - tolerance does not (for that configuration; budgets that do not fit fail in milliseconds).
    Without a target, only the best configuration is bisected (the smallest DRAM it runs in):
    otherwise a page-cache configuration that thrashes in 32 MiB would be the trivial answer.

Each row carries three speeds: the expected one (the presets' realistic predictors and prefetch on
the achievable device numbers), the ideal-policy bound (the same with an oracle predictor and perfect
prefetch, `ideal_policy_tokens_per_s`) and, given the device at its datasheet peak, the device
peak-bound (`peak_bound_tokens_per_s`, the same decisions priced at the datasheet ceiling, run
beside the minimum-DRAM search). Evaluation, the typed failures, the spec-only
resident-weights check and the binding constraint (flash bandwidth, DRAM bandwidth, compute, memory
management, memory capacity) live in analysis/plan_eval.py.

Units: bytes, seconds internally; tok/s and ms per token as the simulator's summary reports them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from analysis.pareto import pareto_mask
from analysis.plan_eval import (  # noqa: F401  (re-exported: the planner's public names)
    CACHE_FULL_SHARE,
    CANNOT_RUN,
    COMPUTE,
    DOES_NOT_FIT,
    DRAM_BW,
    FLASH,
    MEM_CAP,
    MEM_MGMT,
    Evaluation,
    Planner,
    binding_constraint,
)
from analysis.quality_evidence import (
    QualityEvidence,
    check_max_ppl_ratio,
    evidence_notes,
    floor_rule,
    quality_evidence,
    quality_reasons,
    row_quality,
)
from analysis.quality_table import (
    QualityTable,
    config_bits,
    load_quality_table,
    published,
    quality_key,
    quality_ranking,
)
from devices.errors import FlashsimError
from devices.model_spec import ModelSpec
from devices.runtime import DEFAULT_RUNTIME
from devices.schema import DeviceProfile
from devices.units import format_bytes
from sim.engine import SetAlgebraCache
from sim.metric_names import TOKENS_PER_S
from traces.format import Trace

# (preset, overrides): the documented grid. Window k: LLM in a flash's Fig. 7 sweeps k of 1..10+;
# the presets' predictors are realistic (sim/policies/presets.py), their oracle versions are each
# row's ideal-policy bound; gamma/phi: SelectInfer's load/compute ratios around its 0.7/0.4 default;
# hybrid resident fractions; 8- and 4-bit quantization (also with the sparse policy).
PLAN_GRID: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("dense", ()),
    ("quantized", ("quantized.bits=8",)),
    ("quantized", ("quantized.bits=4",)),
    ("naive", ()),
    ("hybrid", ("hybrid.fraction=0.25",)),
    ("hybrid", ("hybrid.fraction=0.5",)),
    ("hybrid", ("hybrid.fraction=0.75",)),
    ("mmap", ()),
    *(("llm-in-a-flash", (f"window.k={k}",)) for k in (1, 5, 20)),
    ("llm-in-a-flash", ("window.k=5", "precision=quantized", "quantized.bits=4")),
    ("neuroprefetcher", ()),
    *(("selectinfer", (f"selective.load_ratio={g}", f"selective.compute_ratio={c}"))
      for g in (0.5, 0.7, 0.9) for c in (0.3, 0.5) if c <= g),
    # the preset's own gamma/phi: with "quantized quantized.bits=4" above, SelectInfer's comparison
    # against 4-bit quantization (its paper's baseline), both with measured quality
    ("selectinfer", ("selective.load_ratio=0.7", "selective.compute_ratio=0.4")),
)
SELECTINFER_VS_INT4 = ("selectinfer selective.load_ratio=0.7 selective.compute_ratio=0.4", "quantized quantized.bits=4")
DEFAULT_TOLERANCE_BYTES = 32 * 2**20  # bisection resolution: well under one FFN layer of a 1B+ model
SHIPPED = "shipped"              # plan(quality=...): the shipped measured-quality table


@dataclass(kw_only=True)
class Plan:
    """The planner's answer (built by keyword); `to_json()` is the `flashsim plan --json` object."""

    model: str
    device: str
    budget_bytes: int
    target_tps: float | None
    min_quality: float | None
    trace: dict[str, Any]
    rows: list[dict[str, Any]]
    best: dict[str, Any] | None
    closest: dict[str, Any] | None
    pareto: list[dict[str, Any]]
    min_dram: dict[str, Any]
    binding: str
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    runs: int = 0  # simulated runs, bisection included
    max_jpt: float | None = None  # the energy limit, joules per decode token
    min_agreement: float | None = None
    quality: dict[str, Any] | None = None       # the measured-quality table's provenance (None: proxy only)
    comparisons: list[dict[str, Any]] = field(default_factory=list)
    power_mode: str | None = None
    bound: str = "achievable"
    device_inputs: list[dict[str, Any]] = field(default_factory=list)
    peak_bound: dict[str, Any] | None = None   # {"best": tok/s, "configurations": {label: tok/s}} at the datasheet ceiling
    run_seconds: float = 0.0     # of `seconds`, the time spent in simulated runs
    trace_source: Any = None     # the replayed Trace (or the callable that makes it): not in the JSON
    stages: dict[str, float] = field(default_factory=dict)   # seconds per stage (spec check, trace, runs, ...)
    runtime: str = DEFAULT_RUNTIME   # the inference runtime every configuration was priced with (devices/runtimes/)

    @property
    def feasible(self) -> bool:
        return self.best is not None

    def to_json(self) -> dict[str, Any]:
        return {"feasible": self.feasible, "model": self.model, "device": self.device,
                "dram_budget_bytes": self.budget_bytes, "target_tokens_per_s": self.target_tps,
                "min_quality": self.min_quality, "max_joules_per_token": self.max_jpt, "trace": self.trace, "best": self.best,
                "closest": self.closest, "binding_constraint": self.binding, "pareto": self.pareto,
                "min_dram_bytes": self.min_dram.get("bytes"), "min_dram": self.min_dram,
                "configurations": self.rows, "notes": self.notes, "plan_seconds": round(self.seconds, 3), "simulated_runs": self.runs,
                "min_agreement": self.min_agreement, "quality": self.quality, "comparisons": self.comparisons,
                "power_mode": self.power_mode, "bound": self.bound, "device_inputs": self.device_inputs,
                "peak_bound": self.peak_bound, "simulated_run_seconds": round(self.run_seconds, 3),
                "stage_seconds": {k: round(v, 3) for k, v in self.stages.items()}, "runtime": self.runtime}


def finite_or_none(x: float) -> float | None:
    """x as a float, or None where it is infinite or NaN (JSON has no inf)."""
    return float(x) if math.isfinite(x) else None


def reasons(ev: Evaluation, target_tps: float | None, min_quality: float | None,
            max_jpt: float | None = None, *, min_agreement: float | None = None,
            table: QualityEvidence | None = None, max_ppl_ratio: float | None = None) -> list[str]:
    """Why a configuration is infeasible (empty: feasible). `max_jpt`: the energy limit, joules per
    decode token (a configuration on a device without energy numbers cannot be shown to meet it).
    `min_agreement` / `max_ppl_ratio`: floors on the quality the evidence `table` gives (a configuration
    it cannot rate fails them; analysis/quality_evidence.py)."""
    if not ev.ran:  # the simulator's budget refusals name the DRAM budget and the shortfall
        return [f"{ev.failure or CANNOT_RUN}: {ev.error}"]
    out = []
    tps = ev.metric("tokens_per_s")
    if target_tps is not None and tps < target_tps:
        out.append(f"too slow: {tps:.2f} tok/s < {target_tps:g}")
    mass = ev.metric("activation_mass_kept")
    if min_quality is not None and mass < min_quality:
        out.append(f"quality too low: activation mass kept {mass:.3f} < {min_quality:g}")
    if max_jpt is not None:
        jpt = ev.summary.get("joules_per_token") if ev.summary else None
        if jpt is None:
            out.append("energy unknown: the device profile has no energy section")
        elif jpt > max_jpt:
            out.append(f"too much energy: {jpt:.4g} J/token > {max_jpt:g}")
    return out + quality_reasons(ev, table, min_agreement, max_ppl_ratio)


def row(ev: Evaluation, target_tps: float | None, min_quality: float | None,
        max_jpt: float | None = None, *, min_agreement: float | None = None,
        table: QualityEvidence | None = None, max_ppl_ratio: float | None = None) -> dict[str, Any]:
    """A configuration's figures (JSON-ready, units in the keys)."""
    why = reasons(ev, target_tps, min_quality, max_jpt, min_agreement=min_agreement, table=table,
                  max_ppl_ratio=max_ppl_ratio)
    s = ev.summary or {}
    out: dict[str, Any] = {
        "label": ev.label, "preset": ev.preset, "overrides": list(ev.overrides),
        "dram_budget_bytes": ev.budget_bytes, "feasible": not why, "reasons": why, "fits": ev.ran,
        "binding_constraint": binding_constraint(ev.summary, ev.budget_bytes),
    }
    for k in ("tokens_per_s", "ms_per_token", "dram_peak_bytes", "activation_mass_kept", "recall",
              "stall_ms_per_token", "compute_ms_per_token", "memory_mgmt_ms_per_token", "io_ms_per_token",
              "flash_bytes_per_token", "joules_per_token", "compute_flop_ms_per_token", "compute_dram_ms_per_token"):
        out[k] = finite_or_none(float(s[k])) if s.get(k) is not None else None
    out["energy_mj_per_token"] = s.get("energy_mj_per_token")
    if out["dram_peak_bytes"] is not None:
        out["dram_peak_bytes"] = int(out["dram_peak_bytes"])
    out["engine"] = s.get("engine")
    bits = config_bits(ev.preset, ev.overrides)
    out["weight_bits"] = bits
    out.update(row_quality(ev, table))
    if bits is not None:
        out["published_ppl_ratio"] = published(bits)
        if out["ppl_ratio"] is None:
            out["note"] = "the quality proxy does not see quantization error"
    return out


def _rank_key(r: dict[str, Any]) -> tuple:
    return (-(r["tokens_per_s"] or 0.0), r["dram_peak_bytes"] or 0)


def bisect_min_budget(ok: Callable[[int], bool], hi_bytes: int, tolerance_bytes: int,
                      known_bad_bytes: int = 0, likely_ok_bytes: int | None = None) -> int | None:
    """Smallest budget n * tolerance (n >= 1) with ok(budget), assuming ok is monotone in the budget;
    None when even the largest grid budget <= hi_bytes fails. The result B satisfies ok(B) and, for
    B > tolerance, not ok(B - tolerance) (both evaluated). `known_bad_bytes`: a budget already known
    to fail (the search starts above it). `likely_ok_bytes`: a budget likely to pass (the DRAM a run
    at hi_bytes used): the first probe instead of the midpoint when it lies in the lower half of
    the bracket (a probe that narrows at least as much as a halving when it passes); the answer is
    the same smallest grid budget whichever way the probes go."""
    n_hi = hi_bytes // tolerance_bytes
    if n_hi < 1 or not ok(n_hi * tolerance_bytes):
        return None
    n_lo = min(known_bad_bytes // tolerance_bytes, n_hi - 1)  # budget 0 holds nothing: infeasible
    if n_lo > 0 and ok(n_lo * tolerance_bytes):  # the known-bad budget rounded down must fail too
        n_lo = 0
    if likely_ok_bytes is not None:
        n_hint = -(-int(likely_ok_bytes) // tolerance_bytes)
        if n_lo < n_hint <= (n_lo + n_hi) // 2:
            if ok(n_hint * tolerance_bytes):
                n_hi = n_hint
            else:
                n_lo = n_hint
    while n_hi - n_lo > 1:
        mid = (n_lo + n_hi) // 2
        if ok(mid * tolerance_bytes):
            n_hi = mid
        else:
            n_lo = mid
    return n_hi * tolerance_bytes


def plan(trace: Trace | Callable[[], Trace], spec: ModelSpec, profile: DeviceProfile, *, budget_bytes: int | None = None,
         target_tps: float | None = None, min_quality: float | None = None, trace_info: dict | None = None,
         grid: Sequence[tuple[str, Sequence[str]]] = PLAN_GRID, tolerance_bytes: int = DEFAULT_TOLERANCE_BYTES,
         rescale: bool | None = False, seed: int = 0, progress: Callable[[], None] | None = None,
         max_jpt: float | None = None, min_agreement: float | None = None,
         quality: QualityTable | str | None = SHIPPED, max_ppl_ratio: float | None = None,
         cache: SetAlgebraCache | None = None, runtime: str | None = None, workers: int | None = None,
         peak_profile: DeviceProfile | None = None) -> Plan:
    """Evaluate `grid` at the budget, pick the best, find the Pareto front and the minimum DRAM.
    `trace` may be a callable returning it (called only if some configuration passes the spec check).
    `max_jpt`: the energy limit (joules per decode token), a constraint like the tok/s target.
    `quality`: the measured-quality table (default: the shipped one; None: the mass-kept proxy only, no
    quality floor); it and the published ratios rate each configuration for `spec` (quality_evidence.py);
    `min_agreement` / `max_ppl_ratio`: floors on that rating (`plan_model` and the CLI default to
    DEFAULT_MAX_PPL_RATIO; here None, no floor). `workers`: threads for independent runs
    (analysis/plan_eval.py; default: default_workers()). `peak_profile`: the device at its datasheet
    peak (devices.achievable.at_bound): every configuration that ran is run again on it for the
    peak bound, on a thread of its own beside the minimum-DRAM search (it prices the same decisions,
    sim/decisions.py)."""
    import time

    t0 = time.perf_counter()
    validate_targets(target_tps, min_quality, min_agreement, max_jpt)
    check_max_ppl_ratio(max_ppl_ratio)
    table = None if quality is None else quality_evidence(spec, load_quality_table() if quality == SHIPPED else quality)
    if min_agreement is not None and table is None:
        raise FlashsimError("--min-agreement needs the measured-quality table (analysis/data/quant_quality.json)")
    if table is None:
        max_ppl_ratio = None   # the proxy alone rates no perplexity
    floors = {"max_jpt": max_jpt, "min_agreement": min_agreement, "table": table, "max_ppl_ratio": max_ppl_ratio}
    avail = profile.available_bytes
    budget = avail if budget_bytes is None else int(budget_bytes)
    if budget <= 0:
        raise FlashsimError(f"--dram-free {budget}: must be > 0 bytes")
    if budget > profile.memory.capacity_bytes:
        raise FlashsimError(f"--dram-free {format_bytes(budget)} exceeds the DRAM of {profile.name} "
                            f"({format_bytes(profile.memory.capacity_bytes)})")
    pl = Planner(trace, spec, profile, rescale=rescale, seed=seed, progress=progress, cache=cache, runtime=runtime,
                 workers=workers)
    requests = [(p, tuple(o), budget) for p, o in grid]
    pl.run_all([(*r, ideal) for ideal in (False, True) for r in requests])   # both on one set of threads
    evals = pl.evaluate_many(requests)
    rows = [row(e, target_tps, min_quality, **floors) for e in evals]
    ideal = pl.evaluate_many(requests, ideal=True)
    for r, e in zip(rows, ideal):   # the same configuration with a perfect predictor and prefetch
        r["ideal_policy_tokens_per_s"] = finite_or_none(e.metric(TOKENS_PER_S))
    feasible = sorted((r for r in rows if r["feasible"]), key=_rank_key)
    best = feasible[0] if feasible else None
    # closest: the fastest one that ran at the quality floor (what to relax to make it work)
    ran = sorted((r for r in rows if r["fits"]), key=_rank_key)
    closest = None
    if best is None and ran:
        good_q = [r for r in ran if not any(x.startswith("quality") for x in r["reasons"])]
        closest = (good_q or ran)[0]
    pareto = _pareto(rows)
    ceiling = max(budget, avail)
    peak_pl = peak = None
    with ThreadPoolExecutor(1, thread_name_prefix="flashsim-peak") if peak_profile is not None else nullcontext() as bg:
        if bg is not None:
            peak_pl = Planner(pl.trace if pl.trace_loaded else trace, spec, peak_profile, rescale=rescale, seed=seed,
                              progress=progress, cache=pl.cache, runtime=runtime, workers=workers, clock=pl.clock)
            fits = [r for r in rows if r["fits"]]
            peak = bg.submit(peak_pl.evaluate_many, [(r["preset"], r["overrides"], r["dram_budget_bytes"]) for r in fits])
        if target_tps is None:  # "runs at all" is met by a thrashing mmap at any size: ask about the best only
            only = [(best["preset"], tuple(best["overrides"]))] if best else []
            min_dram = _min_dram(pl, only, None, budget, ceiling, None, min_quality, tolerance_bytes, **floors)
            min_dram["scope"] = "the best configuration (no --target-tps: the smallest DRAM it runs in)"
        else:
            min_dram = _min_dram(pl, grid, evals if ceiling == budget else None, budget, ceiling, target_tps,
                                 min_quality, tolerance_bytes, **floors)
            min_dram["scope"] = "every preset family (its most DRAM-frugal configuration meeting the target)"
        peak_bound = None
        if peak is not None:
            at_peak = {r["label"]: finite_or_none(e.metric(TOKENS_PER_S)) for r, e in zip(fits, peak.result())}
            for r in rows:
                r["peak_bound_tokens_per_s"] = at_peak.get(r["label"])
            peak_bound = {"configurations": at_peak, "best": at_peak.get(best["label"]) if best else None}
    ref = best or closest
    binding = ref["binding_constraint"] if ref else MEM_CAP
    notes = []
    if not any(r["fits"] for r in rows):
        notes.append(f"no configuration fits {format_bytes(budget)}: the smallest need is set by the "
                     "resident weights, KV cache and the computed neurons of one layer")
    if profile.energy is None:
        notes.append(f"{profile.name} has no energy numbers: energy per token is unknown and not a Pareto axis")
    qinfo = None
    if table is None:
        notes.append("quality is the activation-mass proxy (share of sum |a| computed), not perplexity; it "
                     "does not see quantization error")
    else:
        qinfo = {**table.info(), "floor": floor_rule(max_ppl_ratio, table), "axis": quality_key(rows),
                 "ranking": quality_ranking(rows)}
        notes += evidence_notes(rows)
    comparisons = []
    by_label = {r["label"]: r for r in rows}
    if all(lbl in by_label for lbl in SELECTINFER_VS_INT4):
        comparisons.append({"name": "SelectInfer vs 4-bit quantization (SelectInfer's own baseline)",
                            "rows": [by_label[lbl] for lbl in SELECTINFER_VS_INT4]})
    return Plan(runtime=runtime or DEFAULT_RUNTIME, model=spec.name, device=profile.name, budget_bytes=budget, target_tps=target_tps,
                min_quality=min_quality, trace=trace_info or {"path": str(pl.trace.path) if pl.trace_loaded else None},
                rows=rows, best=best, closest=closest, pareto=pareto, min_dram=min_dram, binding=binding,
                notes=notes, seconds=time.perf_counter() - t0, runs=pl.n_runs + (peak_pl.n_runs if peak_pl else 0),
                max_jpt=max_jpt, min_agreement=min_agreement, quality=qinfo, comparisons=comparisons,
                run_seconds=pl.clock.seconds, peak_bound=peak_bound,
                trace_source=pl.trace if pl.trace_loaded else trace)


def validate_targets(target_tps: float | None, min_quality: float | None,
                     min_agreement: float | None = None, max_jpt: float | None = None) -> None:
    if max_jpt is not None and not (math.isfinite(max_jpt) and max_jpt > 0):
        raise FlashsimError(f"--max-joules-per-token {max_jpt}: must be a number > 0 (joules per decode token)")
    if target_tps is not None and not (math.isfinite(target_tps) and target_tps > 0):
        raise FlashsimError(f"--target-tps {target_tps}: must be a number > 0 (tokens per second)")
    if min_quality is not None and not (0 <= min_quality <= 1):
        raise FlashsimError(f"--min-quality {min_quality}: must be in [0, 1] (share of activation mass kept)")
    if min_agreement is not None and not (0 <= min_agreement <= 1):
        raise FlashsimError(f"--min-agreement {min_agreement}: must be in [0, 1] (measured next-token agreement)")


def _pareto(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    qk = quality_key(rows)
    ran = [r for r in rows if r["fits"] and r[qk] is not None]   # on the ppl axis: the rows with evidence
    if not ran:
        return []
    df: dict[str, list] = {"tokens_per_s": [r["tokens_per_s"] if r["tokens_per_s"] is not None else math.inf
                                            for r in ran],
                           "dram_peak_bytes": [r["dram_peak_bytes"] for r in ran],
                           qk: [r[qk] for r in ran]}
    minimize: tuple[str, ...] = ("dram_peak_bytes",)
    if all(r.get("joules_per_token") is not None for r in ran):  # energy is an axis where every row has it
        df["joules_per_token"] = [r["joules_per_token"] for r in ran]
        minimize += ("joules_per_token",)
    best_high = qk != "ppl_ratio"
    mask = pareto_mask(df, maximize=("tokens_per_s", qk) if best_high else ("tokens_per_s",),
                       minimize=minimize if best_high else (*minimize, qk))
    front = [r for r, m in zip(ran, mask) if m]
    return sorted(front, key=_rank_key)


def family(e: Evaluation) -> str:
    """A configuration family: its preset, and quantized apart from native precision."""
    return e.preset + (" (quantized)" if "precision=quantized" in e.overrides else "")


def _min_dram(pl: Planner, grid: Sequence[tuple[str, Sequence[str]]], at_ceiling: list[Evaluation] | None,
              budget: int, ceiling: int, target_tps: float | None, min_quality: float | None, tol: int,
              **floors: Any) -> dict[str, Any]:
    """Bisection for the frugal feasible configuration of every preset family at the ceiling.
    `floors`: max_jpt, min_agreement and table, as `reasons` takes them."""
    evals = at_ceiling if at_ceiling is not None else pl.evaluate_many([(p, o, ceiling) for p, o in grid])
    ok_rows = [(e, row(e, target_tps, min_quality, **floors)) for e in evals]
    ok_rows = [(e, r) for e, r in ok_rows if r["feasible"]]
    out: dict[str, Any] = {"bytes": None, "configuration": None, "tolerance_bytes": tol,
                           "search_ceiling_bytes": ceiling, "families": []}
    if not ok_rows:
        out["reason"] = (f"no configuration meets the constraints even with {format_bytes(ceiling)} "
                         f"(the device's available DRAM)")
        return out
    families: dict[str, tuple[Evaluation, dict]] = {}
    for e, r in sorted(ok_rows, key=lambda er: _rank_key(er[1])):  # the fastest first among equals
        cur = families.get(family(e))
        if cur is None or r["dram_peak_bytes"] < cur[1]["dram_peak_bytes"]:
            families[family(e)] = (e, r)
    for e, _ in families.values():

        def ok(b: int, e: Evaluation = e) -> bool:
            return not reasons(pl.evaluate(e.preset, e.overrides, b), target_tps, min_quality, **floors)

        used = int(e.summary["dram_peak_bytes"]) if e.summary is not None else None   # e ran at the ceiling
        b = bisect_min_budget(ok, ceiling, tol, known_bad_bytes=budget if not ok(budget) else 0, likely_ok_bytes=used)
        fam = {"label": e.label, "min_dram_bytes": b}
        if b is not None:
            fam["at_min"] = row(pl.evaluate(e.preset, e.overrides, b), target_tps, min_quality, **floors)
        out["families"].append(fam)
    found = [f for f in out["families"] if f["min_dram_bytes"] is not None]
    if found:
        m = min(found, key=lambda f: f["min_dram_bytes"])
        out["bytes"], out["configuration"] = m["min_dram_bytes"], m["label"]
    return out
