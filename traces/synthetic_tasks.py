"""Task-aware synthesis for `trace synth --like`: keeps the source trace's tasks.

A captured trace labels each prompt with a task, and SelectInfer's profiler (traces/profiler.py)
ranks neurons per task (base) and over all tasks (secondary). The plain fit (traces/synthetic.py)
matches the statistics of a layer but not neuron identities, so neither ranking survives it. When
the source has at least two tasks with at least MIN_TASK_TOKENS measured tokens each, and the
target layer has the source's neuron count, each layer plan fitted by `plan_like` is re-assigned:

  * identities: the plan's fitted rates (the same multiset) go to neurons in the order of the
    source neuron's own rate, so the model-wide ranking (secondary neurons) is the source's;
  * context classes (rho, sigma) stay assigned at random, independently of rates, as the coverage
    fit assumes (tying large sigma to task-dependent neurons broke the coverage match);
  * per-task hot sets: the prompt-level z of a neuron in a task's prompt is no longer random: within
    each task, neurons are ranked by their shrunk log rate ratio log(p~_tau,n / p_n), with
    p~_tau,n = (c_tau,n + PRIOR_TOKENS p_n) / (T_tau + PRIOR_TOKENS) (a Beta prior worth PRIOR_TOKENS
    tokens at the model-wide rate, so a handful of tokens cannot make a neuron task-specific), and
    rank q gets the QUAD_Z node floor(16 q / N): across neurons z keeps exactly the equiprobable
    normal nodes the coverage fit assumes, but now in the source's task order (a Gaussian copula);
  * per-task active fractions: a task's prompts scale every rate by F_tau / F (the source task's
    active fraction over the layer's), which keeps the token-weighted mean at F.

Prompts are labelled with the source prompt's task (the source's prompt lengths are cycled, so are
their tasks). Tasks with fewer than MIN_TASK_TOKENS measured tokens are not fitted: their prompts
keep the plain model (random z, scale 1), are labelled with their task, and are listed under
`unfitted_tasks`; with fewer than two fitted tasks, or a different neuron count, synthesis is the
plain one (reason stated in the manifest under `tasks`).

The check (`profile_check`) runs the profiler on the source and on the written synthetic trace and
reports, per layer, the overlap |A & B| / n of the top-n sets (n = TOP_FRACTION N) of the secondary
ranking and of each fitted task's base ranking, under both profiler scores: |a| sums (its default)
and activation counts (its K = 0 score). The tolerance: for each ranking the mean overlap must
reach the source's own split-half floor (the same overlap between the first and the second half of
each task's tokens, same score), i.e. the synthetic trace reproduces the source's profile at least
as well as the source reproduces itself. Under the |a| score the neurons that carry the strongest
activations follow the source through `magnitude_log_weight` (a Plackett-Luce order of each token's
i.i.d. magnitudes, so the magnitude distribution is unchanged).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from traces.format import Trace
from traces.profiler import profile_traces
from traces.synthetic_chain import QUAD_Z

MIN_TASK_TOKENS = 16      # fewer measured tokens than this: a task's rates are noise, not fitted
PRIOR_TOKENS = 32.0       # Beta prior strength (tokens at the model-wide rate) for per-task rates
TOP_FRACTION = 0.10       # the profiler's top-n sets compared: the hottest 10% of each layer
N_Z = len(QUAD_Z)        # the 16 equiprobable standard-normal nodes of the chain's prompt rates


@dataclass
class TaskFit:
    """Tasks of the source, their prompt order and which are fitted."""

    tasks: list[str]                 # fitted tasks, sorted (index = task id in the generator)
    segment_tasks: list[str]         # task label of each source segment (measured run of a prompt)
    tokens: dict[str, int]           # measured tokens per task (all tasks)
    unfitted: list[str]
    reason: str | None = None        # why synthesis is not task-aware (None = it is)

    @property
    def active(self) -> bool:
        return self.reason is None


def source_tasks(source: Trace, measured: np.ndarray, n_neurons: int) -> TaskFit:
    """Tasks per measured segment (same cut as synthetic.segment_lengths) and which can be fitted."""
    pi = np.asarray(source.prompt_index)
    cut = np.ones(len(pi), bool)
    cut[1:] = (pi[1:] != pi[:-1]) | ~measured[:-1]
    starts = np.flatnonzero(cut & measured)
    labels = np.asarray(source.task_of_token)
    seg_tasks = [str(labels[s]) for s in starts]
    tok = labels[measured]
    names, counts = np.unique(tok.astype(str), return_counts=True) if len(tok) else ([], [])
    tokens = {str(k): int(v) for k, v in zip(names, counts)}
    fitted = sorted(k for k, v in tokens.items() if v >= MIN_TASK_TOKENS)
    unfitted = sorted(k for k in tokens if k not in fitted)
    reason = None
    if len(tokens) < 2:
        reason = "the source has fewer than two task labels"
    elif len(fitted) < 2:
        reason = f"fewer than two tasks have >= {MIN_TASK_TOKENS} measured tokens"
    elif n_neurons != source.n_neurons:
        reason = (f"the target has {n_neurons} neurons per layer, the source {source.n_neurons}: "
                  "neuron identities cannot be carried over")
    return TaskFit(fitted if reason is None else [], seg_tasks, tokens, unfitted, reason)


def layer_task_counts(source: Trace, layer: int, measured: np.ndarray, tasks: Sequence[str]
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(activation counts float64 [n_tasks, N], measured tokens [n_tasks]) of one source layer."""
    labels = np.asarray(source.task_of_token)
    counts = np.zeros((len(tasks), source.n_neurons))
    tokens = np.zeros(len(tasks))
    for i, task in enumerate(tasks):
        sel = np.flatnonzero(measured & (labels == task))
        counts[i] = source.mask(layer, sel).sum(axis=0)
        tokens[i] = len(sel)
    return counts, tokens


def _order(values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Indices sorting values ascending, ties broken at random (reproducibly from rng)."""
    perm = rng.permutation(len(values))
    return perm[np.argsort(values[perm], kind="stable")]


def assign_tasks(rates: np.ndarray, rho: np.ndarray, sigma: np.ndarray, counts: np.ndarray,
                 tokens: np.ndarray, rng: np.random.Generator
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Re-assign one layer's fitted (rates, rho, sigma) to neurons by the source's task counts.

    Returns (rates, rho, sigma, task_z [n_tasks, N], task_scale [n_tasks]); see the module docstring."""
    n = len(rates)
    p = counts.sum(axis=0) / tokens.sum()
    new_rates = np.empty(n)
    new_rates[_order(p, rng)] = np.sort(rates)
    p_t = counts / tokens[:, None]
    shrunk = (counts + PRIOR_TOKENS * p) / (tokens[:, None] + PRIOR_TOKENS)
    log_ratio = np.log(np.maximum(shrunk, 1e-12)) - np.log(np.maximum(p, 1e-12))
    node = (np.arange(n) * N_Z) // n                       # rank q -> node floor(16 q / N)
    task_z = np.empty((len(tokens), n))
    for i in range(len(tokens)):
        task_z[i, _order(log_ratio[i], rng)] = QUAD_Z[node]
    f = float(p.mean())
    task_scale = p_t.mean(axis=1) / max(f, 1e-12)
    return new_rates, rho, sigma, task_z, task_scale


def apply_tasks(plans: list, source: Trace, measured: np.ndarray, fit: TaskFit,
                rng: np.random.Generator) -> None:
    """Re-assign every plan in place (plans from synthetic.plan_like, one per target layer)."""
    cache: dict[Any, Any] = {}
    for plan in plans:
        sl = int(plan.source_layer)
        if sl not in cache:
            cache[sl] = layer_task_counts(source, sl, measured, fit.tasks)
        counts, tokens = cache[sl]
        plan.rates, plan.rho, plan.sigma, plan.task_z, plan.task_scale = assign_tasks(
            plan.rates, plan.rho, plan.sigma, counts, tokens, rng)
        if source.top_k > 0 and plan.magnitude is not None:
            if ("w", sl) not in cache:
                cache[("w", sl)] = magnitude_log_weight(source, sl, measured)
            plan.log_weight = cache[("w", sl)]
        plan.extra["task_active_fraction"] = {
            t: round(float(counts[i].mean() / tokens[i]), 6) for i, t in enumerate(fit.tasks)}


def magnitude_log_weight(source: Trace, layer: int, measured: np.ndarray) -> np.ndarray:
    """log w_n for the Plackett-Luce magnitude order (synthetic.draw_magnitudes): how much more often
    than its share of activity neuron n is among a token's K strongest in the source,
    w_n = ((k_n + PRIOR_TOKENS s) / (c_n + PRIOR_TOKENS)) / s, with k_n its top-K appearances, c_n
    its active tokens and s = sum k / sum c (the prior pulls rarely active neurons toward 1)."""
    n = source.n_neurons
    sel = np.flatnonzero(measured)
    idx, _ = source.top(layer)
    top = np.asarray(idx[sel])
    on = source.mask(layer, sel)
    in_top = np.take_along_axis(on, top.astype(np.int64), axis=1)   # stored and active
    k_n = np.bincount(top[in_top].ravel().astype(np.int64), minlength=n).astype(np.float64)
    c_n = on.sum(axis=0).astype(np.float64)
    s = max(k_n.sum(), 1.0) / max(c_n.sum(), 1.0)
    return np.log((k_n + PRIOR_TOKENS * s) / (c_n + PRIOR_TOKENS) / s)


def token_task_ids(segment_tasks: Sequence[str], segments: Sequence[int], tasks: Sequence[str]) -> np.ndarray:
    """int32 per synthetic token: the fitted task id of its prompt, -1 for an unfitted task."""
    ids = {t: i for i, t in enumerate(tasks)}
    seg_ids = [ids.get(segment_tasks[i % len(segment_tasks)], -1) for i in range(len(segments))]
    return np.repeat(np.asarray(seg_ids, np.int32), segments)


class WriterView:
    """The few Trace attributes the profiler reads, over a TraceWriter's arrays before commit."""

    def __init__(self, writer: Any, spec: Any, task_labels: np.ndarray, path: str):
        self._w, self.spec, self.task_of_token, self.path = writer, spec, task_labels, path
        self.n_layers, self.n_neurons, self.top_k = spec.n_layers, spec.d_ff, writer.top_k

    def top(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        return self._w.top_idx[layer], self._w.top_mag[layer]

    def mask(self, layer: int, tokens: Any = slice(None)) -> np.ndarray:
        packed = np.asarray(self._w.masks[layer][tokens])
        return np.unpackbits(packed, axis=-1, count=self.n_neurons, bitorder="little").astype(bool)


def _overlap(a: np.ndarray, b: np.ndarray, top_n: int) -> np.ndarray:
    """Per layer |top_n(a) & top_n(b)| / top_n for two rankings int [L, N]."""
    out = np.empty(len(a))
    for layer in range(len(a)):
        out[layer] = len(np.intersect1d(a[layer, :top_n], b[layer, :top_n])) / top_n
    return out


class CountView:
    """A trace as the profiler sees one without magnitudes (K = 0): it then scores by activation counts."""

    def __init__(self, trace: Any):
        self._t = trace
        self.top_k = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._t, name)


def profile_check(source: Trace, synthetic: Any, tasks: Sequence[str], layer_map: Sequence[int]) -> dict:
    """The overlaps under both profiler scores: |a| sums (its default) and activation counts (K = 0)."""
    out = {"count": _profile_overlaps(CountView(source), CountView(synthetic), tasks, layer_map)}
    if source.top_k > 0 and synthetic.top_k > 0:
        out["magnitude"] = _profile_overlaps(source, synthetic, tasks, layer_map)
    for key, res in out.items():
        floor = split_half_floor(source, tasks, layer_map, by_magnitude=key == "magnitude")
        res["split_half_floor"] = floor
        res["passes"] = bool(all(res["overlap"][k]["mean"] >= floor[k] for k in floor))
    return out


def _profile_overlaps(source: Any, synthetic: Any, tasks: Sequence[str], layer_map: Sequence[int]) -> dict:
    """Top-n overlaps of the profiler's secondary and per-task base rankings, source vs synthetic."""
    src, syn = profile_traces([source]), profile_traces([synthetic])
    n = syn.n_neurons
    top_n = max(1, int(round(TOP_FRACTION * n)))
    rank_src = {"secondary": src.secondary_ranking()[list(layer_map)]}
    rank_syn = {"secondary": syn.secondary_ranking()}
    for t in tasks:
        rank_src[f"base.{t}"] = src.base_ranking(t)[list(layer_map)]
        rank_syn[f"base.{t}"] = syn.base_ranking(t)
    rows = {}
    for key in rank_src:
        ov = _overlap(rank_src[key], rank_syn[key], top_n)
        rows[key] = {"mean": round(float(ov.mean()), 4), "min": round(float(ov.min()), 4),
                     "per_layer": [round(float(v), 4) for v in ov]}
    return {"top_n": top_n, "top_fraction": TOP_FRACTION, "chance": round(top_n / n, 4),
            "score": syn.meta["score"], "source_score": src.meta["score"], "overlap": rows}


def task_summary(fit: TaskFit, tasked: bool, writer: Any, spec: Any, source: Trace, plans: Sequence,
                 prompt_index: np.ndarray, labels: Sequence[str], path: str) -> dict:
    """The manifest's `tasks` entry: what was fitted, per-task active fractions and the profiler check."""
    out: dict[str, Any] = {"task_aware": tasked, "source_tokens": fit.tokens, "fitted_tasks": fit.tasks,
                           "unfitted_tasks": fit.unfitted, "min_task_tokens": MIN_TASK_TOKENS,
                           "prior_tokens": PRIOR_TOKENS}
    if not tasked:
        out["reason"] = fit.reason or "--prompt-tokens cuts prompts that carry no task"
        return out
    tok_labels = np.asarray(labels, dtype=object)[prompt_index]
    achieved, target = {}, {}
    for t in fit.tasks:
        sel = np.flatnonzero(tok_labels == t)
        fr = [float(np.unpackbits(np.asarray(writer.masks[layer][sel]), axis=-1, count=spec.d_ff,
                                  bitorder="little").mean()) if len(sel) else float("nan")
              for layer in range(spec.n_layers)]
        achieved[t] = round(float(np.mean(fr)), 6)
        target[t] = round(float(np.mean([p.extra["task_active_fraction"][t] for p in plans])), 6)
    out["active_fraction"] = {"target": target, "achieved": achieved}
    view = WriterView(writer, spec, tok_labels, path)
    # a short synthetic trace may hold prompts of only some fitted tasks: the check compares those
    present = [t for t in fit.tasks if (tok_labels == t).any()]
    out["tasks_without_tokens"] = [t for t in fit.tasks if t not in present]
    out["profile_check"] = profile_check(source, view, present, [int(p.source_layer) for p in plans])
    return out


def split_half_floor(source: Trace, tasks: Sequence[str], layer_map: Sequence[int],
                     by_magnitude: bool = False) -> dict[str, float]:
    """The source's own reproducibility under the profiler's count (or |a|-sum) score: mean over layers of the top-n overlap
    between the rankings from the first and the second half of each task's tokens (secondary: the
    halves pooled over tasks). A synthetic trace fitted to the source is expected to agree with the
    source's profile at least as well as half of the source agrees with the other half."""
    labels = np.asarray(source.task_of_token)
    n = source.n_neurons
    top_n = max(1, int(round(TOP_FRACTION * n)))
    halves = {t: np.array_split(np.flatnonzero(labels == t), 2) for t in tasks}
    out: dict[str, list[float]] = {"secondary": [], **{f"base.{t}": [] for t in tasks}}
    for sl in sorted(set(layer_map)):
        a_all, b_all = np.zeros(n), np.zeros(n)
        for t in tasks:
            a, b = (_half_scores(source, sl, h, by_magnitude) for h in halves[t])
            a_all += a
            b_all += b
            out[f"base.{t}"].append(_top_overlap(a, b, top_n))
        out["secondary"].append(_top_overlap(a_all, b_all, top_n))
    return {k: round(float(np.mean(v)), 4) for k, v in out.items()}


def _half_scores(source: Trace, layer: int, sel: np.ndarray, by_magnitude: bool) -> np.ndarray:
    """The profiler's score of one layer over the selected tokens (traces/profiler.py's formula)."""
    if not by_magnitude:
        return source.mask(layer, sel).sum(axis=0).astype(np.float64)
    idx, mag = source.top(layer)
    return np.bincount(np.asarray(idx[sel]).ravel().astype(np.int64), minlength=source.n_neurons,
                       weights=np.asarray(mag[sel], np.float64).ravel())


def _top_overlap(a: np.ndarray, b: np.ndarray, top_n: int) -> float:
    ra, rb = np.argsort(-a, kind="stable")[:top_n], np.argsort(-b, kind="stable")[:top_n]
    return len(np.intersect1d(ra, rb)) / top_n
