"""The OS page cache over an mmap of the model file: the baseline users run today (llama.cpp and
mlx-lm map the weights and let the kernel page them in).

Residency: one LRU over all layers (the kernel's page lists are global, not per layer), at expert
granularity (a routed expert is megabytes, thousands of pages touched together, so its pages age
together). Reads: a miss is not one read per expert issued in parallel but page faults taken by the
compute thread while it walks the expert's weights: each fault reads the kernel's read-around
window (Linux: 128 KiB, `read_ahead_kb`) synchronously, one after another (sim/moe/timing.py).
"""

from __future__ import annotations

from sim.moe.base import register
from sim.moe.policies.lru import LruCache


@register("page-cache")
class PageCache(LruCache):
    """Global LRU whose misses are served as sequential read-around page faults."""

    page_faults = True
    forced_scope = "global"
