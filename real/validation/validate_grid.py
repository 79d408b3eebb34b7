"""The validation grid: which configurations `flashsim validate` runs and at which DRAM budgets
(sizes in bytes).

Owns the grid's definition and nothing that runs it: the shape-mode model (`validation_spec`), a
configuration (`GridPoint`: window k x bundling x prefetch x budget, its overrides and its RunConfig
on a store), the grids of each mode (`grid`, `model_grid`, quick and full), the budget of a fraction
of the FFN (`budget_for`), the modes (`parse_modes`) and model mode's settings (`MODEL_NAME`,
`MODEL_KEEP`, `STORE_SETTINGS`). Running the grid is real/validation/validate_runs.py; the whole
validation and its report, real/validation/validate.py.

Budgets: DRAM for the neuron caches = a fraction of the FFN's bytes as the caches hold them
(bundles padded to the store's alignment, `budget_for`). Shape mode's trace activates 10% of the
neurons: 25% and 50% of the FFN. Model mode's oracle computes the top `MODEL_KEEP` = 25% of every
layer: a 25% budget is exactly the computed set, and window k = 0 with delta prefetch keeps every
layer's prefetched next set (~25% of the FFN) across the step plus the layer being computed, which
cannot fit (the simulator's DRAM check refused it at step 0; the real run, which checks no total, ran
over the budget). Model mode's budgets are therefore 37.5% and 50%
(`MODEL_BUDGET_FRACTIONS`: 1.5x and 2x the computed set).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from devices.model_spec import ModelSpec
from sim.policies.bundling import padded_bytes

FULL_K = (0, 1, 2, 4, 8)
QUICK_K = (0, 2, 8)
BUDGET_FRACTIONS = (0.25, 0.5)   # DRAM for neuron caches, as a fraction of the FFN's bytes
# model mode computes MODEL_KEEP of every layer: the lower budget must hold more than that (module docstring)
MODEL_BUDGET_FRACTIONS = (0.375, 0.5)
# every prefetch policy the real backend executes (real.runtime.executor_plan.executes_prefetch; the
# lookahead prefetcher is refused there), so each is scored against the simulator
PREFETCH = ("none", "delta")
MODES = ("shape", "model", "moe")     # moe: expert caches on an expert store (real/validation/validate_moe.py)
MODEL_NAME = "smollm2-135m"
MODEL_QUICK_K = (0, 4)
# oracle active fraction of model mode: SmolLM2's SwiGLU is not naturally sparse, so a quarter of the
# neurons (top |a| per token) gives caches and prefetch something to do (quality: docs/calibrate-and-validate.md)
MODEL_KEEP = 0.25
# real passes over the grid by default: each pass is then scored against the mean of the other two,
# the host's repeat spread that the simulator's error is read against (real.validation.validate_score.floor)
DEFAULT_REPEATS = 3
STORE_SETTINGS = {"dtype": "fp32", "layout": "both", "alignment": "padded", "file_mode": "per-layer",
                  "order": "original"}
def validation_spec(quick: bool) -> ModelSpec:
    """A small llama shape, stored fp32: rows of 4 KiB, so no padding in either layout, and fp32
    because PyTorch's CPU fp16 GEMV kernels convert as they go and run several times slower than
    fp32, which would make the grid measure the conversion rather than the policies."""
    return ModelSpec(name="validate-shape", family="llama", n_layers=4 if quick else 8, d_model=1024,
                     d_ff=2048, dtype="fp32", n_heads=8, n_kv_heads=4, head_dim=128, vocab_size=4096, ffn_kind="swiglu")


@dataclass(frozen=True)
class GridPoint:
    """One configuration of the grid: window k, bundled or not, the prefetch policy, and the DRAM budget
    as a fraction of the FFN's bytes (`budget_for`)."""

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

    def run_config(self, store: Any, n_steps: int, seed: int) -> tuple[int, Any]:
        """(DRAM budget in bytes, RunConfig) of this point on `store` for a run of n_steps: the
        budget from `budget_for` at the store's alignment, the layout set from its manifest
        (real.runtime.executor_plan.store_config). Shape mode runs it under `shape_config`."""
        from real.runtime.executor_plan import store_alignment_bytes, store_config
        from sim.config import RunConfig

        budget = budget_for(store.spec, n_steps, self.budget_fraction, store_alignment_bytes(store))
        cfg, _ = store_config(RunConfig().with_overrides(self.overrides(budget) + [f"seed={seed}"]), store)
        return budget, cfg


def grid(quick: bool) -> list[GridPoint]:
    ks = QUICK_K if quick else FULL_K
    budgets = BUDGET_FRACTIONS[1:] if quick else BUDGET_FRACTIONS
    return [GridPoint(k, b, p, f) for k, b, p, f in itertools.product(ks, (True, False), PREFETCH, budgets)]


def model_grid(quick: bool) -> list[GridPoint]:
    """Model mode: the same k x bundling x prefetch grid with MODEL_BUDGET_FRACTIONS (quick: k in
    MODEL_QUICK_K, 50% budget: 8 configurations)."""
    ks, budgets = (MODEL_QUICK_K, MODEL_BUDGET_FRACTIONS[1:]) if quick else (FULL_K, MODEL_BUDGET_FRACTIONS)
    return [GridPoint(k, b, p, f) for k, b, p, f in itertools.product(ks, (True, False), PREFETCH, budgets)]


def budget_for(spec: ModelSpec, n_steps: int, fraction: float, align_bytes: int = 0) -> int:
    """Fixed weights + the largest KV cache + `fraction` of the FFN bytes as the neuron caches hold them
    (each neuron a bundle rounded up to `align_bytes`, the store's: the real cache's rows, which the
    simulator's memory model charges too), so a fraction is the same share of neurons in any store."""
    ffn = spec.n_layers * spec.d_ff * padded_bytes(spec.ffn_neuron_bytes, align_bytes)
    return int(spec.non_ffn_bytes + (n_steps + 1) * spec.kv_bytes_per_token + fraction * ffn)


def parse_modes(text: str | None) -> tuple[str, ...]:
    from devices.errors import FlashsimError

    if text is None:
        return MODES
    modes = tuple(dict.fromkeys(m.strip() for m in text.split(",") if m.strip()))
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise FlashsimError(f"--modes {text!r}: give one or more of {', '.join(MODES)} (comma-separated)")
    return modes
