"""From names to a plan: `plan_model` loads the model and the device (at the chosen bound), prepares
the trace a plan replays (`planning_trace`: the given trace, tiled onto the model's shape when the
shapes differ, or a synthetic trace of the model's shape) and runs the what-if planner
(analysis/planner.py) over the grid, then every configuration that ran again at the datasheet
ceiling for the peak bound. `native_grid` is the grid without quantized weights (--native-only).

The trace is prepared lazily: configurations whose resident weights exceed the budget by the model
spec alone are refused first (analysis/plan_eval.py), and a trace is loaded or synthesised only when
one must run. Synthetic planning traces are cached by the content hash of everything that makes
them (the model spec, tokens, seed, the source trace's manifest, the synthesiser's source) under the
tool's own cache folder (`$FLASHSIM_CACHE_DIR`, else `$XDG_CACHE_HOME/flashsim`, else
`~/.cache/flashsim`), in `plan-traces/<hash>/`; a new entry is written to a temporary folder beside
it and renamed into place, and nothing the cache did not write is ever removed.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from analysis.planner import (
    DEFAULT_TOLERANCE_BYTES,
    PLAN_GRID,
    SHIPPED,
    Plan,
    plan,
    validate_targets,
)
from analysis.quality_evidence import DEFAULT_MAX_PPL_RATIO, check_max_ppl_ratio
from analysis.quality_table import QualityTable
from devices.errors import FlashsimError
from devices.model_spec import ModelSpec
from devices.units import format_bytes
from traces.format import Trace

# ReLU FFNs (OPT) are far sparser than SwiGLU ones: LLM in a flash (Sec. 3.1) reports ~97%
# of OPT-6.7B's FFN neurons inactive per token; the reuse between consecutive tokens (0.7 of a token's
# active set active in the previous token) and the hot-neuron skew (25% of neurons give 80% of the
# activity) are the assumptions docs/replay.md uses for its OPT-6.7B reproduction.
RELU_ASSUMPTION = {"active_fraction": 0.03, "overlap": 0.7, "hot_skew": 0.25}
DEFAULT_PLAN_TOKENS = 128


def cache_dir() -> Path:
    """The tool's own cache folder (see the module docstring)."""
    env = os.environ.get("FLASHSIM_CACHE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flashsim"


def _synth_key(spec: ModelSpec, tokens: int, seed: int, kwargs: dict[str, Any], source: Path | None) -> str:
    """The content hash of a synthetic planning trace's inputs, the synthesiser's code included."""
    import traces

    h = hashlib.sha256()
    h.update(json.dumps({"spec": spec.model_dump(mode="json"), "tokens": tokens, "seed": seed, "kwargs": kwargs},
                        sort_keys=True, default=str).encode())
    if source is not None:
        h.update((source / "manifest.json").read_bytes())
    for f in sorted(Path(traces.__file__).parent.glob("synthetic*.py")) + [Path(traces.__file__).parent / "format.py"]:
        h.update(f.read_bytes())
    return h.hexdigest()[:32]


def _cached_synthesis(spec: ModelSpec, tokens: int, seed: int, kwargs: dict[str, Any], source: Path | None,
                      like: Callable[[], Trace] | None) -> tuple[Path, bool]:
    """(path, from the cache?): the synthetic trace for these inputs, written once."""
    import tempfile

    from traces.synthetic import synthesize

    root = cache_dir() / "plan-traces"
    path = root / _synth_key(spec, tokens, seed, kwargs, source)
    if (path / "manifest.json").is_file():
        return path, True
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".tmp-", dir=root) as tmp:
        out = synthesize(Path(tmp) / "trace", spec, tokens, seed, like=like() if like else None, **kwargs)
        try:
            os.rename(out, path)          # atomic; a concurrent writer's identical entry wins
        except OSError:
            if not (path / "manifest.json").is_file():
                raise
    return path, False


def planning_trace(spec: ModelSpec, out_dir: str | None = None, *, trace_path: str | None = None,
                   tokens: int = DEFAULT_PLAN_TOKENS, seed: int = 0) -> tuple[Trace, dict[str, Any], bool]:
    """(trace, what it is, rescale?): the given trace (rescaled onto the model's shape when the shapes
    differ), or a synthetic trace of the model's shape (cached, see the module docstring; `out_dir`
    is unused and kept for callers)."""
    from traces.data import shipped_trace_path
    from traces.format import open_trace

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
        p, cached = _cached_synthesis(spec, tokens, seed, dict(RELU_ASSUMPTION), None, None)
        info = {"synthetic": True, "source": None, "assumption": dict(RELU_ASSUMPTION),
                "description": (f"synthetic {spec.name}-shape trace ({tokens} decode tokens, seed {seed}) with "
                                f"ReLU-like sparsity assumed: {RELU_ASSUMPTION['active_fraction']:.0%} of FFN "
                                f"neurons active per token, {RELU_ASSUMPTION['overlap']:.0%} of them active in "
                                f"the previous token, {RELU_ASSUMPTION['hot_skew']:.0%} of neurons give 80% of "
                                "the activity (OPT-like, LLM in a flash Sec. 3.1)")}
    else:
        src_path = Path(shipped_trace_path())
        p, cached = _cached_synthesis(spec, tokens, seed, {}, src_path, lambda: open_trace(src_path))
        src = open_trace(src_path, verify=False)
        info = {"synthetic": True, "source": str(src.path), "assumption": None,
                "description": (f"synthetic {spec.name}-shape trace ({tokens} decode tokens, seed {seed}) fitted "
                                f"to the statistics of the nearest real trace, {src.spec.name} "
                                f"({src.spec.ffn_kind}; per layer: active fraction, window coverage, hot-neuron "
                                f"CDF, magnitudes; its rule {src.manifest.sparsity.rule}:"
                                f"{src.manifest.sparsity.target_fraction:g} makes about half the neurons "
                                "active)")}
    # the synthetic trace was written by this tool (its hashes computed as it wrote) and renamed into
    # place whole, now or on an earlier plan: its structure is checked, its arrays are not hashed
    # again (that re-read is most of a cached plan's start-up and ~1 s of a fresh 70B-shape one)
    tr = open_trace(p, verify=False)
    info["path"] = str(p)
    info["cached"] = cached
    return tr, info, False


def native_grid(grid: Sequence[tuple[str, Sequence[str]]] = PLAN_GRID) -> list[tuple[str, Sequence[str]]]:
    """The grid without quantized weights (`--native-only`: a filter; their quality is measured)."""
    return [(p, o) for p, o in grid if p != "quantized" and "precision=quantized" not in o]


def plan_model(model: str, device: str, *, budget_bytes: int | None = None, target_tps: float | None = None,
               min_quality: float | None = None, trace: str | None = None, tokens: int = DEFAULT_PLAN_TOKENS,
               seed: int = 0, native_only: bool = False, tolerance_bytes: int = DEFAULT_TOLERANCE_BYTES,
               progress: Callable[[str | None], None] | None = None, max_jpt: float | None = None,
               min_agreement: float | None = None, quality: QualityTable | str | None = SHIPPED,
               bound: str = "achievable", max_ppl_ratio: float | None = DEFAULT_MAX_PPL_RATIO,
               runtime: str | None = None) -> Plan:
    """Names in, plan out: load the model and device, check each configuration's resident weights
    against the budget from the spec, prepare the trace when some configuration must run (a synthetic
    one from the cache, see the module docstring) and plan. `progress(stage)` is called with a stage
    name when one starts and with None after every simulated run; `Plan.stages` gives each stage's
    seconds."""
    import time

    from devices import load_model, load_profile
    from sim.engine import SetAlgebraCache

    validate_targets(target_tps, min_quality, min_agreement, max_jpt)
    check_max_ppl_ratio(max_ppl_ratio)
    if runtime is not None:
        from devices.runtime import load_runtime

        load_runtime(runtime)   # an unknown name fails here, with close matches
    if budget_bytes is not None and budget_bytes <= 0:
        raise FlashsimError(f"--dram-free {budget_bytes}: must be > 0 bytes")
    if tokens < 2:
        raise FlashsimError(f"--tokens {tokens}: must be >= 2")
    from devices.achievable import at_bound, inputs

    stages: dict[str, float] = {}
    current = {"name": "", "t0": time.perf_counter()}

    def note(stage: str | None) -> None:
        if stage is not None:
            now = time.perf_counter()
            if current["name"]:
                stages[current["name"]] = stages.get(current["name"], 0.0) + now - current["t0"]
            current.update(name=stage, t0=now)
        if progress:
            progress(stage)

    note("loading model and device")
    spec, raw = load_model(model), load_profile(device)
    profile = at_bound(raw, bound)
    if budget_bytes is not None and budget_bytes > profile.memory.capacity_bytes:  # before the slow part
        raise FlashsimError(f"--dram-free {format_bytes(budget_bytes)} exceeds the DRAM of {profile.name} "
                            f"({format_bytes(profile.memory.capacity_bytes)})")
    from traces.format import check_run_memory

    check_run_memory(tokens, spec.n_layers, spec.d_ff, f"planning {spec.name}")   # before the trace is made
    grid = native_grid() if native_only else PLAN_GRID
    info: dict[str, Any] = {"path": None, "synthetic": None, "description": (
        "none needed: no configuration's resident weights fit the budget (checked from the model spec)")}

    def load() -> Trace:
        note("loading trace" if trace is not None else "synthesizing trace (cached by content hash)")
        tr, got, _ = planning_trace(spec, trace_path=trace, tokens=tokens, seed=seed)
        info.clear()
        info.update(got)
        note("simulating")
        return tr

    cache = SetAlgebraCache()
    note("checking resident weights against the budget (model spec)")
    result = plan(load, spec, profile, budget_bytes=budget_bytes, target_tps=target_tps,
                  min_quality=min_quality, trace_info=info, rescale=None, seed=seed,
                  grid=grid, tolerance_bytes=tolerance_bytes, progress=lambda: note(None), max_jpt=max_jpt,
                  min_agreement=min_agreement, quality=quality, max_ppl_ratio=max_ppl_ratio, cache=cache,
                  runtime=runtime, peak_profile=at_bound(raw, "peak") if bound == "achievable" else None)
    stages[current["name"]] = stages.get(current["name"], 0.0) + time.perf_counter() - current["t0"]
    result.stages = stages
    result.power_mode, result.bound = raw.power_mode, bound
    result.device_inputs = inputs(raw, bound, spec.dtype)
    if native_only:
        result.notes.append("quantized configurations excluded (--native-only)")
    return result
