"""From names to a plan: `plan_model` loads the model and the device (at the chosen bound), prepares
the trace a plan replays (`planning_trace`: the given trace, tiled onto the model's shape when the
shapes differ, or a synthetic trace of the model's shape) and runs the what-if planner
(analysis/planner.py) over the grid, then every feasible configuration again at the datasheet
ceiling for the peak bound. `native_grid` is the grid without quantized weights (--native-only).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from analysis.planner import (
    DEFAULT_TOLERANCE_BYTES,
    PLAN_GRID,
    SHIPPED,
    Plan,
    Planner,
    finite_or_none,
    plan,
    validate_targets,
)
from analysis.quality_evidence import DEFAULT_MAX_PPL_RATIO, check_max_ppl_ratio
from analysis.quality_table import QualityTable
from devices.errors import FlashsimError
from devices.model_spec import ModelSpec
from devices.units import format_bytes
from sim.metric_names import TOKENS_PER_S
from traces.format import Trace

# ReLU FFNs (OPT) are far sparser than SwiGLU ones: LLM in a flash (Sec. 3.1) reports ~97%
# of OPT-6.7B's FFN neurons inactive per token; the reuse between consecutive tokens (0.7 of a token's
# active set active in the previous token) and the hot-neuron skew (25% of neurons give 80% of the
# activity) are the assumptions docs/replay.md uses for its OPT-6.7B reproduction.
RELU_ASSUMPTION = {"active_fraction": 0.03, "overlap": 0.7, "hot_skew": 0.25}
DEFAULT_PLAN_TOKENS = 128


def planning_trace(spec: ModelSpec, out_dir: str, *, trace_path: str | None = None,
                   tokens: int = DEFAULT_PLAN_TOKENS, seed: int = 0) -> tuple[Trace, dict[str, Any], bool]:
    """(trace, what it is, rescale?): the given trace (rescaled onto the model's shape when the shapes
    differ), or a synthetic trace of the model's shape written under out_dir."""
    from traces.data import shipped_trace_path
    from traces.format import open_trace
    from traces.synthetic import synthesize

    if trace_path is not None:
        tr = open_trace(trace_path)
        rescale = (tr.n_layers, tr.n_neurons) != (spec.n_layers, spec.d_ff)
        info = {"path": str(tr.path), "synthetic": tr.is_synthetic, "model": tr.spec.name, "rescaled": rescale,
                "description": f"the given trace ({tr.spec.name}, {tr.n_tokens} tokens)"
                + (f", tiled onto {spec.name}'s shape" if rescale else "")}
        return tr, info, rescale
    if tokens < 2:
        raise FlashsimError(f"--tokens {tokens}: a synthetic trace needs at least 2 tokens")
    if spec.ffn_kind == "relu":
        p = synthesize(out_dir, spec, tokens, seed, **RELU_ASSUMPTION)
        info = {"synthetic": True, "source": None, "assumption": dict(RELU_ASSUMPTION),
                "description": (f"synthetic {spec.name}-shape trace ({tokens} decode tokens, seed {seed}) with "
                                f"ReLU-like sparsity assumed: {RELU_ASSUMPTION['active_fraction']:.0%} of FFN "
                                f"neurons active per token, {RELU_ASSUMPTION['overlap']:.0%} of them active in "
                                f"the previous token, {RELU_ASSUMPTION['hot_skew']:.0%} of neurons give 80% of "
                                "the activity (OPT-like, LLM in a flash Sec. 3.1)")}
    else:
        src = open_trace(shipped_trace_path())
        p = synthesize(out_dir, spec, tokens, seed, like=src)
        info = {"synthetic": True, "source": str(src.path), "assumption": None,
                "description": (f"synthetic {spec.name}-shape trace ({tokens} decode tokens, seed {seed}) fitted "
                                f"to the statistics of the nearest real trace, {src.spec.name} "
                                f"({src.spec.ffn_kind}; per layer: active fraction, window coverage, hot-neuron "
                                f"CDF, magnitudes; its rule {src.manifest.sparsity.rule}:"
                                f"{src.manifest.sparsity.target_fraction:g} makes about half the neurons "
                                "active)")}
    tr = open_trace(p)
    info["path"] = str(p)
    return tr, info, False


def native_grid(grid: Sequence[tuple[str, Sequence[str]]] = PLAN_GRID) -> list[tuple[str, Sequence[str]]]:
    """The grid without quantized weights (`--native-only`: a filter; their quality is measured)."""
    return [(p, o) for p, o in grid if p != "quantized" and "precision=quantized" not in o]


def plan_model(model: str, device: str, *, budget_bytes: int | None = None, target_tps: float | None = None,
               min_quality: float | None = None, trace: str | None = None, tokens: int = DEFAULT_PLAN_TOKENS,
               seed: int = 0, native_only: bool = False, tolerance_bytes: int = DEFAULT_TOLERANCE_BYTES,
               progress: Callable[[str | None], None] | None = None, max_jpt: float | None = None,
               min_agreement: float | None = None, quality: QualityTable | str | None = SHIPPED,
               bound: str = "achievable", max_ppl_ratio: float | None = DEFAULT_MAX_PPL_RATIO) -> Plan:
    """Names in, plan out: load the model and device, prepare the trace (a synthetic one lives in a
    temporary directory for the duration of the plan) and plan. `progress(stage)` is called with a
    stage name when one starts and with None after every simulated run."""
    import tempfile

    from devices import load_model, load_profile

    validate_targets(target_tps, min_quality, min_agreement, max_jpt)
    check_max_ppl_ratio(max_ppl_ratio)
    if budget_bytes is not None and budget_bytes <= 0:
        raise FlashsimError(f"--dram-free {budget_bytes}: must be > 0 bytes")
    if tokens < 2:
        raise FlashsimError(f"--tokens {tokens}: must be >= 2")
    from devices.achievable import at_bound, inputs

    spec, raw = load_model(model), load_profile(device)
    profile = at_bound(raw, bound)
    if budget_bytes is not None and budget_bytes > profile.memory.capacity_bytes:  # before the slow part
        raise FlashsimError(f"--dram-free {format_bytes(budget_bytes)} exceeds the DRAM of {profile.name} "
                            f"({format_bytes(profile.memory.capacity_bytes)})")
    note = progress or (lambda stage: None)
    with tempfile.TemporaryDirectory(prefix="flashsim-plan-") as tmp:
        if trace is None:
            note("synthesizing trace")
        tr, info, rescale = planning_trace(spec, f"{tmp}/trace", trace_path=trace, tokens=tokens, seed=seed)
        note("simulating")
        grid = native_grid() if native_only else PLAN_GRID
        result = plan(tr, spec, profile, budget_bytes=budget_bytes, target_tps=target_tps,
                      min_quality=min_quality, trace_info=info, rescale=rescale, seed=seed,
                      grid=grid, tolerance_bytes=tolerance_bytes, progress=lambda: note(None), max_jpt=max_jpt,
                      min_agreement=min_agreement, quality=quality, max_ppl_ratio=max_ppl_ratio)
        if bound == "achievable":   # every configuration again at the datasheet ceiling (no bisection)
            note("peak bound")
            pl = Planner(tr, spec, at_bound(raw, "peak"), rescale=rescale, seed=seed, progress=lambda: note(None))
            peak = {r["label"]: finite_or_none(pl.evaluate(r["preset"], r["overrides"], r["dram_budget_bytes"])
                                        .metric(TOKENS_PER_S)) for r in result.rows if r["fits"]}
            result.peak_bound = {"configurations": peak,
                                 "best": peak.get(result.best["label"]) if result.best else None}
    result.power_mode, result.bound = raw.power_mode, bound
    result.device_inputs = inputs(raw, bound, spec.dtype)
    if trace is None:
        info["path"] = None  # it lived in a temporary directory
    if native_only:
        result.notes.append("quantized configurations excluded (--native-only)")
    return result
