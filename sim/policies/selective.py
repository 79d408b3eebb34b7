"""`selective`: SelectInfer's neuron-level selective loading and computation.

Offline scores s_n = sum_t |a_n(t)| (`traces.profiler`) rank each layer's neurons per task (base
neurons, task-specific) and over all tasks (secondary neurons, model-specific).

* **Loading** (memory): per layer, the top `static_ratio` x N neurons of the task's base ranking,
  then secondary neurons in model-wide order, up to `load_ratio` (gamma) x N. They are loaded before
  the first token (static, counted as fixed memory); the rest are never loaded nor computed.
* **Computation** (speed): static neurons (those base neurons) are always computed; at the prefill,
  every loaded neuron is computed for the prompt tokens, each prompt token votes for its top
  `alpha` x (loaded non-static) neurons by |a|, and the most voted ones (ties: model-wide score)
  become the dynamic set, so that static + dynamic = `compute_ratio` (phi) x N. Decode steps
  compute static + dynamic only. With a batch, votes come from all sequences' prompt tokens.

The profile comes from `profile` (a `.npz` written by `flashsim trace profile`, i.e.
`traces.profiler.save_profile`); without one the replayed trace is profiled itself, which is
optimistic (the ranking has seen the tokens it is tested on) and is said in the results. The task
is `task`, or the task label of the replayed prompts; a task the profile lacks uses the
model-wide ranking only (noted). Votes use the trace's stored top-K magnitudes; a trace without
magnitudes votes with its activity masks.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from devices.errors import FlashsimError
from sim import bitsets
from sim.params import check, param
from sim.policies.base import Residency
from sim.policies.cache import CachedResidency
from sim.policies.registry import RESIDENCY
from sim.workload import StepSlice


@RESIDENCY.register("selective")
class SelectiveResidency(CachedResidency, Residency):
    """Load up to gamma of the neurons (base, then secondary); compute static + dynamic up to phi."""

    gathers = False

    @dataclass(frozen=True)
    class Params:
        load_ratio: float = param(0.7, "gamma: fraction of each layer's FFN neurons loaded (the rest are dropped)")
        compute_ratio: float = param(0.4, "phi = delta + epsilon: fraction of neurons computed per token")
        static_ratio: float = param(0.2, "delta: fraction of neurons that are base (task) neurons, always computed")
        alpha: float = param(0.1, "fraction of the loaded non-static neurons each prompt token votes for")
        profile: str = param("", "SelectInfer neuron profile (.npz from `flashsim trace profile`); "
                                 "empty: profile the replayed trace itself (optimistic)")
        task: str = param("", "task whose base ranking is used (default: the replayed prompts' task)")

        def __post_init__(self) -> None:
            for name in ("load_ratio", "compute_ratio", "static_ratio", "alpha"):
                v = getattr(self, name)
                check(0.0 <= v <= 1.0, f"{name} must be in [0, 1], got {v}")
            check(self.static_ratio <= self.compute_ratio <= self.load_ratio,
                  f"static_ratio ({self.static_ratio}) <= compute_ratio ({self.compute_ratio}) <= load_ratio "
                  f"({self.load_ratio}) must hold")

    def window_k(self) -> int | None:
        return 0

    def bind(self, ctx) -> None:  # type: ignore[no-untyped-def]
        from traces.profiler import load_neuron_profile, profile_traces

        super().bind(ctx)
        view = ctx.view
        if self.params.profile:
            prof = load_neuron_profile(self.params.profile)
            src = f"profile {self.params.profile}"
        else:
            # the same trace view (shared across a sweep's or plan's runs) is profiled once
            prof = view.__dict__.get("_self_profile") or view.__dict__.setdefault("_self_profile",
                                                                                profile_traces([view.trace]))
            src = "the replayed trace itself"
            ctx.notes.append("selective: no profile file given, so the replayed trace was profiled itself "
                             "(optimistic: the neuron ranking has seen the tokens it is tested on)")
        if (prof.n_layers, prof.n_neurons) != (view.trace.n_layers, view.trace.n_neurons):
            raise FlashsimError(f"selective.profile {self.params.profile}: {prof.n_layers} x {prof.n_neurons} "
                                f"neurons, the trace has {view.trace.n_layers} x {view.trace.n_neurons}")
        task = self.params.task or self._replayed_task(view)
        self._source_key = self.params.profile or ""
        self._base_key = task if task in prof.scores_task else ""
        if task in prof.scores_task:
            self._base_scores = prof.scores_task[task]
        else:
            self._base_scores = prof.scores_all
            ctx.notes.append(f"selective: task {task!r} is not in {src} (tasks: {', '.join(prof.tasks) or 'none'}); "
                             "base neurons use the model-wide ranking")
        self._secondary_scores = prof.scores_all
        self._task = task
        self._loaded: dict[int, np.ndarray] = {}
        self._static: dict[int, np.ndarray] = {}
        self._dynamic: dict[int, np.ndarray] = {}

    @staticmethod
    def _replayed_task(view) -> str:  # type: ignore[no-untyped-def]
        prompts = view.trace.manifest.prompts
        tasks = [prompts[p].task for p in view.steps.sequence_prompts if p < len(prompts)]
        return Counter(tasks).most_common(1)[0][0] if tasks else ""

    def describe(self) -> dict:
        d = super().describe()
        d["resolved_task"] = getattr(self, "_task", "")
        return d

    # ---- sets in model neuron space -----------------------------------------------------------
    def _scores(self, table: np.ndarray, layer: int) -> np.ndarray:
        v = self.ctx.view
        s = table[v.trace_layer(layer)]
        return s[np.arange(v.n_neurons) % v.trace.n_neurons] if v.rescaled else s

    def _order(self, table: np.ndarray, task: str, layer: int) -> np.ndarray:
        """Neurons by descending score (stable); kept on the view, which a sweep's or plan's runs
        share, since the ranking depends only on the profile, the task and the layer."""
        store = self.ctx.view.__dict__.setdefault("_selective_orders", {})
        key = (self._source_key, task, layer)
        if key not in store:
            store[key] = np.argsort(-self._scores(table, layer), kind="stable")
        return store[key]

    def _sets(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """(loaded bool [N], static bool [N])."""
        if layer not in self._loaded:
            N = self.ctx.n_neurons
            base = self._order(self._base_scores, self._base_key, layer)
            sec = self._order(self._secondary_scores, "", layer)
            n_static = int(round(self.params.static_ratio * N))
            n_load = int(round(self.params.load_ratio * N))
            static = np.zeros(N, bool)
            static[base[:n_static]] = True
            loaded = static.copy()
            rest = sec[~static[sec]]
            loaded[rest[: max(0, n_load - n_static)]] = True
            self._loaded[layer], self._static[layer] = loaded, static
        return self._loaded[layer], self._static[layer]

    def dynamic(self, layer: int) -> np.ndarray:
        """bool [N]: the dynamic neurons chosen from the prefill's votes."""
        if layer in self._dynamic:
            return self._dynamic[layer]
        view = self.ctx.view
        N = self.ctx.n_neurons
        loaded, static = self._sets(layer)
        pool = loaded & ~static
        n_dyn = int(round(self.params.compute_ratio * N)) - int(static.sum())
        n_dyn = max(0, min(n_dyn, int(pool.sum())))
        sec = self._scores(self._secondary_scores, layer)
        prefill = np.flatnonzero(view.steps.phase == 0)
        votes = np.zeros(N, np.int64)
        if len(prefill):
            pos, _ = view.steps.token_positions(int(prefill[0]), int(prefill[0]) + 1)
            if view.trace.top_k > 0:
                mags = view.token_magnitudes(layer, pos)
            else:
                mags = view.token_active(layer, pos).astype(np.float32)
            mags = np.where(pool[None, :], mags, -1.0)
            k = max(1, int(round(self.params.alpha * pool.sum())))
            k = min(k, N)
            top = np.argpartition(-mags, k - 1, axis=1)[:, :k]
            picked = np.take_along_axis(mags, top, axis=1) > 0
            np.add.at(votes, top[picked], 1)
        elif layer == 0:
            self.ctx.notes.append("selective: the workload has no prompt, so dynamic neurons are the "
                                  "highest-scoring loaded ones (no prefill votes)")
        cand = np.flatnonzero(pool)
        order = np.lexsort((cand, -sec[cand], -votes[cand]))
        dyn = np.zeros(N, bool)
        dyn[cand[order[:n_dyn]]] = True
        self._dynamic[layer] = dyn
        return dyn

    # ---- Residency hooks ----------------------------------------------------------------------
    def static_mask(self, layer: int) -> np.ndarray:
        return bitsets.pack(self._sets(layer)[0])

    def allowed(self, layer: int, steps: StepSlice) -> np.ndarray:
        loaded, static = self._sets(layer)
        decode_set = bitsets.pack(static | self.dynamic(layer))
        out = np.broadcast_to(decode_set, (steps.size, len(decode_set))).copy()
        pre = steps.phase == 0
        if pre.any():
            out[pre] = bitsets.pack(loaded)
        return out
