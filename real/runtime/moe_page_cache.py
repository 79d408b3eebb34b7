"""The page-cache baseline executed: experts computed straight from an mmap of the expert store, missed
experts brought in by page faults, the cache held to the policy's capacity (times in seconds).

This is what llama.cpp and mlx-lm users run today: the weights mapped, the kernel paging them in. The
simulator's `page-cache` policy (sim/moe/page_cache.py) models it as one global LRU over experts whose
misses are read-around page faults taken one after another by the compute thread. Here the same
policy object decides (through ExpertExecutor.step, as for every policy), and:

* a miss is served by touching the expert's pages in order on the stepping thread (one byte per
  4 KiB page): every first touch is a page fault of the kernel's read-around window, synchronous, so
  the step waits for them, as the simulator assumes; the store's files are opened buffered and start
  cold (`posix_fadvise(DONTNEED)`), readahead is the kernel's (MADV_NORMAL);
* an eviction drops the expert's pages: `madvise(MADV_DONTNEED)` on the mapping, then
  `posix_fadvise(DONTNEED)` on the file range (Linux keeps no per-file page-cache limit short of a
  cgroup, so the process enforces the capacity itself; see real/runtime/mmap_baseline.py); pages the
  kernel read ahead into experts the cache does not hold are dropped after the step's faults, so the
  page cache holds what the policy holds (its read-ahead still costs the read time it took);
* compute reads the mapped pages in place (torch views of the mapping; no copy).

Bytes read from storage come from /proc/self/io (`read_bytes`, the whole process), measured per step.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import time
import warnings
from typing import Any

import numpy as np

from real.runtime.moe_executor import ExpertExecutor
from real.weights.expert_store import ExpertStore
from sim.moe.base import ExpertCache, Scope

PAGE_BYTES = mmap.PAGESIZE


def _read_bytes() -> int:
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class _Done:
    """A finished 'read' (faults already taken): the executor's future interface."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes

    def result(self) -> int:
        return self.nbytes


class PageCacheExecutor(ExpertExecutor):
    """ExpertExecutor whose misses are page faults of an mmap (module docstring)."""

    page_faults = True

    def __init__(self, store: ExpertStore, policy: ExpertCache, capacity: int, scope: Scope = "global", **kw: Any):
        self._fds = [os.open(store.file_path(m), os.O_RDONLY) for m in range(store.n_layers)]
        for fd in self._fds:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)             # start cold
        self._maps = [mmap.mmap(fd, 0, access=mmap.ACCESS_READ) for fd in self._fds]
        for mm in self._maps:
            mm.madvise(mmap.MADV_NORMAL)
        self._key_of_slot: dict[int, int] = {}
        kw.setdefault("threads", 1)
        super().__init__(store, policy, capacity, scope, **kw)

    @property
    def direct_io(self) -> bool:
        return False

    def _slot_rows(self, n: int) -> None:
        return None                                   # experts live in the mapping, not in slots

    def _span(self, key: int) -> tuple[int, int]:
        m, e = divmod(int(key), self.E)
        return m, e * self.stride

    def _load(self, keys: np.ndarray, slots: list[int]) -> tuple[list[Any], float]:
        t0 = time.perf_counter()
        before = _read_bytes()
        eb = self.store.manifest.expert_bytes
        for k, s in zip(keys, slots):
            m, off = self._span(k)
            pages = np.frombuffer(self._maps[m], np.uint8, count=eb, offset=off)[::PAGE_BYTES]
            int(pages.sum())                          # touch every page in order: the faults happen here
            self.slot_of[k] = s
            self._key_of_slot[s] = int(k)
        # pages the kernel read ahead into experts the cache does not hold are dropped, so DRAM holds
        # what the policy holds (the capacity is in experts): the layer's other non-resident experts
        spill = {int(k) // self.E for k in keys}
        held = set(int(k) for k in keys)
        self._drop(np.array([k for m in spill for k in range(m * self.E, (m + 1) * self.E)
                             if not self.resident[k] and k not in held], np.int64))
        return [_Done(_read_bytes() - before)], t0

    def _views_of(self, slot: int) -> tuple[Any, Any, Any]:
        import torch

        m, off = self._span(self._key_of_slot[slot])
        man = self.store.manifest
        d, F = man.d_model, man.d_expert_ff
        elem = np.dtype({"fp32": np.float32, "fp16": np.float16, "bf16": np.uint16}[self.store.dtype])
        raw = np.frombuffer(self._maps[m], elem, count=3 * d * F, offset=off)
        with warnings.catch_warnings():               # a read-only mapping: torch warns, compute only reads it
            warnings.simplefilter("ignore", UserWarning)
            t = torch.from_numpy(raw)
        if self.store.dtype == "bf16":
            t = t.view(torch.bfloat16)
        return t[: F * d].view(F, d), t[F * d: 2 * F * d].view(F, d), t[2 * F * d:].view(d, F)

    def _drop(self, keys: np.ndarray) -> None:
        for k in np.asarray(keys, np.int64):
            m, off = self._span(k)
            self._maps[m].madvise(mmap.MADV_DONTNEED, off, self.stride)
            os.posix_fadvise(self._fds[m], off, self.stride, os.POSIX_FADV_DONTNEED)

    def close(self) -> None:
        super().close()
        for mm in self._maps:
            with contextlib.suppress(BufferError):    # a torch view still holds it: dropped with it
                mm.close()
        for fd in self._fds:
            os.close(fd)
        self._maps, self._fds = [], []


def executor_for(store: ExpertStore, policy: ExpertCache, capacity: int, scope: Scope = "layer",
                 **kw: Any) -> ExpertExecutor:
    """The executor that runs `policy`: page faults of an mmap for the page-cache baseline, the
    direct-I/O reader for every other policy."""
    cls = PageCacheExecutor if policy.page_faults else ExpertExecutor
    return cls(store, policy, capacity, scope, **kw)
