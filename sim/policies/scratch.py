"""Reusable work arrays for the noisy predictor's draws.

A fresh NumPy array of more than a few hundred kB is mapped from the operating system and faulted
in page by page on first touch; the draws for one layer go through tens of MB of temporaries, so
allocating them afresh for every block costs about as much as the arithmetic. `work` hands out the
same memory each time a name is asked for again (one set per thread), so steady-state draws touch
no new pages.
"""

from __future__ import annotations

import threading

import numpy as np

_LOCAL = threading.local()


def work(name: str, shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """An uninitialised C-contiguous array of this shape and dtype: the same memory on every call
    with this name (in this thread), valid until the next such call. Never return it to a caller
    that keeps it: copy what must outlive the computation."""
    store: dict[str, np.ndarray] = _LOCAL.__dict__.setdefault("arrays", {})
    dt = np.dtype(dtype)
    n_bytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    buf = store.get(name)
    if buf is None or buf.nbytes < n_bytes:
        buf = store[name] = np.empty(max(n_bytes, 64), np.uint8)
    return buf[:n_bytes].view(dt).reshape(shape)
