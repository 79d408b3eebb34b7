"""Statistics of a routing trace: what an expert cache sees. Pure NumPy, vectorised over tokens, layers
and experts; every rate is a fraction in [0, 1].

* **popularity** [M, E]: share of a layer's expert activations that go to each expert (sums to 1);
  summarised per layer by its normalised entropy (1 = uniform) and the largest share.
* **reuse_prev**: share of a token's K experts the previous token of its sequence also used (the hit
  rate of a cache that holds exactly the last token's experts).
* **SRP(m)**, segment routing best performance (Liang et al., "Not All Models Suit Expert Offloading",
  arXiv 2505.16056): for every segment of m consecutive tokens of one sequence and one layer, the best F1
  that one fixed expert set achieves against the segment's routing, where a set S scores
  matches = Σ_{e∈S} c_e (c_e: tokens of the segment that use e), predictions = |S|·m, activations = K·m,
  F1 = 2·matches / (|S|·m + K·m); the best S is the |S| most used experts of the segment. Averaged over
  segments (all start positions) and reported per layer.
* **SCH(m, c)**, segment cache best hit rate (same paper): the share of a segment's K·m activations that
  a cache of c experts, filled with the segment's c most used experts (future knowledge within the
  segment), serves. Reported at c = 2K, the cache size the paper finds most models balance at.
* **cross-layer**: normalised mutual information between a token's top-1 expert at consecutive MoE
  layers (0 = independent, 1 = one determines the other), and the in-sample accuracy of predicting the
  next layer's top-1 expert from this layer's by the most frequent transition.
* **top1_weight**: mean router weight of the top-ranked expert.

`split_half` computes every statistic on the first and the second half of a trace's tokens: how much the
statistics of this trace vary with the tokens measured, the floor below which a synthetic trace's
distance to the source cannot be told apart from sampling noise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from traces.routing import DECODE, PREFILL, RoutingTrace

SEGMENTS = (4, 16, 64)                  # segment lengths m of SRP / SCH
MAX_WINDOW_CELLS = 5 * 10**7            # windows x layers x experts of one SRP/SCH pass (int32: 200 MB)
PHASES = ("all", "decode", "prefill")


@dataclass(frozen=True)
class RoutingView:
    """The arrays a statistic reads: experts [T, M, K] (int), weights [T, M, K], sequence [T]."""

    experts: np.ndarray
    weights: np.ndarray
    sequence: np.ndarray
    n_experts: int

    @property
    def n_tokens(self) -> int:
        return self.experts.shape[0]

    def take(self, tokens: np.ndarray | slice) -> RoutingView:
        return RoutingView(self.experts[tokens], self.weights[tokens], self.sequence[tokens], self.n_experts)


def view_of(trace: RoutingTrace, phase: str = "all") -> RoutingView:
    """The tokens of one phase (all, decode, prefill) as a RoutingView (loaded into memory)."""
    sel = np.ones(trace.n_tokens, bool)
    if phase != "all":
        sel = np.asarray(trace.phase) == (DECODE if phase == "decode" else PREFILL)
    return RoutingView(np.asarray(trace.experts)[sel].astype(np.int64), np.asarray(trace.weights)[sel],
                       trace.sequence_ids()[sel], trace.n_experts)


def onehot(experts: np.ndarray, n_experts: int) -> np.ndarray:
    """int32 [T, M, E]: 1 where the token uses the expert at that layer."""
    T, M, _ = experts.shape
    out = np.zeros((T, M, n_experts), np.int32)
    np.put_along_axis(out, experts, 1, axis=2)
    return out


def popularity(v: RoutingView) -> np.ndarray:
    """float64 [M, E]: share of each layer's activations per expert."""
    counts = onehot(v.experts, v.n_experts).sum(axis=0).astype(np.float64)
    return counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)


def _same_seq_prev(v: RoutingView) -> np.ndarray:
    """bool [T-1]: token t+1 has a previous token (t) in its sequence."""
    return v.sequence[1:] == v.sequence[:-1]


def reuse_prev(v: RoutingView) -> np.ndarray:
    """float64 [M]: mean share of a token's experts used by the previous token of its sequence."""
    oh = onehot(v.experts, v.n_experts)
    ok = _same_seq_prev(v)
    if not ok.any():
        return np.full(v.experts.shape[1], np.nan)
    both = (oh[1:] & oh[:-1]).sum(axis=2)[ok]               # [pairs, M]
    return both.mean(axis=0) / v.experts.shape[2]


def segment_counts(v: RoutingView, m: int) -> np.ndarray:
    """int32 [windows, M, E]: expert use counts of every m-token window inside one sequence (sorted
    descending over experts). Start positions are thinned evenly if the array would be too large."""
    oh = onehot(v.experts, v.n_experts)
    T, M, E = oh.shape
    csum = np.concatenate([np.zeros((1, M, E), np.int32), np.cumsum(oh, axis=0, dtype=np.int32)])
    starts = np.arange(0, max(T - m + 1, 0))
    if starts.size:
        starts = starts[v.sequence[starts] == v.sequence[starts + m - 1]]   # window inside one sequence
    if starts.size * M * E > MAX_WINDOW_CELLS:
        starts = starts[:: int(np.ceil(starts.size * M * E / MAX_WINDOW_CELLS))]
    w = csum[starts + m] - csum[starts]
    return -np.sort(-w, axis=2)


def srp_sch(v: RoutingView, m: int, cache: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(SRP [M], SCH [M]) at segment length m and a cache of `cache` experts (default 2K, at most E);
    NaN where no sequence has m tokens."""
    K, E = v.experts.shape[2], v.n_experts
    c = min(E, 2 * K if cache is None else cache)
    w = segment_counts(v, m)
    if w.shape[0] == 0:
        nan = np.full(v.experts.shape[1], np.nan)
        return nan, nan
    matches = np.cumsum(w, axis=2, dtype=np.float64)                     # top-j experts' counts, j = 1..E
    sizes = np.arange(1, E + 1, dtype=np.float64)
    f1 = 2 * matches / (sizes * m + K * m)
    srp = f1.max(axis=2).mean(axis=0)
    sch = matches[:, :, c - 1].mean(axis=0) / (K * m)
    return srp, sch


def _nmi(a: np.ndarray, b: np.ndarray, n: int) -> float:
    joint = np.zeros((n, n))
    np.add.at(joint, (a, b), 1.0)
    joint /= joint.sum()
    pa, pb = joint.sum(1), joint.sum(0)
    nz = joint > 0
    mi = float((joint[nz] * np.log(joint[nz] / np.outer(pa, pb)[nz])).sum())
    ha = -float((pa[pa > 0] * np.log(pa[pa > 0])).sum())
    hb = -float((pb[pb > 0] * np.log(pb[pb > 0])).sum())
    return mi / np.sqrt(ha * hb) if ha > 0 and hb > 0 else 0.0


def cross_layer(v: RoutingView) -> tuple[np.ndarray, np.ndarray]:
    """(NMI [M-1], top-1 transition accuracy [M-1]) between consecutive stored MoE layers."""
    top1, E = v.experts[:, :, 0], v.n_experts
    nmi, acc = [], []
    for m in range(top1.shape[1] - 1):
        a, b = top1[:, m], top1[:, m + 1]
        nmi.append(_nmi(a, b, E))
        joint = np.zeros((E, E))
        np.add.at(joint, (a, b), 1.0)
        acc.append(float(joint.max(axis=1).sum() / max(len(a), 1)))
    return np.array(nmi), np.array(acc)


def _mean(x: np.ndarray) -> float | None:
    x = np.asarray(x, np.float64)
    return None if x.size == 0 or np.all(np.isnan(x)) else float(np.nanmean(x))


def routing_stats(v: RoutingView) -> dict[str, Any]:
    """Every statistic of the module docstring: per layer and summarised (mean over layers)."""
    pop = popularity(v)
    E = v.n_experts
    with np.errstate(divide="ignore", invalid="ignore"):
        ent = -np.where(pop > 0, pop * np.log(pop), 0.0).sum(axis=1) / np.log(E) if E > 1 else np.ones(len(pop))
    reuse = reuse_prev(v)
    seg = {m: srp_sch(v, m) for m in SEGMENTS}
    nmi, acc = cross_layer(v)
    per_layer = [{"moe_layer": i, "popularity_entropy": float(ent[i]), "max_share": float(pop[i].max()),
                  "reuse_prev": None if np.isnan(reuse[i]) else float(reuse[i]),
                  "srp": {str(m): None if np.isnan(seg[m][0][i]) else float(seg[m][0][i]) for m in SEGMENTS},
                  "sch": {str(m): None if np.isnan(seg[m][1][i]) else float(seg[m][1][i]) for m in SEGMENTS}}
                 for i in range(pop.shape[0])]
    return {
        "n_tokens": v.n_tokens, "n_moe_layers": int(v.experts.shape[1]), "n_experts": E,
        "top_k": int(v.experts.shape[2]), "sch_cache_experts": min(E, 2 * int(v.experts.shape[2])),
        "popularity_entropy": _mean(ent), "max_share": _mean(pop.max(axis=1)), "reuse_prev": _mean(reuse),
        "srp": {str(m): _mean(seg[m][0]) for m in SEGMENTS}, "sch": {str(m): _mean(seg[m][1]) for m in SEGMENTS},
        "cross_layer_nmi": _mean(nmi), "cross_layer_top1_acc": _mean(acc),
        "top1_weight": float(np.mean(v.weights[:, :, 0])) if v.n_tokens else None,
        "per_layer": per_layer,
    }


def popularity_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Mean over layers of the total-variation distance between two [M, E] popularity tables."""
    return float(0.5 * np.abs(a - b).sum(axis=1).mean())


COMPARED = ("reuse_prev", "srp.16", "sch.16", "cross_layer_nmi")   # scalars the synthesis is scored on


def scalar(stats: dict[str, Any], key: str) -> float | None:
    """A summary value by dotted key ('srp.16')."""
    head, _, sub = key.partition(".")
    v = stats[head]
    return v[sub] if sub else v


def split_half(v: RoutingView) -> tuple[RoutingView, RoutingView]:
    """The first and second half of the tokens (sequences keep their ids, so no window spans the cut)."""
    h = v.n_tokens // 2
    return v.take(slice(0, h)), v.take(slice(h, None))


def compare(reference: RoutingView, candidate: RoutingView) -> dict[str, Any]:
    """Distance of `candidate`'s statistics to `reference`'s, beside the reference's split-half floor.

    For popularity the distance is `popularity_distance`; for each scalar in COMPARED the absolute
    difference. The floor is the same distance between the reference's two halves. A candidate passes
    a statistic when distance <= floor + SLACK (SLACK absorbs a floor that is near 0 by chance: two
    halves can agree to 0.001 on one statistic while their sampling spread is 0.01)."""
    a, b = split_half(reference)
    ref, sa, sb, cand = (routing_stats(x) for x in (reference, a, b, candidate))
    rows = {"popularity_tv": {"distance": popularity_distance(popularity(reference), popularity(candidate)),
                              "floor": popularity_distance(popularity(a), popularity(b))}}
    for key in COMPARED:
        r, c, x, y = (scalar(s, key) for s in (ref, cand, sa, sb))
        rows[key] = {"reference": r, "candidate": c,
                     "distance": None if r is None or c is None else abs(c - r),
                     "floor": None if x is None or y is None else abs(x - y)}
    for row in rows.values():
        row["passes"] = (row["distance"] is not None and row["floor"] is not None
                         and row["distance"] <= row["floor"] + SLACK)
    return {"slack": SLACK, "rows": rows, "passes": all(r["passes"] for r in rows.values())}


SLACK = 0.01
