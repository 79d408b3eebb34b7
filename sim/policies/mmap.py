"""`mmap`: the OS demand-paging baseline (llama.cpp with mmap): the whole model file is mapped, the
page cache holds as much of it as the budget allows, pages are read on first touch with read-ahead,
and compute is dense (every weight touched every token).

File layout: embedding, then per layer its attention (+ norms) and its FFN matrices, then lm_head
(tied models reuse the embedding), each starting on a read-ahead boundary. The page cache is an LRU
of capacity (budget - KV cache) bytes, tracked at the granularity of read-ahead windows
(`readahead_bytes`, Linux's default read_ahead_kb is 128 KiB): dense compute touches every page of a
window together, so window-granular LRU sees the same hits and misses as page-granular LRU.
Accesses come in groups (a layer's attention, its FFN, the lm_head, the token's embedding rows) in
file order; within a group hits are decided before the group's own misses evict anything (an
approximation only when a single group exceeds the cache).

A miss costs one read of `readahead_bytes` plus `fault_overhead_s`; misses of a group are issued
together with `in_flight` outstanding (several compute threads fault in parallel, and sequential
read-ahead keeps one asynchronous window ahead of each). With a model larger than the cache, LRU
under a cyclic scan misses on every window: each token re-reads the model (the well-known mmap
collapse). With room to spare, the first token loads everything and later tokens hit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sim.params import check, param
from sim.policies.base import CacheSteps, Residency
from sim.policies.registry import RESIDENCY

if TYPE_CHECKING:
    from devices.curves import ReadCurve


class BlockLRU:
    """Exact LRU over integer block ids with batched accesses (amortised O(accesses)).

    Every access appends (block, stamp) to a log; a block's latest stamp is its recency, so the
    cached blocks in LRU order are the log entries still current. Eviction walks the log from its
    head, skipping stale entries; the log is compacted when it fills."""

    def __init__(self, n_blocks: int):
        self.stamp = np.full(n_blocks, -1, np.int64)
        self.clock = 0
        self.cached = 0
        self.log_b = np.empty(max(1024, 2 * n_blocks), np.int64)
        self.log_s = np.empty_like(self.log_b)
        self.head = self.tail = 0

    def access(self, blocks: np.ndarray, cap_blocks: int) -> int:
        """Touch `blocks` (in order); returns the number of misses. Evicts down to cap_blocks."""
        n = len(blocks)
        if n == 0:
            return 0
        st = self.clock + np.arange(n, dtype=np.int64)
        self.clock += n
        misses = int(np.count_nonzero(self.stamp[blocks] < 0))
        self.stamp[blocks] = st
        self._append(blocks, st)
        self.cached += misses
        self.evict_to(cap_blocks)
        return misses

    def _append(self, b: np.ndarray, s: np.ndarray) -> None:
        n = len(b)
        if self.tail + n > len(self.log_b):
            live = slice(self.head, self.tail)
            valid = self.stamp[self.log_b[live]] == self.log_s[live]
            kb, ks = self.log_b[live][valid], self.log_s[live][valid]
            size = max(len(self.log_b), 2 * (len(kb) + n))
            self.log_b, self.log_s = np.empty(size, np.int64), np.empty(size, np.int64)
            self.log_b[: len(kb)], self.log_s[: len(kb)] = kb, ks
            self.head, self.tail = 0, len(kb)
        self.log_b[self.tail: self.tail + n] = b
        self.log_s[self.tail: self.tail + n] = s
        self.tail += n

    def evict_to(self, cap_blocks: int) -> None:
        cap_blocks = max(0, int(cap_blocks))
        while self.cached > cap_blocks and self.head < self.tail:
            need = self.cached - cap_blocks
            hi = min(self.tail, self.head + max(2 * need, 1024))
            b, s = self.log_b[self.head: hi], self.log_s[self.head: hi]
            valid = np.flatnonzero(self.stamp[b] == s)
            take = valid[:need]
            if len(take):
                self.stamp[b[take]] = -1
                self.cached -= len(take)
            self.head = self.head + int(take[-1]) + 1 if len(take) == need else hi


@RESIDENCY.register("mmap")
class MmapResidency(Residency):
    """Page-cache LRU over the model file with read-ahead; dense compute."""

    page_granular = True

    @dataclass(frozen=True)
    class Params:
        readahead_bytes: int = param(128 << 10, "read-ahead window: bytes read per page fault "
                                                "(Linux read_ahead_kb default: 128 KiB)", unit="bytes")
        in_flight: int = param(8, "faults outstanding at once (estimate: 4 compute threads, each with its "
                                  "faulting window and one asynchronous read-ahead window)")
        fault_overhead_s: float = param(5e-6, "kernel time per fault beyond the I/O (estimate: allocating, "
                                              "inserting and mapping one window's pages)")

        def __post_init__(self) -> None:
            check(self.readahead_bytes >= 4096 and self.readahead_bytes % 4096 == 0,
                  f"readahead_bytes must be a multiple of 4096, got {self.readahead_bytes}")
            check(self.in_flight >= 1, f"in_flight must be >= 1, got {self.in_flight}")
            check(self.fault_overhead_s >= 0, f"fault_overhead_s must be >= 0, got {self.fault_overhead_s}")

    def bind(self, ctx) -> None:  # type: ignore[no-untyped-def]
        super().bind(ctx)
        spec, ra = ctx.spec, self.params.readahead_bytes
        blocks = lambda n: -(-int(n) // ra)  # noqa: E731
        nxt = 0

        def take(n_bytes: int) -> np.ndarray:
            nonlocal nxt
            r = np.arange(nxt, nxt + blocks(n_bytes), dtype=np.int64)
            nxt += len(r)
            return r

        self.emb = take(spec.embedding_bytes)
        self.attn = [take(spec.attn_bytes_per_layer + spec.norm_bytes_per_layer) for _ in range(spec.n_layers)]
        self.ffn = [take(spec.ffn_bytes_per_layer) for _ in range(spec.n_layers)]
        self.head = self.emb if spec.tied_embeddings else take(spec.lm_head_bytes + spec.final_norm_bytes)
        self.n_blocks = nxt
        self.row_bytes = spec.d_model * spec.dtype_bytes
        self.reset()

    def reset(self) -> None:
        self.state = {"lru": BlockLRU(getattr(self, "n_blocks", 1))}

    def advance(self, layer, steps, computed, next_hint, cap_neurons) -> CacheSteps:  # type: ignore[no-untyped-def]
        raise NotImplementedError("mmap is page-granular: the planner calls advance_pages")

    def on_budget_change(self, cap_neurons: int) -> np.ndarray:
        return np.zeros(self.ctx.n_layers, np.int64)

    def dynamic_bytes(self, neuron_bytes: int | None = None) -> int:
        """Bytes of the page cache (its read-ahead windows; `neuron_bytes` does not apply)."""
        return self.state["lru"].cached * self.params.readahead_bytes

    def shrink_bytes(self, cap_bytes: int) -> None:
        """Budget drop: evict least-recently-used windows down to cap_bytes."""
        self.state["lru"].evict_to(cap_bytes // self.params.readahead_bytes)

    def advance_pages(self, start: int, stop: int, cap_bytes: np.ndarray) -> dict[str, np.ndarray]:
        """Misses (read-ahead windows) per step: attn/ffn [S, L], head [S]; cached bytes [S]."""
        lru: BlockLRU = self.state["lru"]
        view, L, ra = self.ctx.view, self.ctx.n_layers, self.params.readahead_bytes
        S = stop - start
        out = {"attn": np.zeros((S, L), np.int64), "ffn": np.zeros((S, L), np.int64),
               "head": np.zeros(S, np.int64), "ffn_hit_neurons": np.zeros((S, L), np.int64),
               "cached_bytes": np.zeros(S, np.int64)}
        token_ids = np.asarray(view.trace.token_ids)
        N = self.ctx.n_neurons
        for i in range(S):
            s = start + i
            cap = int(max(cap_bytes[i], 0) // ra)
            lru.evict_to(cap)
            pos, _ = view.steps.token_positions(s, s + 1)
            # synthetic traces carry no token ids (-1): their lookups are charged to row 0
            ids = np.clip(token_ids[pos].astype(np.int64), 0, self.ctx.spec.vocab_size - 1)
            rows = np.unique(ids * int(np.ceil(self.row_bytes)) // ra)
            emb_blocks = self.emb[np.minimum(rows, len(self.emb) - 1)]
            miss = lru.access(emb_blocks, cap)
            peak = lru.cached
            for layer in range(L):
                out["attn"][i, layer] = lru.access(self.attn[layer], cap)
                m = lru.access(self.ffn[layer], cap)
                out["ffn"][i, layer] = m
                out["ffn_hit_neurons"][i, layer] = int(round(N * (1 - m / len(self.ffn[layer]))))
                peak = max(peak, lru.cached)
            out["head"][i] = lru.access(self.head, cap) + miss
            out["cached_bytes"][i] = max(peak, lru.cached) * ra
        return out

    def miss_cost(self, misses: np.ndarray, curve: ReadCurve) -> tuple[np.ndarray, np.ndarray]:
        """(seconds, bytes) to serve `misses` read-ahead windows issued together."""
        ra, q_max = self.params.readahead_bytes, self.params.in_flight
        m = np.asarray(misses, np.float64)
        q = np.clip(m, 1, q_max).astype(np.int64)
        inv = np.array([0.0] + [1.0 / curve.bytes_per_s(ra, k) for k in range(1, q_max + 1)])
        t = m * ra * inv[q] + m * self.params.fault_overhead_s
        return np.where(m > 0, t, 0.0), (m * ra).astype(np.int64)
