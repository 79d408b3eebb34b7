"""Quality of a dropped set: perplexity estimated from a GSI file, or measured on the real model.

Owns: `GsiPerplexity` (the estimate) and `MeasuredPerplexity` (wraps a callable that measures the
perplexity of dropped sets, e.g. real/studies/pruning.measure_drop_sets wired by the CLI), both with
`ppl(dropped) -> float` and `log_ppl(dropped) -> float` (natural log; dropped: bool [2L]). Both
memoise per dropped set.

The estimate (log perplexity, nats):

    log ppl(D) = log ppl_after[k]  +  sum over b in D \\ P_k of (log ppl_alone[b] - log dense_ppl)

where P_k = the first k blocks of the GSI order and k is the largest prefix contained in D
(ppl_after[0] = dense_ppl). Equivalently log dense + the sum of increments: the GSI increments
log ppl_after[i] - log ppl_after[i-1] of the prefix blocks (each measured given the earlier removals),
plus the one-shot increment of every other dropped block (measured alone, against the dense model).

* Exact (the measured number, up to float rounding) for every GSI prefix, including D = {} (dense)
  and D = every block in a `--steps all` file, and for every single block (one-shot).
* Otherwise an approximation: the blocks outside the prefix are assumed to add their one-shot
  damage independently of each other and of the prefix. Removals interact (docs/adapt.md: the
  second GSI step already departs from the one-shot order), so sets far from a GSI prefix are the
  least reliable; the controllers here drop mostly in GSI order, which keeps them near prefixes.
* A block whose perplexity is null in the file (the model diverged) makes the estimate infinite.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from adapt.importance import check_names


class Perplexity(Protocol):
    name: str

    def ppl(self, dropped: np.ndarray) -> float: ...

    def log_ppl(self, dropped: np.ndarray) -> float: ...


def _log(x: float | None) -> float:
    return math.inf if x is None else math.log(x)


class GsiPerplexity:
    """The GSI-file estimate above (the "trace proxy" of issue 7's evaluation)."""

    name = "estimate"

    def __init__(self, doc: dict[str, Any], names: Sequence[str]):
        check_names(doc, names)
        index = {b: i for i, b in enumerate(names)}
        n = len(names)
        self.log_dense = _log(doc["dense_ppl"])
        self.prefix = np.array([index[r["block"]] for r in doc["gsi"]], np.int64)
        self.log_after = np.array([self.log_dense] + [_log(r["ppl_after"]) for r in doc["gsi"]])
        self.one_shot_inc = np.empty(n)
        for r in doc["one_shot"]:
            self.one_shot_inc[index[r["block"]]] = _log(r["ppl_alone"]) - self.log_dense
        self._memo: dict[bytes, float] = {}

    def prefix_length(self, dropped: np.ndarray) -> int:
        """The largest k with the first k GSI blocks all in `dropped`."""
        inside = np.asarray(dropped, bool)[self.prefix]
        return int(np.argmin(inside)) if not inside.all() else len(self.prefix)

    def log_ppl(self, dropped: np.ndarray) -> float:
        d = np.asarray(dropped, bool)
        key = np.packbits(d).tobytes()
        if key not in self._memo:
            k = self.prefix_length(d)
            rest = d.copy()
            rest[self.prefix[:k]] = False
            self._memo[key] = float(self.log_after[k] + self.one_shot_inc[rest].sum())
        return self._memo[key]

    def ppl(self, dropped: np.ndarray) -> float:
        lp = self.log_ppl(dropped)
        return math.exp(lp) if lp < 700 else math.inf


class MeasuredPerplexity:
    """Perplexity measured by `measure(list of dropped-name lists) -> list of ppl`, memoised per set.

    `prefetch(masks)` measures many sets in one call (a real model measures them in one load)."""

    name = "real"

    def __init__(self, measure: Callable[[list[list[str]]], list[float]], names: Sequence[str]):
        self.measure, self.names = measure, tuple(names)
        self._memo: dict[bytes, float] = {}

    def _key(self, d: np.ndarray) -> bytes:
        return np.packbits(np.asarray(d, bool)).tobytes()

    def prefetch(self, masks: Sequence[np.ndarray]) -> None:
        todo, seen = [], set()
        for m in masks:
            k = self._key(m)
            if k not in self._memo and k not in seen:
                seen.add(k)
                todo.append(np.asarray(m, bool))
        if todo:
            values = self.measure([[self.names[i] for i in np.flatnonzero(m)] for m in todo])
            for m, v in zip(todo, values):
                self._memo[self._key(m)] = float(v)

    def ppl(self, dropped: np.ndarray) -> float:
        self.prefetch([dropped])
        return self._memo[self._key(dropped)]

    def log_ppl(self, dropped: np.ndarray) -> float:
        p = self.ppl(dropped)
        return math.log(p) if math.isfinite(p) and p > 0 else math.inf
