"""The C allocator's settings for a flashsim process: large NumPy temporaries are reused from the
heap instead of being mapped from the kernel anew.

glibc's malloc serves a request above its mmap threshold (128 KiB at start, raised as such blocks
are freed, up to 32 MiB) with fresh pages from the kernel and unmaps them on free. The simulator
allocates per-layer temporaries of a few MB (unpacked sets, gathered magnitudes, random draws) over
and over, and the threshold adapts late and per block size, so many of them are mapped anew and
page-faulted on every first touch: kernel time that grows with the bytes, not with the work. A
fixed threshold of `MMAP_THRESHOLD_BYTES` keeps such blocks in the heap, where a freed block serves
the next request; freed memory above `TRIM_THRESHOLD_BYTES` at the heap's top still goes back to the
kernel. Only glibc is tuned, and not when the user set either threshold in the environment.
"""

from __future__ import annotations

import os
import platform

# Blocks up to this size come from the heap: above the largest per-layer temporary of a 70B-shape
# layer at 128 steps (28,672 neurons x 128 steps x 8 bytes = 28 MiB).
MMAP_THRESHOLD_BYTES = 32 << 20
TRIM_THRESHOLD_BYTES = 64 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3     # mallopt parameters (malloc.h)
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


def tune_allocator() -> bool:
    """Set glibc's mmap and trim thresholds for this process; False where nothing was changed (not
    glibc, or the user's own settings in the environment)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    if any(os.environ.get(k) for k in _USER_SETTINGS):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        ok = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
        return libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1 and ok
    except (OSError, AttributeError):
        return False
