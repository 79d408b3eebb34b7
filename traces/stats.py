"""Trace statistics: how sparse, how persistent and how skewed a trace's FFN activity is.

Everything is computed layer by layer from the bitpacked masks with bit operations
(`np.bitwise_and/or` + `np.bitwise_count` on uint64 words); one layer's masks (T x N/8 bytes) are
the most that is ever in memory, so a trace is never loaded whole. All quantities are unitless
fractions in [0, 1].

Which tokens count (`phase`):
    "all" measures every token; "decode" only generated tokens; "prefill" only prompt tokens.
    The phase selects the tokens t whose active set A_t is measured; the *history* of a token is
    always the positions just before it in the same prompt, whatever their phase (the first decode
    token's predecessor is the last prompt token: they are adjacent in the sequence).

Prompt boundaries:
    A prompt is a contiguous run of equal `prompt_index`. A token's history never crosses into
    another prompt: the first token of a prompt has no predecessor and is left out of overlap and
    coverage, and a token counts toward window coverage at k only if its prompt has at least k
    tokens before it (so every k is measured on full windows, and coverage is comparable across
    traces with different prompt lengths). Where no token qualifies the value is None.

Definitions (per layer; "overall" pools the events of all layers, i.e. ratios of sums, not means of
ratios, so each (token, neuron) event weighs the same):
    active_fraction      sum_t |A_t| / (T_measured * N)
    window_coverage[k]   sum_t |A_t ∩ (A_t-1 ∪ ... ∪ A_t-k)| / sum_t |A_t|   over qualifying tokens:
                         the share of needed neurons already held by a window of the last k tokens
                         (LLM in a flash's windowing saves exactly these loads)
    overlap_prev         window_coverage[1] = sum |A_t ∩ A_t-1| / sum |A_t|
    hot_cdf(x)           share of active events given by the x*N most often active neurons
                         (neurons sorted by activation count; linear between neuron counts)
    hot80_fraction       smallest fraction of neurons giving >= 80% of active events; 0.8 means
                         no skew, small values mean a few hot neurons do most of the work.
                         Overall: over all L*N neurons of the model pooled.
    hot80_mass_fraction  the same for |a| mass, from the stored top-K magnitudes (None when K = 0)
    magnitude_coverage   share of the exact total |a| (abs_sum) that the stored top-K entries hold
    task_hot_overlap     for each pair of task labels: Jaccard |H_a ∩ H_b| / |H_a ∪ H_b| of their
                         hot-80% neuron sets (computed on each task's tokens only)
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from devices.errors import FlashsimError
from traces.format import DECODE, PREFILL, Trace

PHASES = ("all", "decode", "prefill")
MAX_WINDOW = 16
HOT_SHARE = 0.8
# Neuron fractions at which the hot-neuron CDF is reported: log-spaced below 10% (where the skew
# shows) and linear above.
HOT_CDF_GRID = tuple(float(x) for x in np.unique(np.round(np.concatenate(
    [np.geomspace(0.001, 0.1, 11), np.linspace(0.1, 1.0, 19)]), 6)))


# ---- token selection --------------------------------------------------------------------------
def tokens_before_in_prompt(prompt_index: np.ndarray) -> np.ndarray:
    """int64 [T]: how many positions precede each token inside its contiguous prompt run."""
    pi = np.asarray(prompt_index)
    n = len(pi)
    if n == 0:
        return np.zeros(0, np.int64)
    starts = np.ones(n, bool)
    starts[1:] = pi[1:] != pi[:-1]
    run_start = np.maximum.accumulate(np.where(starts, np.arange(n), 0))
    return np.arange(n) - run_start


def measured_tokens(phase_array: np.ndarray, phase: str) -> np.ndarray:
    """bool [T]: the tokens whose active sets are measured under `phase` (all|decode|prefill)."""
    if phase not in PHASES:
        raise FlashsimError(f"--phase {phase!r}: choose one of {', '.join(PHASES)}")
    ph = np.asarray(phase_array)
    if phase == "all":
        return np.ones(len(ph), bool)
    return ph == (DECODE if phase == "decode" else PREFILL)


# ---- per-layer counting (the bit-operation core) ----------------------------------------------
@dataclass
class LayerCounts:
    """Raw sums of one layer; stats are ratios of these, and layers pool by adding them."""

    n_tokens: int                        # measured tokens
    n_neurons: int
    active_events: int                   # sum_t |A_t| over measured tokens
    window_hits: np.ndarray              # int64 [K]: sum |A_t ∩ window_k| over tokens qualifying at k
    window_events: np.ndarray            # int64 [K]: sum |A_t| over the same tokens
    neuron_counts: np.ndarray            # int64 [N]: measured tokens where each neuron is active
    task_counts: dict[str, np.ndarray] = field(default_factory=dict)   # task -> int64 [N]
    neuron_mass: np.ndarray | None = None    # float64 [N]: stored |a| per neuron (None if K = 0)
    stored_mass: float = 0.0             # sum of stored |a|
    total_mass: float = 0.0              # sum of abs_sum (exact |a| over all neurons)


def _as_words(packed: np.ndarray) -> np.ndarray:
    """uint8 [T, NB] -> uint64 [T, ceil(NB/8)] (zero padded), for 8x fewer bit operations."""
    packed = np.ascontiguousarray(packed, dtype=np.uint8)
    t, nb = packed.shape
    pad = (-nb) % 8
    if pad:
        packed = np.concatenate([packed, np.zeros((t, pad), np.uint8)], axis=1)
    return packed.view(np.uint64)


def window_counts(packed: np.ndarray, measured: np.ndarray, n_before: np.ndarray,
                  max_window: int = MAX_WINDOW) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-token popcounts and window hits of one layer.

    Returns (active [T], hits [K], events [K]): active counts per token, and for k = 1..K the sums
    of |A_t ∩ (A_t-1 ∪ ... ∪ A_t-k)| and |A_t| over measured tokens with n_before >= k.
    """
    words = _as_words(packed)
    active = np.bitwise_count(words).sum(axis=1, dtype=np.int64)
    hits = np.zeros(max_window, np.int64)
    events = np.zeros(max_window, np.int64)
    union = np.zeros_like(words)
    for k in range(1, max_window + 1):
        if k >= len(words):
            break
        union[k:] |= words[:-k]            # union[t] = A_t-1 | ... | A_t-k
        ok = measured & (n_before >= k)
        if not ok.any():
            continue
        rows = np.flatnonzero(ok)
        hits[k - 1] = np.bitwise_count(words[rows] & union[rows]).sum(dtype=np.int64)
        events[k - 1] = active[rows].sum()
    return active, hits, events


def neuron_counts(packed: np.ndarray, n_neurons: int, rows: np.ndarray | None = None) -> np.ndarray:
    """int64 [N]: in how many of the given rows (default all) each neuron is active."""
    sub = packed if rows is None else packed[rows]
    bits = np.unpackbits(np.asarray(sub), axis=1, count=n_neurons, bitorder="little")
    return bits.sum(axis=0, dtype=np.int64)


def count_packed(packed: np.ndarray, n_neurons: int, measured: np.ndarray, n_before: np.ndarray,
                 tasks: dict[str, np.ndarray] | None = None, max_window: int = MAX_WINDOW) -> LayerCounts:
    """Raw sums of one layer's packed masks uint8 [T, NB] (no magnitudes). `tasks` maps a task
    label to bool [T] (already restricted to measured tokens); per-task counts need two or more."""
    packed = np.asarray(packed)
    active, hits, events = window_counts(packed, measured, n_before, max_window)
    rows = np.flatnonzero(measured)
    task_counts: dict[str, np.ndarray] = {}
    if tasks and len(tasks) > 1:
        for name, sel in tasks.items():
            task_counts[name] = neuron_counts(packed, n_neurons, np.flatnonzero(sel))
        counts = np.sum(list(task_counts.values()), axis=0)
    else:
        counts = neuron_counts(packed, n_neurons, rows)
    return LayerCounts(n_tokens=len(rows), n_neurons=n_neurons, active_events=int(active[rows].sum()),
                       window_hits=hits, window_events=events, neuron_counts=counts, task_counts=task_counts)


def count_layer(trace: Trace, layer: int, measured: np.ndarray, n_before: np.ndarray,
                tasks: dict[str, np.ndarray] | None = None, max_window: int = MAX_WINDOW) -> LayerCounts:
    """All raw sums of one layer of a trace, with the |a| mass per neuron when K > 0."""
    lc = count_packed(trace.packed_masks(layer), trace.n_neurons, measured, n_before, tasks, max_window)
    if trace.top_k:
        rows = np.flatnonzero(measured)
        idx, mag = trace.top(layer)
        idx = np.asarray(idx[rows]).ravel()
        mag = np.asarray(mag[rows], dtype=np.float64).ravel()
        lc.neuron_mass = np.bincount(idx, weights=mag, minlength=trace.n_neurons)
        lc.stored_mass = float(mag.sum())
        lc.total_mass = float(np.asarray(trace.abs_sum(layer)[rows], dtype=np.float64).sum())
    return lc


# ---- derived statistics -----------------------------------------------------------------------
def hot_curve(counts: np.ndarray) -> np.ndarray:
    """float64 [N+1]: share of the total given by the m most active neurons, m = 0..N."""
    counts = np.asarray(counts)
    if counts.dtype.kind in "iu" and len(counts) and 0 <= counts.min() and counts.max() <= 4 * len(counts):
        hist = np.bincount(counts)                  # event counts: a counting sort, the same order
        c = np.repeat(np.arange(len(hist) - 1, -1, -1, dtype=np.float64), hist[::-1])
    else:
        c = np.sort(np.asarray(counts, dtype=np.float64))[::-1]
    total = c.sum()
    curve = np.concatenate([[0.0], np.cumsum(c)])
    return curve / total if total > 0 else np.full(len(curve), np.nan)


def hot_cdf(counts: np.ndarray, grid: tuple[float, ...] | np.ndarray = HOT_CDF_GRID,
            curve: np.ndarray | None = None) -> np.ndarray:
    """Share of events given by the top x*N neurons at each x of `grid` (linear between counts).
    `curve`: `hot_curve(counts)` when already computed."""
    curve = hot_curve(counts) if curve is None else curve
    n = len(curve) - 1
    return np.interp(np.asarray(grid) * n, np.arange(n + 1), curve)


def hot_fraction(counts: np.ndarray, share: float = HOT_SHARE, curve: np.ndarray | None = None) -> float | None:
    """Smallest fraction of neurons whose counts sum to >= `share` of the total (None if empty).
    `curve`: `hot_curve(counts)` when already computed."""
    curve = hot_curve(counts) if curve is None else curve
    if np.isnan(curve[-1]):
        return None
    m = int(np.searchsorted(curve, share - 1e-12, side="left"))
    return m / (len(curve) - 1)


def hot_set(counts: np.ndarray, share: float = HOT_SHARE) -> np.ndarray:
    """bool [N]: the neurons that make up `hot_fraction` (most active first, ties by index)."""
    counts = np.asarray(counts)
    out = np.zeros(len(counts), bool)
    frac = hot_fraction(counts, share)
    if frac is None:
        return out
    order = np.argsort(-counts, kind="stable")
    out[order[: round(frac * len(counts))]] = True
    return out


def jaccard(a: np.ndarray, b: np.ndarray) -> float | None:
    union = np.count_nonzero(a | b)
    return None if union == 0 else float(np.count_nonzero(a & b) / union)


def _ratio(num: float, den: float) -> float | None:
    return None if den == 0 else float(num) / float(den)


def _summary(counts: list[LayerCounts], pooled_counts: np.ndarray, pooled_mass: np.ndarray | None,
             pooled_tasks: dict[str, np.ndarray]) -> dict[str, Any]:
    """Statistics of a group of layers (one layer, or all pooled)."""
    events = sum(c.active_events for c in counts)
    cells = sum(c.n_tokens * c.n_neurons for c in counts)
    hits = np.sum([c.window_hits for c in counts], axis=0)
    wev = np.sum([c.window_events for c in counts], axis=0)
    cov = {str(k + 1): _ratio(hits[k], wev[k]) for k in range(len(hits))}
    tasks = sorted(pooled_tasks)
    sets = {t: hot_set(pooled_tasks[t]) for t in tasks}
    pairs = [{"tasks": [a, b], "jaccard": jaccard(sets[a], sets[b])} for a, b in itertools.combinations(tasks, 2)]
    stored = sum(c.stored_mass for c in counts)
    total = sum(c.total_mass for c in counts)
    curve = hot_curve(pooled_counts)
    return {
        "active_fraction": _ratio(events, cells),
        "overlap_prev": cov["1"],
        "window_coverage": cov,
        "hot80_fraction": hot_fraction(pooled_counts, curve=curve),
        "hot80_mass_fraction": None if pooled_mass is None else hot_fraction(pooled_mass),
        "magnitude_coverage": None if pooled_mass is None else _ratio(stored, total),
        "hot_cdf": [None if np.isnan(v) else float(v) for v in hot_cdf(pooled_counts, curve=curve)],
        "task_hot_overlap": pairs,
    }


@dataclass
class TraceStats:
    """Statistics of a trace: `overall` and `per_layer` dicts with the keys documented above."""

    path: str
    model: str
    synthetic: bool
    phase: str
    n_tokens: int            # measured tokens
    n_tokens_trace: int
    n_layers: int
    n_neurons: int
    top_k: int
    tasks: dict[str, int]    # task -> measured tokens
    overall: dict[str, Any]
    per_layer: list[dict[str, Any]]
    layer_counts: list[LayerCounts] = field(default_factory=list, repr=False)

    def to_json(self) -> dict[str, Any]:
        def rnd(x: Any) -> Any:
            if isinstance(x, float):
                return round(x, 6)
            if isinstance(x, dict):
                return {k: rnd(v) for k, v in x.items()}
            if isinstance(x, list):
                return [rnd(v) for v in x]
            return x

        return rnd({
            "trace": self.path, "model": self.model, "synthetic": self.synthetic, "phase": self.phase,
            "n_tokens": self.n_tokens, "n_tokens_trace": self.n_tokens_trace, "n_layers": self.n_layers,
            "n_neurons": self.n_neurons, "top_k": self.top_k, "tasks": self.tasks,
            "hot_cdf_grid": list(HOT_CDF_GRID), **self.overall, "per_layer": self.per_layer,
        })


def summarize_counts(counts: list[LayerCounts]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(overall, per_layer) statistics from per-layer raw sums."""
    per_layer = []
    for i, c in enumerate(counts):
        per_layer.append({"layer": i, **_summary([c], c.neuron_counts, c.neuron_mass, c.task_counts)})
    has_mass = all(c.neuron_mass is not None for c in counts)
    pooled = np.concatenate([c.neuron_counts for c in counts])
    mass = np.concatenate([c.neuron_mass for c in counts]) if has_mass else None  # type: ignore[misc]
    tasks = sorted(counts[0].task_counts) if counts else []
    pooled_tasks = {t: np.concatenate([c.task_counts[t] for c in counts]) for t in tasks}
    return _summary(counts, pooled, mass, pooled_tasks), per_layer


def trace_stats(trace: Trace, phase: str = "all", max_window: int = MAX_WINDOW,
                layers: range | None = None) -> TraceStats:
    """Statistics of an opened trace (see the module docstring for the definitions)."""
    measured = measured_tokens(trace.phase, phase)
    if not measured.any():
        raise FlashsimError(f"{trace.path}: no {phase} tokens in this trace; use --phase all")
    n_before = tokens_before_in_prompt(trace.prompt_index)
    labels = trace.task_of_token
    task_names = sorted(set(labels[measured]))
    tasks = {t: measured & (labels == t) for t in task_names}
    layers = layers if layers is not None else range(trace.n_layers)
    counts = [count_layer(trace, layer, measured, n_before, tasks, max_window) for layer in layers]
    overall, per_layer = summarize_counts(counts)
    return TraceStats(
        path=str(trace.path), model=trace.spec.name, synthetic=trace.is_synthetic, phase=phase,
        n_tokens=int(measured.sum()), n_tokens_trace=trace.n_tokens, n_layers=len(counts),
        n_neurons=trace.n_neurons, top_k=trace.top_k,
        tasks={t: int(v.sum()) for t, v in tasks.items()},
        overall=overall, per_layer=per_layer, layer_counts=counts,
    )


def coverage_list(stats: dict[str, Any], max_k: int) -> list[float | None]:
    """window_coverage[1..max_k] of an overall or per-layer stats dict, as a list."""
    return [stats["window_coverage"].get(str(k)) for k in range(1, max_k + 1)]
