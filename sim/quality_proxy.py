"""Quality proxy from the trace: activation mass kept and recall of the true active set.

For one token, activation mass kept = sum |a_n| over computed neurons / sum |a_n| over all N.
The trace stores the exact denominator (`abs_sum`) and the K largest |a| (`top_idx`/`top_mag`). The
numerator adds the stored magnitudes of computed neurons and, for the N - K neurons whose |a| is
not stored, their remaining mass (abs_sum - stored sum) spread evenly: an estimate that is exact
for dense compute (1.0) and for computed sets containing all or none of the unstored neurons, and
within [lower, upper] = [stored part only, stored part + all the rest] otherwise. Traces without
magnitudes (K = 0) count instead: kept = |computed & active| / |active|.

Recall = |computed & active| / |active| over the step's union of active sets.
A step with several tokens (prefill, batch) computes one set for all of them; each token's mass is
weighed by its own magnitudes. Sums are kept as numerators and denominators per step so layers and
steps aggregate exactly.
"""

from __future__ import annotations

import numpy as np

from sim import bitsets
from sim.workload import TraceView


def layer_quality(view: TraceView, layer: int, start: int, stop: int, computed: np.ndarray,
                  needed: np.ndarray, n_computed: np.ndarray | None = None,
                  n_correct: np.ndarray | None = None, n_needed: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(mass_num, mass_den, recall_num, recall_den), each float64 [S], for steps [start, stop).
    Counts of the computed, correct (computed & needed) and needed sets may be passed in."""
    S = stop - start
    n_comp = bitsets.count(computed) if n_computed is None else n_computed
    rec_num = (bitsets.count(computed & needed) if n_correct is None else n_correct).astype(np.float64)
    rec_den = (bitsets.count(needed) if n_needed is None else n_needed).astype(np.float64)
    pos, ptr = view.steps.token_positions(start, stop)
    single = len(pos) == S
    step_of = np.arange(S) if single else np.repeat(np.arange(S), np.diff(ptr))
    N = view.n_neurons
    if view.trace.top_k == 0:
        A = view.token_words(layer, pos)
        num = bitsets.count(A & (computed if single else computed[step_of])).astype(np.float64)
        den = bitsets.count(A).astype(np.float64)
    else:
        idx, mag, tot = view.token_top(layer, pos)
        if view.rescaled:
            ok = idx >= 0
            idx = np.where(ok, idx, 0)
            n_stored = ok.sum(axis=1)
        else:
            ok, n_stored = None, idx.shape[1]
        if ok is None and bool(np.all(n_comp == N)):   # every neuron computed: every stored one is in
            bit = np.ones(idx.shape, np.uint8)
        else:
            # each stored neuron's bit in its step's computed set, gathered from the unpacked sets
            cbits = bitsets.unpack(computed, N).view(np.uint8)
            flat_type = np.int32 if cbits.size < 2**31 else np.int64
            flat = (step_of * N).astype(flat_type)[:, None] + idx
            bit = np.take(cbits.ravel(), flat)
        if ok is not None:
            bit &= ok
        stored_in = np.einsum("ij,ij->i", mag, bit, dtype=np.float64)   # the 0/1 bits cast to float64 as they are read
        stored_all = view.token_stored_sum(layer, pos)
        if stored_all is None:
            stored_all = mag.sum(axis=1, dtype=np.float64)
        n_in = np.add.reduce(bit, axis=1, dtype=np.int32).astype(np.int64)
        n_rest = N - n_stored
        rest = np.maximum(tot.astype(np.float64) - stored_all, 0.0)
        frac = np.where(n_rest > 0, (n_comp[step_of] - n_in) / np.maximum(n_rest, 1), 0.0)
        num = stored_in + rest * frac
        den = tot.astype(np.float64)
    if single:
        return num, den, rec_num, rec_den
    mass_num = np.bincount(step_of, weights=num, minlength=S)
    mass_den = np.bincount(step_of, weights=den, minlength=S)
    return mass_num, mass_den, rec_num, rec_den
