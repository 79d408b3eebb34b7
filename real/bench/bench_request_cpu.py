"""The CPU cost of one read request through this host's I/O path (the profile's `flash.request_cpu_s`),
from the CPU time `flashsim bench flash` records at every point of its read grid.

What a read request costs the CPU: the system call (submission, the block layer, the driver's
doorbell), the completion (interrupt, waking the waiting thread) and the hand-off between the
reader threads (the Python interpreter lock, the scheduler). A device's DMA engine moves the bytes,
so with direct I/O the cost is nearly independent of the request's size; what grows with the size
(pinning the destination pages, building the scatter list; copying out of the page cache when the
reads are buffered) is a per-byte term. So the model, per grid point (chunk size c, reads in
flight q):

    CPU seconds per read = request_cpu_s + cpu_s_per_byte x c

fitted by weighted least squares over all points, each point's per-read CPU time (process CPU
time, user + system, all threads, `resource.getrusage`, over the point, divided by its reads)
weighted by the reads it counted: a point of many short reads pins its mean down far better than
one of a few 1 MiB reads, and the points of many reads (small chunks, deep queues) are where a
CPU-bound I/O path caps the IOPS, which is what the term is for. Both coefficients are kept >= 0
(a negative one is the noise of the other; the fit then keeps the other alone). The fit per
reads-in-flight column is kept beside it: the cost at one read in flight (a sleep and a wake-up per
read) and deep in the queue (interpreter-lock hand-offs between threads) need not be the same.
What the process's CPU time leaves out: interrupt work the kernel accounts to no process (a
completion's hard and soft interrupt when it lands while another task or the idle loop runs), so
this is a lower bound of the whole machine's CPU per read; it is the part that runs on the cores
of the process that reads, which is what competes with a decoder on the same cores.
Units: seconds, bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from devices.errors import FlashsimError


def _fit(c: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[float, float]:
    """(a, b) >= 0 minimising sum w (y - a - b c)^2 (two parameters: the boundaries by hand)."""
    sw = w.sum()
    if not sw > 0:
        raise FlashsimError("request CPU fit: no reads counted")
    cm, ym = (w * c).sum() / sw, (w * y).sum() / sw
    var = (w * (c - cm) ** 2).sum()
    if var > 0:
        b = (w * (c - cm) * (y - ym)).sum() / var
        a = ym - b * cm
        if a >= 0 and b >= 0:
            return float(a), float(b)
    # on a boundary: the better of (a alone) and (b alone)
    a_only = (float(max(ym, 0.0)), 0.0)
    b_only = (0.0, float(max((w * c * y).sum() / (w * c * c).sum(), 0.0)))

    def sse(ab: tuple[float, float]) -> float:
        return float((w * (y - ab[0] - ab[1] * c) ** 2).sum())

    return a_only if sse(a_only) <= sse(b_only) else b_only


def request_cpu_fit(chunk_bytes: Sequence[int], in_flight: Sequence[int], cpu_s_per_read: Sequence[Sequence[float]],
                    reads: Sequence[Sequence[float]]) -> dict[str, Any]:
    """The fit of the module docstring over a grid ([i][j] at chunk_bytes[i], in_flight[j]):
    {request_cpu_s, cpu_s_per_byte, reads, per_in_flight: [{in_flight, request_cpu_s,
    cpu_s_per_byte}]}. Points without reads are left out."""
    c = np.asarray(chunk_bytes, np.float64)
    y = np.asarray(cpu_s_per_read, np.float64)
    n = np.asarray(reads, np.float64)
    if y.shape != (len(c), len(in_flight)) or n.shape != y.shape:
        raise FlashsimError(f"request CPU fit: the grid is {y.shape} and the reads {n.shape}, expected "
                            f"{(len(c), len(in_flight))}")
    if np.any(~np.isfinite(y)) or np.any(y < 0) or np.any(n < 0):
        raise FlashsimError("request CPU fit: CPU times and read counts must be finite and >= 0")
    cc = np.broadcast_to(c[:, None], y.shape)
    a, b = _fit(cc.ravel(), y.ravel(), n.ravel())
    per = []
    for j, q in enumerate(in_flight):
        if n[:, j].sum() > 0:
            aj, bj = _fit(c, y[:, j], n[:, j])
            per.append({"in_flight": int(q), "request_cpu_s": aj, "cpu_s_per_byte": bj})
    return {"request_cpu_s": a, "cpu_s_per_byte": b, "reads": float(n.sum()), "per_in_flight": per}


def request_cpu_source(fit: dict[str, Any], date: str, host: str, tool: str, direct_io: bool) -> str:
    """The provenance of `flash.request_cpu_s`, for the flash section's source."""
    per = ", ".join(f"q={p['in_flight']} {p['request_cpu_s'] * 1e6:.1f}" for p in fit["per_in_flight"])
    return (f"request_cpu_s measured by flashsim bench flash ({date}, {host}, {tool}): process CPU time (user + "
            f"system, getrusage) per read at every grid point, fitted as request_cpu_s + "
            f"{fit['cpu_s_per_byte'] * 1e9 * 1024:.3g} ns per KiB x chunk, weighted by the point's reads "
            f"({fit['reads']:.0f} reads, {'direct' if direct_io else 'BUFFERED'} I/O, Python threads + os.preadv); "
            f"per reads in flight (us): {per}")
