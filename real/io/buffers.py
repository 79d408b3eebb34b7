"""Page-aligned host buffers and alignment arithmetic for direct I/O (sizes in bytes).

Linux O_DIRECT needs the file offset, the length and the memory address of every transfer aligned
to the device's logical block size (512 B on most disks, 4096 B on 4Kn NVMe and on most flash
translation layers). flashsim aligns everything to ALIGN_BYTES = 4096, which satisfies both and is
also the page size of x86-64 and arm64 Linux (Jetson) and the read unit of NAND flash pages.

Buffers come from anonymous `mmap` mappings, which the kernel always places on page boundaries;
they are touched (pre-faulted) once at allocation so that no page fault lands inside a timed read.
Buffers of HUGE_PAGE_MIN_BYTES or more are advised MADV_HUGEPAGE first (as NumPy does for its own
large arrays): the neuron cache is gathered and moved row by row at random, and with 4 KiB pages
every row costs TLB misses (a cold gather of 205 12 KiB rows measured 8.5 GB/s on 4 KiB pages and
10.6 GB/s with huge pages here). Direct I/O into huge pages also costs less CPU per read (the
kernel pins one page, not 256 for a 1 MiB read), so bench flash reads into huge pages too.

A transparent huge page can only back a 2 MiB-aligned 2 MiB range of a mapping, and mmap aligns
to 4 KiB only: a 2.3 MB mapping usually holds no huge page at all. Huge buffers are therefore
carved out of a mapping 2 MiB larger, starting at its first 2 MiB boundary (the unused slack is
never touched, so it takes address space, not memory). Measured here, per-layer batches of 237
reads (8-24 KiB, 32 in flight) from the SmolLM2 store: 1.25-1.33x the read table's time into an
unaligned 2.3 MB destination (4 KiB pages), 1.05x into the same rows 2 MiB-aligned (huge pages).
"""

from __future__ import annotations

import contextlib
import mmap

import numpy as np

ALIGN_BYTES = 4096
HUGE_PAGE_MIN_BYTES = 2 << 20


def round_up(n: int, align: int = ALIGN_BYTES) -> int:
    """Smallest multiple of `align` that is >= n."""
    return -(-int(n) // align) * align


def round_down(n: int, align: int = ALIGN_BYTES) -> int:
    return (int(n) // align) * align


class AlignedBuffer:
    """A page-aligned, pre-faulted byte buffer; `.array` is a uint8 NumPy view of it.

    Keep the AlignedBuffer alive as long as any view of it is used (the mapping owns the memory).
    """

    def __init__(self, nbytes: int, huge: bool | None = None):
        """`huge`: advise huge pages (None: when nbytes >= HUGE_PAGE_MIN_BYTES; True rounds the
        buffer up to HUGE_PAGE_MIN_BYTES)."""
        if nbytes <= 0:
            raise ValueError(f"nbytes must be > 0, got {nbytes}")
        if huge:
            nbytes = max(nbytes, HUGE_PAGE_MIN_BYTES)
        self.nbytes = round_up(nbytes, mmap.PAGESIZE)
        if huge is None:
            huge = self.nbytes >= HUGE_PAGE_MIN_BYTES
        self.huge = bool(huge and hasattr(mmap, "MADV_HUGEPAGE"))
        # pre-fault with MAP_POPULATE, unless huge pages are advised first (then the touch below faults)
        populate = 0 if self.huge else getattr(mmap, "MAP_POPULATE", 0)
        # huge: room to start at a 2 MiB boundary and end on one (module docstring)
        map_bytes = round_up(self.nbytes, HUGE_PAGE_MIN_BYTES) + HUGE_PAGE_MIN_BYTES if self.huge else self.nbytes
        self._mm = mmap.mmap(-1, map_bytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | populate)
        whole = np.frombuffer(self._mm, dtype=np.uint8)
        start = 0
        if self.huge:
            with contextlib.suppress(OSError):   # THP disabled or not supported: 4 KiB pages
                self._mm.madvise(mmap.MADV_HUGEPAGE)
            start = -whole.ctypes.data % HUGE_PAGE_MIN_BYTES
        self.array = whole[start: start + self.nbytes]
        self.array[:: mmap.PAGESIZE] = 0  # touch every page: no page faults later
        self.address = self.array.ctypes.data

    def view2d(self, rows: int, row_bytes: int) -> np.ndarray:
        """The first rows * row_bytes bytes as a [rows, row_bytes] uint8 matrix."""
        if rows * row_bytes > self.nbytes:
            raise ValueError(f"{rows} x {row_bytes} bytes do not fit in {self.nbytes}")
        return self.array[: rows * row_bytes].reshape(rows, row_bytes)

    def close(self) -> None:
        """Release the mapping (fails with BufferError while NumPy views are still alive)."""
        self.array = np.empty(0, np.uint8)
        self._mm.close()


def is_aligned(array: np.ndarray, align: int = ALIGN_BYTES) -> bool:
    """True when the array's first byte sits on an `align` boundary."""
    return array.ctypes.data % align == 0
