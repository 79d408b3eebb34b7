"""What a sweep's or plan's runs share (`SetAlgebraCache`): trace views with their per-layer needed
sets, the quality sums of each computed-set configuration, and whole runs' decisions
(sim/decisions.py), so that changing the device or the budget does not recompute what they do not
change. `sim.engine.build` takes one (default: the process-wide `DEFAULT_CACHE`).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict

from devices.model_spec import ModelSpec
from devices.schema import DeviceProfile
from sim.config import RunConfig
from sim.decisions import DecisionMemo, QualityMemo
from sim.policies.base import Residency
from sim.policies.stack import PolicyStack
from sim.workload import TraceView, build_steps
from traces.format import Trace

# Decisions kept per cache: a 70B-shape plan's run (80 layers x 128 steps) is a few MB.
DECISION_MEMO_BYTES = 256 << 20


class SetAlgebraCache:
    """Trace views (with their per-layer needed sets) reused across runs, bounded by entry count; the
    quality sums per computed-set configuration; and whole runs' decisions (`decision_memo`), bounded
    by bytes."""

    def __init__(self, max_views: int = 4, max_decision_bytes: int = DECISION_MEMO_BYTES):
        self.max_views = max_views
        self._views: OrderedDict[tuple, TraceView] = OrderedDict()
        self.quality: dict[tuple, dict] = {}
        self.max_decision_bytes = max_decision_bytes
        self._decisions: OrderedDict[tuple, DecisionMemo] = OrderedDict()
        self._lock = threading.RLock()    # runs on several threads share one cache (analysis/plan_eval.py)

    def view(self, trace: Trace, config: RunConfig, spec: ModelSpec) -> TraceView:
        with self._lock:
            return self._view(trace, config, spec)

    def _view(self, trace: Trace, config: RunConfig, spec: ModelSpec) -> TraceView:
        w = config.workload
        key = (_trace_key(trace), w.prompt_tokens, w.tokens, w.batch, spec.n_layers, spec.d_ff, config.sim.rescale)
        v = self._views.get(key)
        if v is None:
            steps = build_steps(trace, w.prompt_tokens, w.tokens, w.batch)
            v = TraceView(trace, steps, spec.n_layers, spec.d_ff, rescale=config.sim.rescale)
            self._views[key] = v
            while len(self._views) > self.max_views:
                old, _ = self._views.popitem(last=False)
                self.quality = {k: q for k, q in self.quality.items() if k[0] != old}
                self._decisions = OrderedDict((k, m) for k, m in self._decisions.items() if k[0] != old)
        else:
            self._views.move_to_end(key)
        v.cache_key = key  # type: ignore[attr-defined]
        return v

    def quality_memo(self, view: TraceView, stack: PolicyStack, config: RunConfig) -> QualityMemo:
        """The quality sums of one computed-set configuration: the computed sets depend only on the
        trace view, the predictor (and its seed) and what the residency allows (SelectInfer), never
        on the device or the budget. Backed by the view's sums by computed-set content, which
        configurations that compute the same sets under other parameters (SelectInfer's load ratio,
        a predictor's rank) share."""
        allowed = stack.residency.describe() if type(stack.residency).allowed is not Residency.allowed else None
        d_ff = stack.precision.transform(view.trace.spec).d_ff
        key = (view.cache_key, json.dumps(stack.predictor.describe(), sort_keys=True, default=str),  # type: ignore[attr-defined]
               json.dumps(allowed, sort_keys=True, default=str), config.sim.seed, d_ff)
        with self._lock:
            by_content = self.quality.setdefault((view.cache_key, "content", d_ff), {})  # type: ignore[attr-defined]
            return QualityMemo(self.quality.setdefault(key, {}), by_content)

    def decision_memo(self, view: TraceView, stack: PolicyStack, config: RunConfig, spec: ModelSpec,
                      profile: DeviceProfile, budget_bytes: int) -> DecisionMemo | None:
        """The memo of a run's decisions (sim.decisions.DecisionMemo): complete when a run with the
        same decisions finished before (e.g. the same configuration at the datasheet peak after the
        achievable run), else empty, to be filled. Decisions depend on the trace view, the model, the
        configuration (policies, seed, budget) and the device's memory, not on its speed numbers: a
        policy sees the profile but its sets may not depend on flash, compute or DRAM rates. Plans are
        made before time runs (sim/step_plans.py), so timing feedback changes only the timing; a budget
        timeline, planned cell by cell as the DES goes, gets no memo."""
        if config.budget_timeline is not None:
            return None
        with self._lock:
            return self._decision_memo(view, stack, config, spec, profile, budget_bytes)

    def _decision_memo(self, view: TraceView, stack: PolicyStack, config: RunConfig, spec: ModelSpec,
                       profile: DeviceProfile, budget_bytes: int) -> DecisionMemo:
        self.trim_decisions()
        key = (view.cache_key, spec.model_dump_json(), profile.name, profile.memory.capacity_bytes,  # type: ignore[attr-defined]
               json.dumps(config.to_dict(), sort_keys=True, default=str), int(budget_bytes))
        memo = self._decisions.get(key)
        if memo is not None and memo.complete:
            self._decisions.move_to_end(key)
            return memo
        memo = DecisionMemo()
        self._decisions[key] = memo
        return memo

    def trim_decisions(self) -> None:
        """Drop the memos of runs that failed and the oldest complete ones beyond the byte bound."""
        with self._lock:
            self._trim_decisions()

    def _trim_decisions(self) -> None:
        for k in [k for k, m in self._decisions.items() if m.failed]:
            del self._decisions[k]
        total = sum(m.nbytes() for m in self._decisions.values() if m.complete)
        for k in [k for k, m in self._decisions.items() if m.complete]:   # oldest first; runs in progress stay
            if total <= self.max_decision_bytes:
                break
            total -= self._decisions.pop(k).nbytes()


def _trace_key(trace: Trace) -> tuple:
    files = {k: v.sha256 for k, v in trace.manifest.files.items()}
    return (str(trace.path), hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest())


DEFAULT_CACHE = SetAlgebraCache()
