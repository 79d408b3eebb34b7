"""Engine: build a simulation from (trace, model, device, config) and run it.

    result = simulate(trace, spec, profile, config)              # fast path when it applies
    result = simulate(trace, spec, profile, config, fast=False)  # always the discrete-event run
    sim = build(trace, spec, profile, config); result = sim.run(timeline=True)

`build` resolves the workload against the trace, builds and binds the policies, sizes the fixed
memory and checks the budget (FlashsimError with the shortfall). `run` plans (set algebra,
vectorised) and times the plan with SimPy (`sim.components.pipeline`) or analytically
(`sim.fastpath`; `fast="auto"` uses it whenever the configuration has no timing feedback).

Sweeps call `simulate` in a loop: the resolved workload and the per-layer needed sets of a trace,
the quality proxy per computed-set configuration and whole runs' decisions are cached
(sim/set_cache.py `SetAlgebraCache`), so changing the device or the budget does not recompute them.

Block pruning (`config.prune.blocks`, sim/blocks.py syntax) is resolved here against the model's
layers: the planner skips dropped FFN layers and dropped attention; `_memory_model` removes the
dropped blocks' resident weights, their KV cache and their neuron-cache share (which goes to the kept
FFN layers). Results carry the canonical dropped set (`summary()["prune"]`, the `dropped_blocks`
column of the records).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
import simpy

from devices.achievable import resolved
from devices.errors import BudgetError, FlashsimError
from devices.model_spec import ModelSpec
from devices.runtime import load_runtime
from devices.schema import DeviceProfile
from devices.units import format_bytes
from sim.blocks import BlockMemory, format_blocks, parse_blocks
from sim.components.compute import MIN_BANDWIDTH_SHARE, ComputeModel
from sim.components.flash import FlashDevice
from sim.components.memory import MemoryModel
from sim.components.pipeline import Decoder
from sim.config import RunConfig
from sim.energy import energy_summary, step_traffic
from sim.fastpath import decline_reason, run_fast
from sim.policies.base import PolicyContext, require_hooks
from sim.policies.cache_shares import CacheShares, compute_shares
from sim.policies.stack import PolicyStack
from sim.records import MemorySample, Recorder
from sim.results import RunResult
from sim.rng import RngStreams
from sim.set_cache import DEFAULT_CACHE, SetAlgebraCache
from sim.step_plans import StepPlanner
from sim.workload import Steps, TraceView
from traces.format import Trace, check_run_memory


@dataclass
class Simulation:
    """A built run: call `run()`."""

    trace: Trace
    spec: ModelSpec
    profile: DeviceProfile
    config: RunConfig
    view: TraceView
    stack: PolicyStack
    memory: MemoryModel
    planner: StepPlanner
    budget_bytes: int
    ctx: PolicyContext
    notes: list[str] = field(default_factory=list)
    dropped: np.ndarray | None = None
    _used: bool = False

    @property
    def steps(self) -> Steps:
        return self.view.steps

    def fast_path_reason(self) -> str | None:
        names = {s: p.name for s, p in self.stack.policies.items()}
        return decline_reason(self.stack.timing_feedback, names, self.config.budget_timeline is not None)

    def _fresh(self) -> None:
        """Runs start from empty policy state: re-bind and re-plan when this Simulation ran before."""
        if self._used:
            self.ctx.notes.clear()
            self.ctx.rng = RngStreams(self.config.sim.seed)
            self.stack.bind(self.ctx)
            p = self.planner
            self.planner = StepPlanner(self.stack, self.view, self.spec, self.profile, self.memory, p.compute,
                                   p.in_flight, p.stream_non_ffn, quality_memo=p.quality_memo,
                                   dropped=p.dropped, memo=p.memo)
            self.notes = self.ctx.notes
        self._used = True

    def run(self, fast: bool | Literal["auto"] = "auto", timeline: bool = False) -> RunResult:
        self._fresh()
        reason = self.fast_path_reason()
        if fast is True and reason:
            raise FlashsimError(f"the analytic fast path does not apply: {reason}; run the discrete-event "
                                "simulation instead (fast=False / omit --fast)")
        use_fast = (fast is True) or (fast == "auto" and reason is None and not timeline)
        rec = Recorder(timeline=timeline)
        flash = FlashDevice(log=timeline, dram_bytes_per_s=self.profile.memory.bandwidth_bytes_per_s
                            if self._unified() else None, min_share=MIN_BANDWIDTH_SHARE)
        tl = self.config.budget_timeline
        if tl is None:
            plan = self._plan_all()
            if use_fast:
                run_fast(plan, rec)
            else:
                env = simpy.Environment()
                dec = Decoder(env, plan, flash, self.stack.prefetch.issue_point(), self._unified(), rec)
                env.process(dec.run())
                env.run()
        else:
            plan = self._run_timeline(rec, flash)
        cfg = self.resolved_config(engine="fast" if use_fast else "des")
        prune = self.prune_summary()
        tokens = rec.tokens
        if prune["blocks"]:
            tokens = [replace(r, dropped_blocks=prune["blocks"]) for r in tokens]
        energy = energy_summary(tokens, step_traffic(self.planner, plan), self.profile.energy, self.steps.batch)
        return RunResult(tokens=tokens, config=cfg, engine="fast" if use_fast else "des",
                         batch=self.steps.batch, mass=(plan.mass_num.copy(), plan.mass_den.copy()),
                         recall=(plan.rec_num.copy(), plan.rec_den.copy()), notes=list(self.notes),
                         memory=rec.memory, intervals=rec.intervals, flash_log=flash.log,
                         device=self.profile.name, prune=prune, energy=energy)

    def _plan_all(self):  # type: ignore[no-untyped-def]
        """The plan at the static budget; the notes the policies write while planning are kept with a
        decision memo and repeated when the memo is replayed."""
        memo = self.planner.memo
        if memo is not None and memo.complete:
            plan = self.planner.plan_all(self.budget_bytes)
            self.notes.extend(n for n in memo.notes if n not in self.notes)
            return plan
        n0 = len(self.notes)
        try:
            plan = self.planner.plan_all(self.budget_bytes)
        except BaseException:
            if memo is not None:
                memo.failed, memo.outcomes = True, {}
            raise
        if memo is not None:
            memo.notes = self.notes[n0:]
        return plan

    def prune_summary(self) -> dict[str, Any]:
        """The dropped set (canonical text) and what it saves; see RunResult.summary()["prune"]."""
        return prune_summary(self.spec, self.dropped)

    def _unified(self) -> bool:
        return self.profile.memory.unified and self.config.sim.contention

    def _run_timeline(self, rec: Recorder, flash: FlashDevice):  # type: ignore[no-untyped-def]
        tl = self.config.budget_timeline
        assert tl is not None
        env = simpy.Environment()
        start_budget = tl.at(0.0, self.budget_bytes)
        # "now": in force; "step_max": the largest in force during the current step, against which the
        # step's upper-bound accounting is checked (a drop mid-step is checked exactly when it happens)
        budget = {"now": start_budget, "step_max": start_budget}
        planner, memory, stack = self.planner, self.memory, self.stack
        current = {"step": 0}

        def check_and_shrink(t_s: float) -> int:
            b = budget["now"]
            s = current["step"]
            need = memory.fixed_bytes + int(memory.kv_bytes[s])
            if need > b:
                raise BudgetError(
                    f"budget timeline: at t={t_s:.6f} s (step {s}) only {format_bytes(b)} is available but "
                    f"{format_bytes(need)} must stay resident (weights {format_bytes(memory.fixed_bytes)} + KV "
                    f"cache {format_bytes(int(memory.kv_bytes[s]))}), {need - b:,} bytes short; this policy "
                    "cannot shrink further")
            # fit the current step and the next (its KV cache is one token larger)
            if stack.residency.page_granular:
                nxt = min(s + 2, len(memory.kv_bytes))
                stack.residency.shrink_bytes(int(memory.cache_bytes(b, s, nxt).min()))
                held = stack.residency.dynamic_bytes()
            else:
                if memory.shares is None:
                    stack.residency.on_budget_change(int(memory.cap_neurons(b, s, s + 1).min()))
                else:   # per-layer shares: an int64 [L] of caps (CachedResidency takes either)
                    stack.residency.on_budget_change(memory.layer_caps(b, s, s + 1, self.spec.n_layers).min(axis=0))
                held = stack.residency.dynamic_bytes(memory.neuron_bytes)
            resident = need + held
            if resident > b:
                raise BudgetError(f"budget timeline: at t={t_s:.6f} s the caches could not shrink into "
                                    f"{format_bytes(b)} ({resident - b:,} bytes over)")
            return resident

        def budget_process():  # type: ignore[no-untyped-def]
            for t, b in zip(tl.t_s, tl.available_bytes):
                if t > env.now:
                    yield env.timeout(t - env.now)
                budget["now"] = int(b)
                budget["step_max"] = max(budget["step_max"], int(b))
                resident = check_and_shrink(env.now)
                rec.memory.append(MemorySample(env.now, resident, int(b)))
                rec.budget_changes.append((env.now, int(b)))

        def plan_cell(s: int, layer: int) -> None:
            if layer == 0:
                current["step"] = s
                budget["step_max"] = budget["now"]
            planner.plan_cell(s, layer, budget["now"])

        def finish_step(s: int) -> None:
            planner.finish_steps(s, s + 1, budget["step_max"])

        check_and_shrink(0.0)
        env.process(budget_process())
        dec = Decoder(env, planner.arr, flash, stack.prefetch.issue_point(), self._unified(), rec,
                      plan_cell=plan_cell, finish_step=finish_step)
        env.process(dec.run())
        env.run()
        rec.memory.sort(key=lambda m: m.t_s)
        return planner.arr

    def resolved_config(self, engine: str = "") -> dict[str, Any]:
        cfg = self.config.to_dict()
        cfg.update({
            "policies": {s: p.describe() for s, p in self.stack.policies.items()},
            "model": self.spec.name, "model_dtype": self.spec.dtype, "device": self.profile.name,
            "power_mode": self.profile.power_mode, "bound": self.profile.bound,
            "trace": str(self.trace.path), "trace_model": self.trace.spec.name,
            "rescaled": self.view.rescaled, "dram_budget_bytes": self.budget_bytes,
            "fixed_bytes": self.memory.fixed_bytes, "fixed_parts": dict(self.memory.parts),
            "in_flight": self.planner.in_flight, "steps": self.steps.n, "decode_steps": self.steps.n_decode,
            "prompt_tokens": list(self.steps.prompt_lengths), "engine": engine,
            "fast_path": self.fast_path_reason() or "applies",
        })
        if self.memory.shares is not None:
            cfg["cache_shares"] = self.memory.shares.describe()
        if self.dropped is not None and self.dropped.any():
            cfg["prune"] = {**cfg["prune"], "blocks_resolved": format_blocks(self.dropped)}
        return cfg


def build(trace: Trace, spec: ModelSpec | None, profile: DeviceProfile, config: RunConfig,
          cache: SetAlgebraCache | None = None) -> Simulation:
    """Resolve and validate everything a run needs (FlashsimError for bad input). A raw profile runs
    on its achievable numbers (devices/achievable.py); pass `at_bound(profile, "peak")` for the ceiling."""
    cache = cache or DEFAULT_CACHE
    profile = resolved(profile)
    base_spec = spec if spec is not None else trace.spec
    choices = config.slots()
    policies = {slot: c.instantiate() for slot, c in choices.items()}
    stack = PolicyStack(policies["residency"], policies["predictor"], policies["layout"], policies["prefetch"],
                        policies["precision"])
    eff_spec = stack.precision.transform(base_spec)
    dropped = parse_blocks(config.prune.blocks, eff_spec.n_layers, where="prune.blocks")
    if dropped.any() and stack.residency.page_granular:
        raise FlashsimError(f"prune.blocks: residency {stack.residency.name!r} pages the whole model file and "
                            "cannot skip dropped blocks; use another residency (e.g. --set residency=naive)")
    _require_engine_hooks(stack, config)
    if stack.residency.page_granular and not stack.predictor.computes_every_neuron():
        raise FlashsimError(f"residency {stack.residency.name!r} pages the model file and computes densely; "
                            f"it cannot use predictor {stack.predictor.name!r} (use --set predictor=none)")
    check_run_memory(trace.n_tokens, eff_spec.n_layers, eff_spec.d_ff, f"simulating {eff_spec.name}")
    view = cache.view(trace, config, eff_spec)
    budget = config.memory.dram_budget_bytes
    if budget is None:
        budget = profile.available_bytes
    elif budget > profile.memory.capacity_bytes:
        raise FlashsimError(f"--dram-budget {format_bytes(budget)} exceeds the DRAM of {profile.name} "
                            f"({format_bytes(profile.memory.capacity_bytes)})")
    notes: list[str] = []
    ctx = PolicyContext(spec=eff_spec, profile=profile, budget_bytes=budget, rng=RngStreams(config.sim.seed),
                        view=view, notes=notes)
    stack.bind(ctx)
    if view.rescaled:
        notes.append(f"rescaled: trace {trace.spec.name} ({trace.n_layers} x {trace.n_neurons}) tiled onto "
                     f"{eff_spec.name} ({eff_spec.n_layers} x {eff_spec.d_ff})")
    memory = _memory_model(stack, eff_spec, view.steps, config, dropped)
    memory.check_fits(budget if config.budget_timeline is None else config.budget_timeline.at(0.0, budget))
    memory.shares = _cache_shares(stack, view, memory, budget, dropped, config, notes)
    in_flight = config.flash.in_flight or profile.flash.max_in_flight
    memo = cache.quality_memo(view, stack, config) if config.budget_timeline is None else None
    compute = ComputeModel(eff_spec, profile, stack.layout.dram_bytes_per_neuron(eff_spec), config.compute.framework,
                           config.compute.decoder, load_runtime(config.compute.runtime))
    decisions = cache.decision_memo(view, stack, config, eff_spec, profile, budget)
    planner = StepPlanner(stack, view, eff_spec, profile, memory, compute, in_flight,
                          config.memory.stream_non_ffn, quality_memo=memo, dropped=dropped, memo=decisions)
    if dropped.any():
        notes.append(f"pruned: {format_blocks(dropped)} dropped ({int(dropped[0::2].sum())} mha, "
                     f"{int(dropped[1::2].sum())} ffn); the trace's activations of the dense model are replayed "
                     "for the kept layers")
    return Simulation(trace, eff_spec, profile, config, view, stack, memory, planner, budget, ctx, notes,
                      dropped=dropped)


def _require_engine_hooks(stack: PolicyStack, config: RunConfig) -> None:
    """Refuse, before planning, a policy that lacks a hook this run will ask (sim/policies/base.py)."""
    what = "the simulator"
    require_hooks(stack.layout, what, "dram_bytes_per_neuron")
    if stack.residency.page_granular:
        require_hooks(stack.residency, f"{what} (a page-granular residency)", "advance_pages", "miss_cost",
                      *(("shrink_bytes",) if config.budget_timeline is not None else ()))
    if stack.residency.manages_cache and config.memory.cache_split != "equal":
        require_hooks(stack.residency, f"{what} (memory.cache_split={config.memory.cache_split})", "window_k")


def _cache_shares(stack: PolicyStack, view: TraceView, memory: MemoryModel, budget: int, dropped: np.ndarray,
                  config: RunConfig, notes: list[str]) -> CacheShares | None:
    """The per-layer split of the neuron cache (`memory.cache_split`; None: equal),
    computed from the replayed trace's active sets at the run's static budget (sim/policies/cache_shares.py)."""
    mode = config.memory.cache_split
    if mode == "equal":
        return None
    k = stack.residency.window_k() if stack.residency.manages_cache else 0
    if k == 0:
        notes.append(f"memory.cache_split={mode}: residency {stack.residency.name!r} keeps no per-layer neuron cache "
                     "across steps, so the split changes nothing")
        return None
    steps = view.steps.n
    idx = np.minimum(np.arange(steps + 1), len(memory.kv_bytes) - 1)
    step_rows = np.maximum(budget - memory.fixed_bytes - memory.kv_bytes[idx], 0) // memory.neuron_bytes
    return compute_shares(mode, lambda layer: view.needed(layer, 0, steps), ~dropped[1::2], view.n_neurons, k,
                          memory.free_rows(budget), step_rows)


def _memory_model(stack: PolicyStack, spec: ModelSpec, steps: Steps, config: RunConfig,
                  dropped: np.ndarray | None = None) -> MemoryModel:
    """What stays resident, the KV cache per step, and the layers sharing the neuron caches.

    With blocks dropped (bool [2L], sim/blocks.py): a dropped MHA block's attention weights and input
    norm, and a dropped FFN block's norm and biases, leave the resident weights; a dropped FFN layer
    has no static neurons, no predictor and no cache share (the share is split over the kept FFN
    layers only); the KV cache counts only kept MHA layers."""
    L = spec.n_layers
    dropped = np.zeros(2 * L, bool) if dropped is None else dropped
    bm = BlockMemory.from_spec(spec)
    mha_gone, ffn_gone = dropped[0::2], dropped[1::2]
    ffn_kept = ~ffn_gone
    # resident (non-streamed) bytes of the dropped blocks: an MHA block whole, an FFN block's norm + biases
    mha_saved = int(bm.weight_bytes[0::2][mha_gone].sum())
    ffn_small_saved = int((bm.weight_bytes[1::2][ffn_gone] - spec.ffn_bytes_per_layer).sum())
    parts: dict[str, int] = {}
    if stack.residency.page_granular:
        pass  # every weight lives in the page cache, accounted as cache (pruning is rejected in build)
    elif config.memory.stream_non_ffn:
        attn_norm_saved = mha_saved - int(mha_gone.sum()) * spec.attn_bytes_per_layer
        parts["norm_weights"] = L * spec.norm_bytes_per_layer + spec.final_norm_bytes - attn_norm_saved - ffn_small_saved
        head = spec.lm_head_bytes if not spec.tied_embeddings else spec.embedding_bytes
        parts["stream_buffer"] = max(spec.attn_bytes_per_layer if (~mha_gone).any() else 0, head)
    else:
        parts["non_ffn_weights"] = spec.non_ffn_bytes - mha_saved - ffn_small_saved
    static = sum(int(np.bitwise_count(stack.static_mask(layer)).sum()) for layer in range(L) if ffn_kept[layer])
    neuron_bytes = stack.layout.dram_bytes_per_neuron(spec)
    parts["static_ffn_neurons"] = static * neuron_bytes
    parts["predictor_weights"] = int(ffn_kept.sum()) * stack.predictor.weight_bytes_per_layer()
    kv = steps.kv_tokens * int(bm.kv_bytes_per_token[~dropped].sum())
    return MemoryModel(parts, kv, max(int(ffn_kept.sum()), 1), neuron_bytes)


def prune_summary(spec: ModelSpec, dropped: np.ndarray | None) -> dict[str, Any]:
    """{"blocks", "dropped_mha", "dropped_ffn", "weight_bytes_saved", "kv_bytes_per_token_saved",
    "quality_proxy"}: the canonical dropped set and the bytes it removes (all weights counted, as
    RAP does; under flash streaming a dropped FFN's bytes are read, not resident)."""
    L = spec.n_layers
    d = np.zeros(2 * L, bool) if dropped is None else dropped
    bm = BlockMemory.from_spec(spec)
    return {
        "blocks": format_blocks(d),
        "dropped_mha": int(d[0::2].sum()),
        "dropped_ffn": int(d[1::2].sum()),
        "weight_bytes_saved": int(bm.weight_bytes[d].sum()),
        "kv_bytes_per_token_saved": int(bm.kv_bytes_per_token[d].sum()),
        "quality_proxy": ("activation_mass_kept and recall cover FFN neurons only: a dropped ffn block's "
                          "neurons all count as not computed; a dropped mha block does not change them"),
    }


def simulate(trace: Trace, spec: ModelSpec | None, profile: DeviceProfile, config: RunConfig,
             fast: bool | Literal["auto"] = "auto", timeline: bool = False,
             cache: SetAlgebraCache | None = None) -> RunResult:
    """Build and run one simulation (see the module docstring)."""
    return build(trace, spec, profile, config, cache).run(fast=fast, timeline=timeline)
