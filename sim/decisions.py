"""A run's decisions as counts (`LayerOutcome` per layer and step range, `DecisionMemo` per run),
and the quality sums that runs computing the same sets share (`QualityMemo`).

The policies decide sets; pricing those sets on a device is the rest of a run. A run that repeats
another's decisions on a device with other speed numbers (the datasheet-peak bound beside every
achievable figure) prices the recorded outcomes instead of asking the policies again
(sim/step_plans.py records and replays them; sim/set_cache.py keys and bounds the memos).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field, fields

import numpy as np


@dataclass
class LayerOutcome:
    """What the policies decided for steps [a0, b0) of one layer, as the counts pricing needs: reads
    per chunk size (demand; prefetch for the next step, None when nothing is prefetched), set sizes,
    cache sizes, rows moved (None without a managed cache) and the quality sums. No time and no
    device number: the same outcome is priced on any device."""

    dem_counts: np.ndarray
    pf_counts: np.ndarray | None
    computed: np.ndarray
    needed: np.ndarray
    correct: np.ndarray
    hits: np.ndarray
    before: np.ndarray
    after: np.ndarray
    peak: np.ndarray
    moved: np.ndarray | None
    quality: tuple[np.ndarray, ...]


@dataclass
class DecisionMemo:
    """One run's decisions: a LayerOutcome per (layer, a0, b0) (the page path: its misses and quality
    per (PAGES, a0, b0)) and the notes its policies wrote while planning. `plan_all` fills it and marks
    it complete; a planner given a complete memo prices it instead of asking the policies again.
    Valid for runs whose decisions are the same: sim.set_cache.SetAlgebraCache keys it (same trace view,
    model, configuration, budget and device memory; the device's speed numbers are not decisions)."""

    outcomes: dict[tuple, object] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    complete: bool = False
    failed: bool = False              # its run raised: never complete, dropped by the cache
    _nbytes: int | None = None

    def nbytes(self) -> int:
        """Bytes of its arrays (counted once the memo is complete; an incomplete one is changing)."""
        if self._nbytes is not None:
            return self._nbytes
        n = sum(_nbytes(o) for o in self.outcomes.values())
        if self.complete:
            self._nbytes = n
        return n


def _nbytes(x: object) -> int:
    """Bytes of the arrays inside an outcome (a LayerOutcome, or the page path's dict and tuples)."""
    if isinstance(x, np.ndarray):
        return x.nbytes
    if isinstance(x, (tuple, list)):
        return sum(_nbytes(y) for y in x)
    if isinstance(x, dict):
        return sum(_nbytes(y) for y in x.values())
    if isinstance(x, LayerOutcome):
        return sum(_nbytes(getattr(x, f.name)) for f in fields(x))
    return 0


PAGES = "pages"   # the outcome key of the page path: (PAGES, a0, b0)


class QualityMemo:
    """Quality sums per (layer, start, stop) of one computed-set configuration (`by_config`), falling
    back to the view's sums keyed by the computed sets' content (`by_content`, a SHA-256 digest of
    the words: the fastest of hashlib's digests where the CPU has SHA instructions), so that any
    two runs computing the same sets price their quality once."""

    def __init__(self, by_config: dict, by_content: dict):
        self.by_config, self.by_content = by_config, by_content

    def get_or_compute(self, key: tuple, computed: np.ndarray, compute: Callable[[], tuple]) -> tuple:
        """The sums of `computed` (words) at `key`, from either memo or from `compute()` (then kept)."""
        q = self.by_config.get(key)
        if q is not None:
            return q
        words = np.ascontiguousarray(computed)
        content = (*key, words.shape, hashlib.sha256(words.data).digest())
        q = self.by_content.get(content)
        if q is None:
            q = self.by_content[content] = compute()
        self.by_config[key] = q
        return q
