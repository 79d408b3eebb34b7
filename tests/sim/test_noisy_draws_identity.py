"""The noisy predictor's draws are fixed numbers: a faster computation must give the same sets.

Dense draws (sim/policies/error_memory.py) and the memoryless `noisy_sets` are compared with the
reference implementation below, a literal transcription of the model (one uniform per neuron per
row, a latent per kind kept / redrawn to the score / redrawn fresh, row by row). The sparse draws
(sim/policies/sparse_errors.py) are compared with hashes of the sets the previous implementation
produced for the same inputs: a stored hash only detects that the numbers changed, it says nothing
about their distribution; that is what tests/sim/test_error_memory.py checks against the model's
expectations. Block and chunk sizes are internal: every size must give the same sets.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from sim import bitsets
from sim.policies import error_memory, sparse_errors
from sim.policies.error_memory import (
    ErrorMemory,
    Persistence,
    false_positive_rate,
    mixture,
    persistent_noisy_sets,
)
from sim.policies.predictor import noisy_sets
from tests.sim.test_error_memory import truth_rows


def _reference(rng: np.random.Generator, memory_rng: np.random.Generator, truth: np.ndarray, n: int, recall: float,
               precision: float, p: Persistence, state: dict) -> np.ndarray:
    """The dense draws, written as the model reads: bool [S, N] truth -> bool [S, N] predicted."""
    u = rng.random(truth.shape, dtype=np.float32)
    q = false_positive_rate(truth.sum(axis=1), n, recall, precision).astype(np.float32)
    if not p.any:
        return (truth & (u < recall)) | (~truth & (u < q[:, None]))
    if "score" not in state:
        cells = memory_rng.permutation(n)
        state["score"] = ((cells + memory_rng.random(n)) / n).astype(np.float32)
    v = memory_rng.random((truth.shape[0], 2, n), dtype=np.float32)
    latents = []
    for kind, (a, lam) in enumerate((mixture(p.fn, p.fn_far), mixture(p.fp, p.fp_far))):
        prev, rows = state.get(kind), []
        for s in range(truth.shape[0]):
            d = v[s, kind]
            if prev is None:      # the run's first step: the score below a, else fresh
                cur = np.where(d < np.float32(a), state["score"], u[s])
            else:
                redrawn = np.where(d < np.float32(lam + (1.0 - lam) * a), state["score"], u[s])
                cur = np.where(d < np.float32(lam), prev, redrawn)
            rows.append(cur)
            prev = cur
        state[kind] = prev
        latents.append(np.array(rows))
    return (truth & (latents[0] < recall)) | (~truth & (latents[1] < q[:, None]))


DENSE = [Persistence(0.40, 0.36, 0.45, 0.41), Persistence(0.6, 0.4, 0.7, 0.5), Persistence(0.9, 0.0, 0.0, 0.0),
         Persistence(0.5, 0.5, 1.0, 1.0), Persistence(0.95, 0.1, 0.8, 0.0), Persistence()]


@pytest.mark.parametrize("p", DENSE, ids=str)
@pytest.mark.parametrize("block_cells", [1 << 18, 700])
def test_dense_draws_equal_the_reference(p, block_cells, monkeypatch) -> None:
    monkeypatch.setattr(error_memory, "BLOCK_CELLS", block_cells)   # 700: a block of 1 row, of 2 rows
    for seed, (steps, n, active, recall, precision, cuts) in enumerate([(60, 500, 240, 0.95, 0.5, (1, 30)),
                                                                         (25, 333, 30, 0.8, 0.3, (7,))]):
        truth = truth_rows(seed, steps, n, active)
        words = bitsets.pack(truth)
        r1, r2, mem = np.random.default_rng([seed, 1]), np.random.default_rng([seed, 2]), ErrorMemory()
        edges = [0, *cuts, steps]
        got = np.concatenate([persistent_noisy_sets(r1, r2, words[a:b], n, recall, precision, p, mem)
                              for a, b in zip(edges, edges[1:])])
        g1, g2, state = np.random.default_rng([seed, 1]), np.random.default_rng([seed, 2]), {}
        want = np.concatenate([_reference(g1, g2, truth[a:b], n, recall, precision, p, state)
                               for a, b in zip(edges, edges[1:])])
        assert np.array_equal(bitsets.unpack(got, n), want)
        # and the generators stand at the same place afterwards
        assert r1.random() == g1.random() and r2.random() == g2.random()


def test_memoryless_sets_equal_the_reference() -> None:
    truth = truth_rows(9, 40, 300, 100)
    for recall, precision in ((0.9, 0.5), (1.0, 0.2), (0.0, 1.0)):
        got = noisy_sets(np.random.default_rng(5), bitsets.pack(truth), 300, recall, precision)
        want = _reference(np.random.default_rng(5), np.random.default_rng(6), truth, 300, recall, precision,
                          Persistence(), {})
        assert np.array_equal(bitsets.unpack(got, 300), want)


# (seed, steps, neurons, active, recall, precision, (fp, fp_far, fn, fn_far), cuts): sha256 prefix of
# the predicted words (little-endian uint64) as the implementation before the row chunks drew them
SPARSE = [
    ((1, 120, 3000, 90, 0.99, 0.3, (0.40, 0.36, 0.45, 0.41), ()), "c9ad05b44776d11b3cb5"),
    ((2, 120, 3000, 90, 0.95, 0.5, (0.40, 0.36, 0.45, 0.41), (1, 37, 38)), "cc2ce1f6d22ecd55beda"),
    ((3, 90, 2000, 60, 0.95, 0.4, (0.6, 0.4, 0.7, 0.5), (50,)), "beff02ef2a411234241a"),
    ((4, 90, 2000, 60, 0.9, 0.4, (0.1, 0.0, 0.8, 0.8), ()), "8274b19fd2029bb4b326"),
    ((5, 60, 1500, 40, 0.97, 0.6, (0.4, 0.4, 0.0, 0.0), (10,)), "0447bff2bf59188c3643"),
]


@pytest.mark.parametrize("case, digest", SPARSE, ids=[str(c[0][0]) for c in SPARSE])
@pytest.mark.parametrize("chunk_cells", [1 << 21, 10_000])
def test_sparse_draws_unchanged(case, digest, chunk_cells, monkeypatch) -> None:
    monkeypatch.setattr(sparse_errors, "CHUNK_CELLS", chunk_cells)   # 10,000: chunks of 3 to 6 rows
    seed, steps, n, active, recall, precision, pers, cuts = case
    truth = bitsets.pack(truth_rows(seed, steps, n, active))
    q_cap = float(false_positive_rate(bitsets.count(truth), n, recall, precision).max())
    mem, r1, r2 = ErrorMemory(), np.random.default_rng([seed, 1]), np.random.default_rng([seed, 2])
    edges = [0, *cuts, steps]
    out = np.concatenate([persistent_noisy_sets(r1, r2, truth[a:b], n, recall, precision, Persistence(*pers), mem,
                                                q_cap=q_cap) for a, b in zip(edges, edges[1:])])
    assert mem.sparse is not None                           # the sparse draws ran
    assert hashlib.sha256(out.astype("<u8").tobytes()).hexdigest()[:20] == digest


@pytest.mark.parametrize("p", [1e-9, 0.01, 0.2, 0.3333, 1 / 3, 0.5, 0.93, 1.0])
def test_vectorised_geometric_draws_numpys_numbers(p) -> None:
    a, b = np.random.default_rng(4), np.random.default_rng(4)
    assert np.array_equal(sparse_errors.geometric(a, p, 5000), b.geometric(p, 5000))
    assert a.random() == b.random()
    c = np.random.default_rng(4)
    i, x = sparse_errors.geometric_above_one(c, p, 5000)
    full = np.random.default_rng(4).geometric(p, 5000)
    assert np.array_equal(i, np.flatnonzero(full > 1)) and np.array_equal(x, full[i] - 1)


def test_carry_by_depth_equals_row_by_row() -> None:
    rng = np.random.default_rng(0)
    for lam in (0.05, 0.4, 0.9):
        keep = rng.random((50, 37)) < lam
        start = rng.random((51, 37)).astype(np.float32)
        a, b = start.copy(), start.copy()
        sparse_errors.carry_kept(a, keep, 0.1)    # by chain depth
        sparse_errors.carry_kept(b, keep, 0.9)    # row by row
        want = start.copy()
        for s in range(50):
            want[s + 1] = np.where(keep[s], want[s], start[s + 1])
        assert np.array_equal(a, want) and np.array_equal(b, want)
