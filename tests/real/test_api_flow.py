"""The flow docs/run-real.md shows for the next helpers: a sliding window of active sets read through
the reader into the neuron cache, and a sparse FFN over the cached rows equal to the dense FFN
restricted to the same neurons."""

from __future__ import annotations

import numpy as np
import pytest

from real.io.reader import BundleReader
from real.runtime.cache_matrices import NeuronCache


@pytest.mark.parametrize("layout", ["bundled", "unbundled"])
def test_window_flow_reader_cache_compute(make_store, layout):
    st = make_store(layout="both")
    rng = np.random.default_rng(0)
    seg = st.segment_bytes
    with BundleReader(st, layout=layout, in_flight=4, max_chunk_bytes=64 << 10) as reader:
        caches = NeuronCache([st.n_neurons] * st.n_layers, st.n_neurons, st.bundle_bytes, reader.dest_row_bytes)
        window: list[list[np.ndarray]] = [[] for _ in range(st.n_layers)]
        for _token in range(6):
            for layer in range(st.n_layers):
                need = np.sort(rng.choice(st.n_neurons, 60, replace=False))
                window[layer] = (window[layer] + [need])[-2:]                   # window k = 2
                keep = np.unique(np.concatenate(window[layer]))
                c = caches[layer]
                drop = np.setdiff1d(c.resident_ids(), keep)
                c.delete(drop)
                new = st.sort_by_position(layer, c.missing(need))
                a, b = c.append(new)
                stats = reader.read(layer, new, c.rows[a:b])
                assert stats.neurons == len(new)
                assert set(c.resident_ids().tolist()) == set(keep.tolist())
                # sparse FFN over the cached rows == dense FFN restricted to `need`
                x = rng.standard_normal(st.d_model).astype(np.float32)
                slots = c.slot_of[need]
                g, u, d = (c.segment(k, seg, np.float32)[slots].astype(np.float64) for k in range(3))
                h = g @ x
                y = d.T @ (h / (1 + np.exp(-h)) * (u @ x))
                G, U, D = (st.matrix(layer, s)[need].astype(np.float64) for s in st.segments)
                hd = G @ x
                np.testing.assert_allclose(y, D.T @ (hd / (1 + np.exp(-hd)) * (U @ x)), rtol=1e-10)
        assert caches.bytes_moved > 0
