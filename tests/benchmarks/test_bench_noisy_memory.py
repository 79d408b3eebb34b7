"""The `noisy` predictor's error memory against the memoryless draws: one 7B-shape layer (11,008
neurons), 1,000 steps, 3% active, side by side. Printed as a ratio of CPU times measured in the
same run, never asserted (the host is shared).

Run: `make bench` (or `pytest -s -m "" tests/benchmarks/test_bench_noisy_memory.py`).
"""

from __future__ import annotations

import time

import numpy as np

from sim import bitsets
from sim.policies.error_memory import ErrorMemory, Persistence, persistent_noisy_sets
from sim.policies.predictor import noisy_sets


def _cpu(fn, repeats: int = 3) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(repeats):
        c0 = time.process_time()
        fn()
        best = min(best, time.process_time() - c0)
    return best


def test_bench_noisy_memory_vs_memoryless() -> None:
    n, steps = 11008, 1000
    truth = bitsets.pack(np.random.default_rng(0).random((steps, n)) < 0.03)
    p = Persistence(0.40, 0.36, 0.45, 0.41)
    memoryless = _cpu(lambda: noisy_sets(np.random.default_rng(1), truth, n, 0.99, 0.3))
    memory = _cpu(lambda: persistent_noisy_sets(np.random.default_rng(1), np.random.default_rng(2), truth, n, 0.99,
                                                0.3, p, ErrorMemory()))
    print(f"\nnoisy predictor, {steps} steps x {n} neurons: memoryless {memoryless * 1e3:.0f} ms CPU, with memory "
          f"{memory * 1e3:.0f} ms CPU ({memory / memoryless:.1f}x)")
    assert memory > 0 and memoryless > 0
