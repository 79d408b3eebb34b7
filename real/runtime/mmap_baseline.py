"""The OS demand-paging baseline, measured: dense FFN compute over memory-mapped store files with
the page cache held to a budget (bytes; times in seconds).

This is what llama.cpp-style runtimes do: mmap the weights and let page faults bring them in. The
FFN of every layer is computed densely (all N neurons) straight from the mapping, in the store's
unbundled layout (the plain gate / up / down matrices) when present, else as strided views of the
bundles. After each layer the baseline enforces `budget_bytes` with page-granular LRU: the pages of
the layer just computed become most recent, and while more than the budget is resident the least
recently used pages are dropped (whole layers first, a prefix of the oldest layer last) with
`madvise(MADV_DONTNEED)` on the mapping and then `posix_fadvise(POSIX_FADV_DONTNEED)` on the file.

What Linux lets a process control, and what it does not:
* There is no per-file or per-process page-cache limit short of a cgroup-v2 `memory.max` (which
  caps all of the group's memory and needs a delegated cgroup); so the budget is enforced by this
  process evicting pages itself, between layers. Within a layer the cache can exceed the budget
  by up to one layer plus the kernel's readahead window.
* `posix_fadvise(DONTNEED)` drops only clean pages that no process maps; hence the MADV_DONTNEED
  first (it unmaps our PTEs; for file pages it does not free them). Dirty pages are not dropped:
  stores are fsync'ed when written.
* Readahead on faults is the kernel's (`read_ahead_kb` of the device, root-only to change);
  `advice` sets MADV_NORMAL / MADV_RANDOM / MADV_SEQUENTIAL for the mapping, nothing finer.
* `mincore()` reports which pages of a mapping are resident: the resident bytes in the records
  are measured with it, not assumed. Major faults come from getrusage, bytes read from storage
  from /proc/self/io (`read_bytes`), both process-wide.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import resource
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from devices.errors import FlashsimError
from real.weights.dtypes import STORAGE_NUMPY
from real.weights.store import WeightStore

PAGE_BYTES = mmap.PAGESIZE
ADVICE = {"normal": mmap.MADV_NORMAL, "random": mmap.MADV_RANDOM, "sequential": mmap.MADV_SEQUENTIAL}
_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


@dataclass(frozen=True)
class MmapTokenRecord:
    token: int
    t_start_s: float
    t_end_s: float
    seconds: float
    major_faults: int
    storage_read_bytes: int | None     # None when /proc/self/io is unavailable
    evicted_bytes: int                 # dropped by the budget enforcement during this token
    resident_bytes: int                # measured with mincore after the token
    tracked_resident_bytes: int        # the LRU's own accounting after the token

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class MmapFfnBaseline:
    """Dense FFN over mmapped weights, page cache capped at `budget_bytes` (>= 0).

    `framework`: "torch" (any dtype), "numpy" (fp32/fp16; fp16 GEMV in NumPy is slow) or "auto".
    Raises FlashsimError for a bf16 store without torch, ValueError for a negative budget.
    """

    def __init__(self, store: WeightStore, budget_bytes: int, *, layout: str | None = None,
                 advice: str = "normal", framework: str = "auto"):
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
        self.store, self.budget_bytes = store, int(budget_bytes)
        self.layout = layout or ("unbundled" if "unbundled" in store.layouts else "bundled")
        self.framework = _framework(framework, store.dtype)
        info = store.layout(self.layout)
        self._maps: dict[str, mmap.mmap] = {}
        self._fds: dict[str, int] = {}
        self.views: list[list[Any]] = []        # [layer][segment] -> [N, d] strided matrix
        self._ranges: list[tuple[str, int, int]] = []   # layer -> (file, first page, n pages)
        for layer in range(store.n_layers):
            e = store.entry(layer, self.layout)
            mm = self._map(e.file, advice)
            self.views.append([self._view(mm, e, info, k) for k in range(len(store.segments))])
            layer_bytes = info.region_bytes * info.regions_per_layer
            self._ranges.append((e.file, e.offset_bytes // PAGE_BYTES, -(-layer_bytes // PAGE_BYTES)))
        self._lru: OrderedDict[int, int] = OrderedDict()  # layer -> first resident page (prefix evicted)
        self._evicted_pages = 0

    # ---- compute -------------------------------------------------------------------------------------
    def ffn(self, layer: int, x: np.ndarray, act: Callable[[Any], Any] | None = None) -> np.ndarray:
        """y = down(act(gate x) * up x) (gated) or down(act(up x)), fp32 in and out; then the
        layer's pages become most recent and the budget is enforced."""
        mats = self.views[layer]
        kind = self.store.spec.ffn_kind
        if self.framework == "torch":
            y = _ffn_torch(mats, x, kind, self.store.dtype, act)
        else:
            y = _ffn_numpy(mats, x, kind, act)
        self._touch(layer)
        return y

    def run(self, n_tokens: int, seed: int, cold: bool = True) -> list[MmapTokenRecord]:
        """Shape-mode driver: `n_tokens` tokens through every layer's FFN, chained (the output,
        RMS-normalised, feeds the next layer), starting from a seeded random vector."""
        rng = np.random.default_rng(seed)
        if cold:
            self.evict_all()
        records = []
        t0 = time.perf_counter()
        for token in range(n_tokens):
            x = rng.standard_normal(self.store.d_model, dtype=np.float32)
            flt0, io0, ev0 = _major_faults(), _read_bytes(), self._evicted_pages
            ts = time.perf_counter()
            for layer in range(self.store.n_layers):
                y = self.ffn(layer, x)
                x = y / np.float32(np.sqrt(np.mean(y * y)) + 1e-6)
            te = time.perf_counter()
            io1 = _read_bytes()
            records.append(MmapTokenRecord(
                token=token, t_start_s=ts - t0, t_end_s=te - t0, seconds=te - ts,
                major_faults=_major_faults() - flt0,
                storage_read_bytes=None if io0 is None or io1 is None else io1 - io0,
                evicted_bytes=(self._evicted_pages - ev0) * PAGE_BYTES,
                resident_bytes=self.resident_bytes(), tracked_resident_bytes=self.tracked_resident_bytes))
        return records

    # ---- page-cache accounting ------------------------------------------------------------------------
    @property
    def tracked_resident_bytes(self) -> int:
        return sum(self._ranges[lay][2] - lo for lay, lo in self._lru.items()) * PAGE_BYTES

    def resident_bytes(self) -> int:
        """Measured: pages of the FFN mappings that are in the page cache (mincore)."""
        total = 0
        for name, mm in self._maps.items():
            n_pages = -(-len(mm) // PAGE_BYTES)
            vec = (ctypes.c_ubyte * n_pages)()
            addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
            if _libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(len(mm)), vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore failed on {name}")
            total += int(np.count_nonzero(np.frombuffer(vec, np.uint8) & 1))
        return total * PAGE_BYTES

    def evict_all(self) -> None:
        """Drop every FFN page from the page cache (start cold)."""
        for layer in range(len(self._ranges)):
            self._evict(layer, 0, self._ranges[layer][2])
        self._lru.clear()

    def _touch(self, layer: int) -> None:
        self._lru.pop(layer, None)
        self._lru[layer] = 0
        over = -(-(self.tracked_resident_bytes - self.budget_bytes) // PAGE_BYTES)
        while over > 0:
            victim, lo = next(iter(self._lru.items()))
            n_pages = self._ranges[victim][2]
            take = min(over, n_pages - lo)
            self._evict(victim, lo, take)
            over -= take
            if lo + take >= n_pages:
                del self._lru[victim]
            else:
                self._lru[victim] = lo + take

    def _evict(self, layer: int, first: int, n_pages: int) -> None:
        name, page0, _ = self._ranges[layer]
        start = (page0 + first) * PAGE_BYTES
        length = min(n_pages * PAGE_BYTES, len(self._maps[name]) - start)
        if length <= 0:
            return
        self._maps[name].madvise(mmap.MADV_DONTNEED, start, length)
        os.posix_fadvise(self._fds[name], start, length, os.POSIX_FADV_DONTNEED)
        self._evicted_pages += -(-length // PAGE_BYTES)

    # ---- mapping ----------------------------------------------------------------------------------------
    def _map(self, name: str, advice: str) -> mmap.mmap:
        if name not in self._maps:
            path = self.store.path / name
            try:
                fd = os.open(path, os.O_RDONLY)
                os.fsync(fd)  # dirty pages cannot be dropped: make sure there are none
                # Private read mapping: pages come from the page cache and are never written.
                mm = mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            except OSError as e:
                raise FlashsimError(f"{path}: cannot map ({e.strerror})") from None
            if advice not in ADVICE:
                raise FlashsimError(f"--advice {advice}: choose {', '.join(ADVICE)}")
            mm.madvise(ADVICE[advice])
            self._fds[name], self._maps[name] = fd, mm
        return self._maps[name]

    def _view(self, mm: mmap.mmap, entry: Any, info: Any, k: int) -> Any:
        st, dt = self.store, STORAGE_NUMPY[self.store.dtype]
        if self.layout == "unbundled":
            base = entry.region_offsets_bytes[k]
        else:
            base = entry.offset_bytes + k * st.segment_bytes
        a = np.ndarray((st.n_neurons, st.d_model), dtype=dt, buffer=mm, offset=base,
                       strides=(info.stride_bytes, dt.itemsize))
        if self.framework == "torch":
            import torch

            t = torch.from_numpy(a)
            return t.view(torch.bfloat16) if st.dtype == "bf16" else t
        return a

    def close(self) -> None:
        self.views = []
        for mm in self._maps.values():
            mm.close()
        for fd in self._fds.values():
            os.close(fd)
        self._maps, self._fds = {}, {}

    def __enter__(self) -> MmapFfnBaseline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _framework(choice: str, dtype: str) -> str:
    if choice not in ("auto", "torch", "numpy"):
        raise FlashsimError(f"framework {choice!r}: choose auto, torch or numpy")
    if choice == "numpy" and dtype == "bf16":
        raise FlashsimError("a bf16 store needs torch for compute (NumPy has no bfloat16)")
    if choice in ("auto", "torch"):
        try:
            import torch  # noqa: F401
        except ImportError:
            if choice == "torch" or dtype == "bf16":
                raise FlashsimError("torch is not installed; install flashsim[real] (needed for bf16 stores)") from None
            return "numpy"
        return "torch"
    return "numpy"


def _act_numpy(kind: str, g: np.ndarray) -> np.ndarray:
    if kind in ("swiglu",):
        return g / (1 + np.exp(-g))
    if kind == "relu":
        return np.maximum(g, 0)
    # gelu / geglu: the tanh approximation (GPT-2's gelu_new)
    return 0.5 * g * (1 + np.tanh(0.7978845608028654 * (g + 0.044715 * g ** 3)))


def _ffn_numpy(mats: list[np.ndarray], x: np.ndarray, kind: str, act: Callable | None) -> np.ndarray:
    xw = x.astype(mats[0].dtype, copy=False)
    f = act or (lambda g: _act_numpy(kind, g))
    if len(mats) == 3:
        h = f((mats[0] @ xw).astype(np.float32)) * (mats[1] @ xw).astype(np.float32)
    else:
        h = f((mats[0] @ xw).astype(np.float32))
    return (h.astype(mats[-1].dtype) @ mats[-1]).astype(np.float32)


def _ffn_torch(mats: list[Any], x: np.ndarray, kind: str, dtype: str, act: Callable | None) -> np.ndarray:
    import torch
    import torch.nn.functional as F

    xt = torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(mats[0].dtype)
    if act is None:
        act = {"swiglu": F.silu, "relu": F.relu}.get(kind, lambda g: F.gelu(g, approximate="tanh"))
    with torch.no_grad():
        g = act(torch.mv(mats[0], xt))
        h = g * torch.mv(mats[1], xt) if len(mats) == 3 else g
        y = torch.mv(mats[-1].t(), h.to(mats[-1].dtype))
    return y.float().numpy()


def _major_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_majflt


def _read_bytes() -> int | None:
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None
