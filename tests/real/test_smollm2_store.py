"""The embedded SmolLM2-135M converted end to end (slow: loads the model through traces.capture)."""

from __future__ import annotations

import numpy as np
import pytest

from real.weights.convert import convert_state_dict, load_model_for_store
from real.weights.dtypes import decode
from real.weights.store import open_store


@pytest.mark.slow
def test_smollm2_bundles_equal_the_model(tmp_path):
    pytest.importorskip("torch")
    sd, spec, _ = load_model_for_store("smollm2-135m")
    st = open_store(convert_state_dict(sd, spec, tmp_path / "s", layout="both"), verify="full")
    assert (st.n_layers, st.n_neurons, st.d_model, st.bundle_bytes) == (30, 1536, 576, 3 * 576 * 4)
    ids = np.array([0, 1, 777, 1535])
    for layer in (0, 29):
        p = f"model.layers.{layer}.mlp."
        g, u, d = (sd[p + n + ".weight"].numpy() for n in ("gate_proj", "up_proj", "down_proj"))
        want = np.concatenate([g[ids], u[ids], d[:, ids].T], axis=1)
        for layout in ("bundled", "unbundled"):
            np.testing.assert_array_equal(decode(st.read_bundles(layer, ids, layout), "fp32").reshape(4, -1), want)
