"""A small routing trace for tests only: Zipf expert popularity per layer plus token-to-token reuse.
(The shipped synthesizer is traces/routing.py's; this keeps the simulator's tests independent of it.)"""

from __future__ import annotations

import numpy as np


def zipf_routing(T: int, M: int, E: int, K: int, *, alpha: float = 1.0, reuse: float = 0.5,
                 seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """experts int16 [T, M, K] (distinct per row) and weights float32 [T, M, K] (descending, sum 1)."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, E + 1) ** alpha
    p /= p.sum()
    perms = np.stack([rng.permutation(E) for _ in range(M)])
    out = np.empty((T, M, K), np.int16)
    for t in range(T):
        for m in range(M):
            row: list[int] = []
            if t and reuse:
                prev = out[t - 1, m]
                row = [int(x) for x in prev[rng.random(K) < reuse]]
            while len(row) < K:
                e = int(perms[m, rng.choice(E, p=p)])
                if e not in row:
                    row.append(e)
            out[t, m] = row
    w = np.sort(rng.dirichlet(np.ones(K), size=(T, M)), axis=-1)[..., ::-1].astype(np.float32)
    return out, w
