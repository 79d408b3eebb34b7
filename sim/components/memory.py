"""Memory: the DRAM budget (fixed or a timeline), what must stay resident, the KV cache, and the
share left for neuron caches. Bytes throughout.

Accounting at every step (the `dram_bytes` of each record, an upper bound over the step):

    fixed     resident weights: non-FFN weights (attention, norms, embeddings, lm_head) unless
              streamed, the static FFN neurons (hybrid / dense / selective), predictor weights,
              and a streaming buffer for one non-FFN tensor when those are streamed
    kv        KV cache: entries resident during the step x kv_bytes_per_token
    dynamic   neuron caches: sum over layers of max(size before, size after the step) plus the
              largest extra any one layer holds while it computes (its demand reads, its
              prefetch for the next step, a streamed layer's neurons)

The cache share per layer for step s is floor((budget - fixed - kv_s) / (layers x neuron bytes)):
equal, preallocated per-layer matrices as in LLM in a flash (`layer_caps`; a `CacheShares` from
sim/policies/cache_shares.py, set by the engine for `memory.cache_split`, splits the same free rows
unequally). "Neuron bytes" (`neuron_bytes`) is the
DRAM one cached neuron takes, from the layout (`BundlingLayout.dram_bytes_per_neuron`): the bundle,
rounded up to `bundling.align_bytes` when set, as the real cache's rows are (static neurons count at
the same size). Activations and the runtime's own buffers (MBs) are not counted.

Block pruning (sim/blocks.py; built by sim.engine._memory_model): fixed loses the dropped MHA blocks'
attention weights and norms and the dropped FFN blocks' norms, biases, static neurons and predictor;
kv counts only kept MHA layers; "layers" in the cache share are the kept FFN layers only (a dropped
FFN layer has no cache matrix, so its share goes to the others).

Budget timeline file (co-running applications taking and releasing memory): JSON
`{"points": [{"t_s": 0, "available_bytes": "6GiB"}, ...]}` (or a list of [t_s, bytes] pairs), or
CSV with the header `t_s,available_bytes`. Times in seconds of simulated time, non-decreasing;
sizes in bytes or with units. Before the first point the run's static budget applies.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from devices.errors import BudgetError, FlashsimError
from devices.safe_load import parse_json, read_text_file
from devices.units import format_bytes, parse_bytes
from sim.policies.cache_shares import CacheShares


@dataclass(frozen=True)
class BudgetTimeline:
    """Available DRAM over simulated time: a step function."""

    t_s: tuple[float, ...]
    available_bytes: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.t_s) != len(self.available_bytes) or not self.t_s:
            raise ValueError("a budget timeline needs at least one (t_s, available_bytes) point")
        if not all(math.isfinite(t) for t in self.t_s):     # NaN compares false: it would pass the order check
            raise ValueError(f"budget timeline times must be finite seconds, got {[t for t in self.t_s if not math.isfinite(t)][0]}")
        if any(t < 0 for t in self.t_s) or any(b < a for a, b in zip(self.t_s, self.t_s[1:])):
            raise ValueError("budget timeline times must be >= 0 and non-decreasing")
        if any(b < 0 for b in self.available_bytes):
            raise ValueError("budget timeline sizes must be >= 0")

    def at(self, t_s: float, default: int) -> int:
        i = int(np.searchsorted(np.asarray(self.t_s), t_s, side="right")) - 1
        return default if i < 0 else int(self.available_bytes[i])

    def minimum(self, default: int) -> int:
        first = self.t_s[0]
        vals = list(self.available_bytes) + ([default] if first > 0 else [])
        return int(min(vals))

    def to_list(self) -> list[list[float]]:
        return [[t, b] for t, b in zip(self.t_s, self.available_bytes)]


def load_budget_timeline(path: str | Path) -> BudgetTimeline:
    """Read a JSON or CSV timeline; FlashsimError names the file, line or field."""
    path = Path(path)
    if not path.exists():
        raise FlashsimError(f"{path}: budget timeline file not found")
    text = read_text_file(path, "budget timeline (JSON or CSV)")
    points: list[tuple[float, int]] = []
    if path.suffix.lower() == ".csv":
        rows = list(csv.reader(text.splitlines()))
        if not rows or [c.strip() for c in rows[0]] != ["t_s", "available_bytes"]:
            raise FlashsimError(f"{path}: line 1: the header must be 't_s,available_bytes'")
        for i, row in enumerate(rows[1:], start=2):
            if not row or not "".join(row).strip():
                continue
            if len(row) != 2:
                raise FlashsimError(f"{path}: line {i}: expected 2 values, got {len(row)}")
            points.append(_point(path, f"line {i}", row[0], row[1]))
    else:
        data = parse_json(text, str(path))
        items = data.get("points") if isinstance(data, dict) else data
        if isinstance(data, dict) and set(data) - {"points", "description"}:
            raise FlashsimError(f"{path}: unknown key {sorted(set(data) - {'points', 'description'})[0]!r}; "
                                "use 'points'")
        if not isinstance(items, list):
            raise FlashsimError(f"{path}: expected a list of points or {{'points': [...]}}")
        for i, it in enumerate(items):
            where = f"points[{i}]"
            if isinstance(it, dict):
                if set(it) != {"t_s", "available_bytes"}:
                    raise FlashsimError(f"{path}: {where}: keys must be 't_s' and 'available_bytes'")
                points.append(_point(path, where, it["t_s"], it["available_bytes"]))
            elif isinstance(it, (list, tuple)) and len(it) == 2:
                points.append(_point(path, where, it[0], it[1]))
            else:
                raise FlashsimError(f"{path}: {where}: expected {{t_s, available_bytes}} or [t_s, bytes]")
    if not points:
        raise FlashsimError(f"{path}: the timeline has no points")
    try:
        return BudgetTimeline(tuple(p[0] for p in points), tuple(p[1] for p in points))
    except ValueError as e:
        raise FlashsimError(f"{path}: {e}") from None


def _point(path: Path, where: str, t: object, b: object) -> tuple[float, int]:
    try:
        t_s = float(t)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise FlashsimError(f"{path}: {where}: t_s {t!r} is not a number of seconds") from None
    if not math.isfinite(t_s) or t_s < 0:
        raise FlashsimError(f"{path}: {where}: t_s {t!r} must be a finite number of seconds >= 0")
    return t_s, parse_bytes(b if not isinstance(b, str) else b.strip(), f"{path}: {where}: available_bytes", unit="bytes")  # type: ignore[arg-type]


class MemoryModel:
    """Fixed resident bytes, KV per step, and the cache share left by a budget. `n_layers`: the layers
    that hold a neuron cache (all FFN layers, or the kept ones when blocks are pruned);
    `neuron_bytes`: DRAM per cached neuron (the layout's `dram_bytes_per_neuron`)."""

    def __init__(self, parts: dict[str, int], kv_bytes: np.ndarray, n_layers: int, neuron_bytes: int):
        self.parts = {k: int(v) for k, v in parts.items() if v}
        self.fixed_bytes = int(sum(self.parts.values()))
        self.kv_bytes = np.asarray(kv_bytes, np.int64)
        self.n_layers, self.neuron_bytes = n_layers, int(neuron_bytes)
        self.shares: CacheShares | None = None     # None: equal shares (cap_neurons for every layer)

    def cache_bytes(self, budget_bytes: np.ndarray | int, start: int, stop: int) -> np.ndarray:
        return np.asarray(budget_bytes, np.int64) - self.fixed_bytes - self.kv_bytes[start:stop]

    def cap_neurons(self, budget_bytes: np.ndarray | int, start: int, stop: int) -> np.ndarray:
        """Per-layer cache share in neurons for steps [start, stop] (one more than the range: what a
        cache keeps at the end of its last step must already fit the next step, whose KV cache is
        larger; the run's last step is repeated)."""
        idx = np.minimum(np.arange(start, stop + 1), len(self.kv_bytes) - 1)
        free = np.asarray(budget_bytes, np.int64) - self.fixed_bytes - self.kv_bytes[idx]
        return np.maximum(free, 0) // (self.n_layers * self.neuron_bytes)

    def free_rows(self, budget_bytes: int) -> int:
        """Cache rows (all layers together) left at the run's largest KV cache: the reference size
        a `CacheShares` split is computed for."""
        kv = int(self.kv_bytes.max()) if len(self.kv_bytes) else 0
        return max(int(budget_bytes) - self.fixed_bytes - kv, 0) // self.neuron_bytes

    def layer_caps(self, budget_bytes: np.ndarray | int, start: int, stop: int, n_layers: int) -> np.ndarray:
        """int64 [stop - start + 1, n_layers]: each layer's cache share in neurons for steps [start, stop]
        (as `cap_neurons`). Without `shares` every column is `cap_neurons` exactly (equal split)."""
        if self.shares is None:
            cap = self.cap_neurons(budget_bytes, start, stop)
            return np.repeat(cap[:, None], n_layers, axis=1)
        idx = np.minimum(np.arange(start, stop + 1), len(self.kv_bytes) - 1)
        free = np.asarray(budget_bytes, np.int64) - self.fixed_bytes - self.kv_bytes[idx]
        return self.shares.split(np.maximum(free, 0) // self.neuron_bytes)

    def check_fits(self, budget_bytes: int, when: str = "") -> None:
        """FlashsimError when the fixed weights plus the largest KV cache exceed the budget."""
        kv = int(self.kv_bytes.max()) if len(self.kv_bytes) else 0
        need = self.fixed_bytes + kv
        if need > budget_bytes:
            items = [f"{k.replace('_', ' ')} {format_bytes(v)}" for k, v in self.parts.items()]
            if kv:
                items.append(f"KV cache up to {format_bytes(kv)}")
            short = need - budget_bytes
            raise BudgetError(
                f"DRAM budget {format_bytes(budget_bytes)}{when} is too small: what must stay resident "
                f"({' + '.join(items)}) needs {format_bytes(need)}, {format_bytes(short)} ({short:,} bytes) "
                "more; raise --dram-budget, stream more (memory.stream_non_ffn=true), quantize, or shorten "
                "the workload")
