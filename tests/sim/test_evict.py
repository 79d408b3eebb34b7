"""The code after each layer refills what the layer's streaming evicted from the CPU caches
(compute.evict_layer_s, ComputeModel.evict_s), and a read wait adds only its penalty beyond that."""

from __future__ import annotations

import numpy as np
import pytest

from devices.schema import DeviceProfile
from sim.components.compute import ComputeModel
from sim.engine import simulate
from sim.policies.presets import preset_config
from tests.sim.helpers import tiny_spec

FLAT = [1.0, 1e15]      # evict_bytes of a flat curve: its value for every layer (each streams > 1 byte)


def _with(profile: DeviceProfile, compute: dict | None = None, flash: dict | None = None) -> DeviceProfile:  # type: ignore[type-arg]
    data = profile.model_dump(mode="json", exclude_none=True)
    data["compute"].update(compute or {})
    data["flash"].update(flash or {})
    return DeviceProfile.model_validate(data)


def _flat(kern: float, fw: float) -> dict:  # type: ignore[type-arg]
    return dict(evict_bytes=FLAT, evict_layer_s=[kern, kern], framework_evict_layer_s=[fw, fw])


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("preset, framework", [("llm-in-a-flash", "kernels"), ("llm-in-a-flash", "hf"),
                                               ("naive", "hf"), ("dense", "hf"), ("mmap", "kernels")])
def test_the_code_after_every_layer_pays_its_eviction(small_trace, base_profile, fast, preset, framework) -> None:
    """A flat curve adds its value once per layer and step to the compute after the layer's FFN (the
    next attention or the lm_head), under every residency; nothing else moves (no prefetch: the
    layers wait for their reads whatever the compute takes)."""
    cfg = preset_config(preset).with_overrides([f"compute.framework={framework}"]
                                               + (["prefetch=none"] if preset == "llm-in-a-flash" else []))
    kern, fw = 3e-5, 9e-5
    a = simulate(small_trace, None, base_profile, cfg, fast=fast)
    b = simulate(small_trace, None, _with(base_profile, _flat(kern, fw)), cfg, fast=fast)
    per_layer = fw if framework == "hf" else kern
    L = small_trace.spec.n_layers
    for ta, tb in zip(a.tokens, b.tokens, strict=True):
        assert tb.compute_s - ta.compute_s == pytest.approx(L * per_layer, abs=1e-12)
        assert tb.latency_s - ta.latency_s == pytest.approx(L * per_layer, abs=1e-12)
        assert (tb.ffn_compute_s, tb.mem_mgmt_s, tb.io_s, tb.stall_s) == pytest.approx(
            (ta.ffn_compute_s, ta.mem_mgmt_s, ta.io_s, ta.stall_s), abs=1e-12)


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("wait, evict", [(7e-4, 3e-4), (2e-4, 5e-4)])
def test_a_wait_adds_only_its_penalty_beyond_the_eviction(small_trace, base_profile, fast, wait, evict) -> None:
    """Both penalties are one refill of the same caches, each probed against a layer run back to
    back: a layer that waited pays max(wait, eviction). The eviction lands on the next attention,
    the rest of the wait's (if any) is split as COLD_SPLIT (0.5 FFN, 0.2 cache work, 0.3 next)."""
    cfg = preset_config("llm-in-a-flash").with_overrides(["prefetch=none", "compute.framework=hf"])
    cold = dict(cold_wait_s=[1e-12, 1e3], cold_compute_s=[wait, wait], framework_cold_compute_s=[wait, wait])
    counted = _with(base_profile, flash=dict(plan_s_per_batch=1e-4))
    a = simulate(small_trace, None, counted, cfg, fast=fast)
    b = simulate(small_trace, None, _with(counted, _flat(evict, evict), cold), cfg, fast=fast)
    base = simulate(small_trace, None, base_profile, cfg, fast=fast)
    L, excess = small_trace.spec.n_layers, max(wait - evict, 0.0)
    waited = 0
    for t0, ta, tb in zip(base.tokens, a.tokens, b.tokens, strict=True):
        batches = round((ta.stall_s - t0.stall_s) / 1e-4)     # layers that read this step
        waited += batches
        assert tb.ffn_compute_s - ta.ffn_compute_s == pytest.approx(0.5 * batches * excess, abs=1e-12)
        assert tb.mem_mgmt_s - ta.mem_mgmt_s == pytest.approx(0.2 * batches * excess, abs=1e-12)
        assert tb.compute_s - ta.compute_s == pytest.approx(L * evict + 0.8 * batches * excess, abs=1e-12)
    assert waited > 0


def test_a_layer_streams_its_attention_and_its_ffn_rows_by_hand() -> None:
    """ComputeModel's bytes by hand: the attention's weights, norms and KV entries; a sparse FFN's
    cache rows read and written by the gather plus the transposed down copy; a dense FFN its weights."""
    spec = tiny_spec(n_layers=3, d_ff=192, ffn_kind="swiglu", name="tiny-gated")
    from devices import load_profile

    cm = ComputeModel(spec, load_profile("this-host"), row_bytes=4096)
    got = cm.attention_bytes(np.array([10.0, 10.0]), np.array([3.0, 3.0]), np.array([True, False]))
    kv = spec.kv_bytes_per_token / spec.n_layers
    fixed = spec.attn_bytes_per_layer + spec.norm_bytes_per_layer
    assert got.tolist() == pytest.approx([fixed + 10 * kv, fixed + 3 * kv])
    c = np.array([0, 5, 192])
    gathered = 2 * 4096 + spec.d_model * spec.dtype_bytes
    assert cm.ffn_bytes(c).tolist() == [0.0, 5 * gathered, 192 * gathered]   # every neuron gathered too
    assert cm.ffn_bytes(c, gathers=np.array([True, True, False])).tolist() == [
        0.0, 5 * gathered, 192 * spec.ffn_neuron_bytes]
    assert cm.ffn_bytes(c, gathers=False).tolist() == (c * spec.ffn_neuron_bytes).tolist()


@pytest.mark.parametrize("fast", [False, True])
def test_the_eviction_follows_the_bytes_each_layer_streamed(gated_trace, base_profile, fast) -> None:
    """With a curve linear in bytes (k per byte), a step's extra compute is k x its layers' bytes:
    each attention's weights and norms plus its KV entries, each sparse FFN's gathered rows. So
    extra / k - the FFNs' bytes (the gathered bytes per neuron x the neurons computed) - the
    attentions' fixed bytes leaves L x the KV bytes per entry x the entries read: one more entry
    every decode step (a trace without a prompt, one sequence)."""
    k = 1e-12
    curve = dict(evict_bytes=[1e15], evict_layer_s=[k * 1e15], framework_evict_layer_s=[k * 1e15])
    spec = gated_trace.spec
    L, kv = spec.n_layers, spec.kv_bytes_per_token / spec.n_layers
    per_neuron = 2 * spec.ffn_neuron_bytes + spec.d_model * spec.dtype_bytes   # unpadded rows: the FFN's bytes
    fixed = L * (spec.attn_bytes_per_layer + spec.norm_bytes_per_layer)
    cfg = preset_config("llm-in-a-flash").with_overrides(["prefetch=none"])
    a = simulate(gated_trace, None, base_profile, cfg, fast=fast)
    b = simulate(gated_trace, None, _with(base_profile, curve), cfg, fast=fast)
    entries = [((tb.compute_s - ta.compute_s) / k - per_neuron * ta.computed - fixed) / (L * kv)
               for ta, tb in zip(a.tokens, b.tokens, strict=True)]
    assert 0 < a.tokens[0].computed < L * spec.d_ff        # sparse: every layer gathers
    assert entries == pytest.approx([entries[0] + i for i in range(len(entries))], abs=1e-3)
    assert entries[0] == pytest.approx(round(entries[0]), abs=1e-3) and round(entries[0]) >= 1
