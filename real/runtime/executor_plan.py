"""What the real executor (real/runtime/backend.py `RealExecutor`) settles before its first token:
the run's configuration against the store and the host, every step's plan, and the caches' sizes
(sizes in bytes and neurons, times in seconds).

- `store_config`, `store_alignment_bytes`: the flash layout's alignment taken from the store's
  manifest (4096 for a padded store, 0 for packed), so the simulator built for the run, and any
  replay of it, count the padded strides the reads really move;
- `check_executable`: the policies against what the executor can carry out (one line, exit 2, for
  a policy it would not follow: a page-granular residency, a precision that changes the stored
  weights, a prefetch issued at another point than the one it implements, a hook it needs missing);
- `check_threads`: the run's compute threads against the profile's measurement;
- `plan_steps` -> `StepPlans`: every (step, layer) plan `stack.plan(l, s, s + 1, cap)` made in the
  order the run executes them, kept as bitset arrays per layer and step (`RealCapacityError` when a
  step does not fit the budget);
- `cache_rows`: each layer's cache rows, from the simulator's share of the budget.

The policy's own bookkeeping (set algebra in Python) is NOT part of the run: it is the simulator's
planning, not work the device does. The plans depend only on the trace, the budget and the
policies (never on a timing), so they are all made when the executor is built, before the first
token (`StepPlans.plan_s`: how long that took). Planning inside the timed loop and subtracting its
time is not the same: a prefetch in flight runs on through the subtracted time, so its reads would
get free time and their CPU work would land outside the records (measured: a shape-mode delta run
planned 4.5 ms per token inline against 2.0 ms without prefetch, the difference being the prefetch
thread's work).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from devices.errors import FlashsimError
from devices.schema import DeviceProfile
from sim import bitsets
from sim.config import RunConfig
from sim.policies.base import CapacityError, IssuePoint, Prefetcher, require_hooks

if TYPE_CHECKING:
    from devices.model_spec import ModelSpec
    from sim.policies.stack import PolicyStack


class RealCapacityError(CapacityError, FlashsimError):
    """A step's computed set does not fit the layer's cache share, raised while the executor plans.

    A `CapacityError` (model mode catches it and names its predictor) and a `FlashsimError` (shape
    mode lets it reach the CLI: one line, exit 2)."""

    def __init__(self, layer: int, step: int, need_neurons: int, cap_neurons: int):
        super().__init__(layer, step, need_neurons, cap_neurons)
        self.args = (f"DRAM budget too small at step {step}: layer {layer} computes {need_neurons} neurons but its "
                     f"share of the cache holds {cap_neurons}; raise --dram-budget or use a sparser policy or trace",)

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass
class StepPlans:
    """Every (step, layer) plan of a run, as words [L, S, W]: `executed` (the computed set), `survive`
    (what the cache keeps before the demand reads: kept or computed, less what the plan prefetches
    back) and `keep` (what it keeps after the FFN, static neurons included); `quality_sums` [S, 4]
    the quality proxy's sums per step (activation mass kept num, den, recall num, den); `plan_s` the
    seconds the planning took (3 x layers x steps x words of memory: 0.12 GiB for a 7B shape over
    1000 steps)."""

    executed: np.ndarray
    survive: np.ndarray
    keep: np.ndarray
    quality_sums: np.ndarray
    plan_s: float


def plan_steps(sim: Any, n_layers: int, n_steps: int, d_ff: int) -> StepPlans:
    """Every (step, layer) plan of the built Simulation `sim`, in the order the run executes them
    (module doc). Raises RealCapacityError when a step does not fit the budget."""
    L, S, W = n_layers, n_steps, bitsets.n_words(d_ff)
    executed = np.zeros((L, S, W), bitsets.WORD)
    survive = np.zeros((L, S, W), bitsets.WORD)
    keep_all = np.zeros((L, S, W), bitsets.WORD)
    quality_sums = np.zeros((S, 4))     # activation mass kept (num, den), recall (num, den)
    static = [sim.stack.static_mask(layer) for layer in range(L)]
    t0 = time.perf_counter()
    for s in range(S):
        cap = sim.memory.layer_caps(sim.budget_bytes, s, s + 1, L)   # [2, L]: the simulator's shares
        for layer in range(L):
            try:
                plan = sim.stack.plan(layer, s, s + 1, cap[:, layer])
            except CapacityError as e:
                raise RealCapacityError(e.layer, e.step, e.need, e.cap) from None
            computed = plan.computed[0]
            keep = sim.stack.residency.kept(layer) | static[layer]
            executed[layer, s] = computed
            keep_all[layer, s] = keep
            survive[layer, s] = (keep | computed) & ~plan.prefetch_next[0]
            quality_sums[s] += _quality(sim, layer, s, plan)
    return StepPlans(executed, survive, keep_all, quality_sums, time.perf_counter() - t0)


def cache_rows(sim: Any, n_layers: int, n_steps: int, d_ff: int) -> tuple[np.ndarray, list[int]]:
    """(each layer's share of the cache in neurons, each layer's cache rows). The share is the
    simulator's own (MemoryModel.layer_caps: equal, or the run's memory.cache_split) at its largest
    over the run; the policy keeps at most its share of dynamic neurons across steps and computes at
    most `peak` more (a recorded trace's predictor cannot compute more than the union it is given),
    plus the static neurons."""
    L = n_layers
    share_rows = sim.memory.layer_caps(sim.budget_bytes, 0, n_steps, L).max(axis=0)
    view = sim.view
    peak = max(int(bitsets.count(view.needed(layer, 0, n_steps)).max()) for layer in range(L))
    static = max(int(bitsets.count(sim.stack.static_mask(layer))) for layer in range(L))
    return share_rows, [int(min(d_ff, int(c) + peak + static)) for c in share_rows]


# When the executor issues a prefetch: at the end of the layer in the step before (the delta
# prefetcher's point), or never. A prefetch meant for another point (lookahead's previous layer of
# the same step) would be timed as this one, so it is refused instead.
EXECUTED_ISSUE_POINTS = (IssuePoint.NONE, IssuePoint.PREVIOUS_STEP)
BACKEND = "the real backend"


def executes_prefetch(prefetcher: Prefetcher) -> bool:
    """True when the executor issues this prefetcher's reads where the simulator times them."""
    return prefetcher.issue_point() in EXECUTED_ISSUE_POINTS


def check_executable(stack: PolicyStack, store_spec: ModelSpec) -> None:
    """FlashsimError (one line) for a policy the executor would not carry out as the simulator
    times it; MissingHookError for one that lacks a hook the executor asks (sim/policies/base.py)."""
    res, pf = stack.residency, stack.prefetch
    if res.page_granular:
        raise FlashsimError(f"residency {res.name!r} is page-granular (the mmap baseline): run `flashsim real mmap`")
    if stack.precision.transform(store_spec) != store_spec:
        raise FlashsimError(f"precision {stack.precision.name!r} changes the stored weights (Precision.transform); "
                            "the real backend computes the store's own dtype: use --set precision=native")
    issue = pf.issue_point()
    if not executes_prefetch(pf):
        raise FlashsimError(f"prefetch {pf.name!r} issues its reads at {issue.value} (Prefetcher.issue_point), which "
                            f"the real backend does not execute (it prefetches at "
                            f"{IssuePoint.PREVIOUS_STEP.value} only); use --set prefetch=delta or prefetch=none")
    require_hooks(res, BACKEND, "kept")
    require_hooks(stack.layout, BACKEND, "bundled", "max_coalesced_bytes")


def _quality(sim: Any, layer: int, step: int, plan: Any) -> np.ndarray:
    """The simulator's own quality proxy (sim.quality_proxy.layer_quality) on a step's sets: [mass kept
    num, den, recall num, den]."""
    from sim.quality_proxy import layer_quality

    mn, md, rn, rd = layer_quality(sim.view, layer, step, step + 1, plan.computed, plan.needed)
    return np.array([mn.sum(), md.sum(), rn.sum(), rd.sum()], dtype=np.float64)


def store_alignment_bytes(store: Any) -> int:
    """Bytes each unit occupies on flash is rounded up to: the store's `align_bytes` when its units are
    padded, 0 when packed (a packed store's reads are widened to 4 KiB per read instead, which the
    layout does not model)."""
    return int(store.manifest.align_bytes) if store.manifest.alignment == "padded" else 0


def store_config(config: RunConfig, store: Any) -> tuple[RunConfig, str | None]:
    """`config` with the layout's units aligned as the store's manifest says (`Layout.params_aligned_to`),
    and a note when that replaced a different alignment the run asked for (None otherwise). The
    residency's parameters are those for reads that land in place (`Residency.params_for_in_place_reads`,
    e.g. the window's `insert_copy` false): the reader writes new neurons straight into the cache's
    rows (a packed store's staging copy is part of the read), so no insert copy is made."""
    in_place = config.residency.instantiate().params_for_in_place_reads()
    if in_place != config.residency.params:
        config = replace(config, residency=replace(config.residency, params=in_place))
    layout = config.layout.instantiate()
    want = store_alignment_bytes(store)
    had = layout.alignment_bytes()
    if had == want:
        return config, None
    note = None
    if had != 0:
        note = (f"{config.layout.name}: alignment {had} bytes replaced by {want}: the store {store.path} is "
                f"{store.manifest.alignment} and its layout is what the reads move")
    return replace(config, layout=replace(config.layout, params=layout.params_aligned_to(want))), note


def check_threads(threads: int | None, profile: DeviceProfile) -> str | None:
    """Compute threads of a real run vs. the profile's measurement: FlashsimError for < 1; a loud
    warning (returned, and issued with `warnings.warn`) when they differ, since the simulator then
    times the compute with rates measured at another thread count."""
    if threads is not None and threads < 1:
        raise FlashsimError(f"--threads {threads}: must be >= 1")
    measured = profile.compute.threads
    if threads is None or measured is None or threads == measured:
        return None
    msg = (f"WARNING: the real run computes with {threads} thread(s) but profile {profile.name!r} measured its "
           f"compute rates with {measured}; simulated compute times will not match: re-run `flashsim bench "
           f"compute --threads {threads}` or run with --threads {measured}")
    warnings.warn(msg, stacklevel=3)
    return msg
