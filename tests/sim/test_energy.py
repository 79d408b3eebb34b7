"""Energy per token (sim/energy.py, devices/section_energy.py): the formula by hand on made-up records, a
tiny naive run's FLOPs and DRAM bytes by hand, the summary's keys, and every bundled profile's
energy section with its sources (issue 46)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError

from devices import load_profile
from devices.schema import DeviceProfile, list_profiles
from devices.section_energy import ENERGY_FIELDS, SOURCE_KINDS, EnergySpec
from flashsim.main import main
from sim.energy import COMPONENTS, StepTraffic, energy_summary
from sim.engine import build
from sim.policies.presets import preset_config
from sim.records import TokenRecord
from traces.data import shipped_trace_path

ROUND = {"flash_read_active_w": 5.0, "flash_idle_w": 1.0, "dram_j_per_byte": 1e-9, "compute_j_per_flop": 1e-12,
         "compute_busy_w": 10.0, "static_w": 2.0}


def energy_spec(**values: float) -> EnergySpec:
    v = {**ROUND, **values}
    return EnergySpec.model_validate({k: {"value": x, "kind": "estimate", "source": "test"} for k, x in v.items()})


def rec(token: int, phase: str, latency_s: float, io_s: float, compute_s: float, mgmt_s: float, nbytes: int):
    return TokenRecord(token=token, phase=phase, n_tokens=1, t_start_s=0.0, t_end_s=latency_s, latency_s=latency_s,
                       io_s=io_s, compute_s=compute_s, ffn_compute_s=0.0, stall_s=0.0, mem_mgmt_s=mgmt_s,
                       bytes_read=nbytes, demand_bytes=nbytes, prefetch_bytes=0, stream_bytes=0, reads_issued=1,
                       resident_bytes=0, cache_bytes=0, kv_bytes=0, budget_bytes=0, computed=0, hits=0,
                       activation_mass_kept=1.0, recall=1.0)


def test_energy_summary_by_hand() -> None:
    # a prefill (left out) and two decode steps
    tokens = [rec(0, "prefill", 1.0, 1.0, 1.0, 0.0, 10**9),
              rec(1, "decode", 0.010, 0.004, 0.005, 0.001, 1_000_000),
              rec(2, "decode", 0.020, 0.006, 0.010, 0.000, 3_000_000)]
    traffic = StepTraffic(flops=np.array([9e12, 1e9, 3e9]), dram_bytes=np.array([9e12, 2e6, 4e6]))
    s = energy_summary(tokens, traffic, energy_spec(), batch=1)
    flash = (5.0 - 1.0) * (0.004 + 0.006)                      # 0.04 J
    dram = 1e-9 * ((2e6 + 1e6) + (4e6 + 3e6))                  # 0.01 J: compute's bytes + flash DMA
    compute = 1e-12 * 4e9 + 10.0 * (0.006 + 0.010)             # 0.004 + 0.16 J
    static = (2.0 + 1.0) * (0.010 + 0.020)                     # 0.09 J
    mj = s["energy_mj_per_token"]
    assert mj == pytest.approx({"flash": 20.0, "dram": 5.0, "compute": 82.0, "static": 45.0})
    assert 1e3 * np.array([flash, dram, compute, static]) / 2 == pytest.approx([mj[c] for c in COMPONENTS])
    assert s["joules_per_token"] == pytest.approx((flash + dram + compute + static) / 2)
    assert s["energy_inputs_per_token"]["flops"] == pytest.approx(2e9)
    # a batch of 4 shares each step's joules among 4 tokens
    s4 = energy_summary(tokens, traffic, energy_spec(), batch=4)
    assert s4["joules_per_token"] == pytest.approx(s["joules_per_token"] / 4)
    assert energy_summary(tokens, traffic, None, batch=1)["joules_per_token"] is None


def test_issue46_tiny_naive_run_by_hand(small_trace, base_profile) -> None:
    """naive on the 2-layer tiny model (d_model 64, d_ff 256, ReLU, fp16, vocab 1000): each decode
    step computes every neuron densely, so its FLOPs and DRAM bytes follow from the shapes alone."""
    data = base_profile.model_dump(mode="json", exclude_none=True)
    for k in ("sparse_ffn", "dense_gemv"):
        data["compute"].pop(k, None)
    data["energy"] = {k: {"value": v, "kind": "estimate", "source": "test"} for k, v in ROUND.items()}
    profile = DeviceProfile.model_validate(data)
    sim = build(small_trace, None, profile, preset_config("naive"))
    res = sim.run(fast=True)
    s = res.summary()
    dec = [r for r in res.tokens if r.phase == "decode"]
    ctx = sim.steps.attn_ctx_sum[[r.token for r in dec]].astype(float)
    L, d, N, vocab = 2, 64, 256, 1000
    attn_params = 4 * d * d                                    # q, k, v, o: 64 x 64 each, no biases
    flops = L * (2 * attn_params + 4 * d * ctx) + L * (2 * N * 2 * d) + 2 * vocab * d
    kv_per_layer_token = 2 * d * 2                             # K and V, fp16
    dram = (L * (attn_params * 2 + 2 * d * 2 + kv_per_layer_token * ctx)   # weights, 2 norms, KV
            + L * N * 2 * d * 2                                # the FFN's two matrices, read once
            + vocab * d * 2 + d * 2 + d * 2                    # lm_head, final norm, the embedding row
            + np.array([r.bytes_read for r in dec]))           # flash DMA into DRAM
    inp = s["energy_inputs_per_token"]
    assert inp["flops"] == pytest.approx(flops.mean(), rel=1e-12)
    assert inp["dram_bytes"] == pytest.approx(dram.mean(), rel=1e-12)
    mj = s["energy_mj_per_token"]
    assert mj["flash"] == pytest.approx((5.0 - 1.0) * s["io_ms_per_token"])
    assert mj["static"] == pytest.approx((2.0 + 1.0) * s["ms_per_token"])
    assert mj["compute"] == pytest.approx(1e-9 * flops.mean() + 10.0 * (s["compute_ms_per_token"]
                                                                       + s["memory_mgmt_ms_per_token"]))
    assert mj["dram"] == pytest.approx(1e-6 * dram.mean())
    assert s["joules_per_token"] == pytest.approx(sum(mj.values()) / 1e3)
    # the DES agrees with the fast path on the energy as on the time
    des = sim.run(fast=False).summary()
    assert des["joules_per_token"] == pytest.approx(s["joules_per_token"], rel=0.01)


def test_every_bundled_profile_has_sourced_energy() -> None:
    for name in list_profiles():
        e = load_profile(name).energy
        assert e is not None, f"{name}: no energy section"
        for field in ENERGY_FIELDS:
            v = getattr(e, field)
            assert v.kind in SOURCE_KINDS and v.value >= 0
            # a citation (a URL or DOI) or the reasoning of an estimate, never a bare number
            assert len(v.source) > 40, f"{name}.energy.{field}: source too short"
            assert v.kind == "estimate" or "http" in v.source, f"{name}.energy.{field}: cite a URL"
        assert e.flash_read_active_w.value >= e.flash_idle_w.value


def test_energy_spec_rejects_bad_input() -> None:
    with pytest.raises(ValidationError, match="flash_read_active_w"):
        energy_spec(flash_read_active_w=0.5, flash_idle_w=1.0)
    with pytest.raises(ValidationError):
        EnergySpec.model_validate({k: {"value": 1.0, "kind": "guess", "source": "x"} for k in ENERGY_FIELDS})
    with pytest.raises(ValidationError):
        energy_spec(static_w=-1.0)


def test_replay_json_carries_energy(capsys) -> None:
    rc = main(["replay", "--trace", str(shipped_trace_path()), "--device", "jetson-orin-nano-8gb", "--preset",
               "naive", "--tokens", "8", "--dram-budget", "128MiB", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["joules_per_token"] > 0
    assert set(d["energy_mj_per_token"]) == set(COMPONENTS)
    assert d["joules_per_token"] == pytest.approx(sum(d["energy_mj_per_token"].values()) / 1e3)
    assert d["energy_mj_per_token"]["flash"] > 0           # naive reads the FFN from flash every token
    rc = main(["replay", "--trace", str(shipped_trace_path()), "--device", "jetson-orin-nano-8gb", "--preset",
               "naive", "--tokens", "8", "--dram-budget", "128MiB"])
    out = capsys.readouterr().out
    assert rc == 0 and "energy per token" in out and "static mJ" in out
