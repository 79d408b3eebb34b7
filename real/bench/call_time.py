"""How the benches turn a kernel's repeated timings into the profile's seconds per call: their mean.

Why the mean, not the median. The simulator adds the profile's per-call times up into a token, and
validate scores the mean token of a real run (real/validation/validate_score.py), whose time is the sum of its
calls'. A sum's expectation is the sum of the calls' means, so a per-call time predicts a run only
if it is the call's mean. The median leaves out the tail that a run pays: timer interrupts, the
hypervisor's steal and other tenants' time slices, which land on a call with a probability that
grows with its length, and cost more relative to a short call. Measured on an Intel Xeon VM (one
thread, F.linear over a 960 MiB pool, 1 s per shape, twice): mean / median 1.02 at [1024, 1024]
fp32 (311 us a call), 1.06 at [576, 576] (102 us), 1.08-1.09 at [192, 576] (35 us), 1.00 at
[49152, 576] (8.5 ms). Priced from medians, the simulator ran fast in every group of validate's
grid.

Robustness against a rare long stall (a cell of 40 ms hit by another tenant's 10 ms) stays where it
was: the dense GEMV table keeps the median over its passes of each pass's mean, bench flash the mean
time per byte over its passes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def mean_call_s(times: Sequence[float] | np.ndarray, axis: int | None = None) -> float | np.ndarray:
    """Seconds per call: the mean of the timed calls (over `axis` of an array of timings)."""
    a = np.asarray(times, np.float64)
    if a.size == 0:
        raise ValueError("no timed calls")
    return float(a.mean()) if axis is None else a.mean(axis=axis)
