"""Host-CPU interference measured over the batch's reads (profile flash.host_cpu_batch_reads /
host_cpu_curves) and a Python loop's FFN step as its own probe: hand-computed curve values, the
schema's checks, and the FFN step's share through the DES (sim/components/compute.py HostCpu,
BatchCost)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from devices.schema import DeviceProfile
from sim.components.compute import BatchCost, HostCpu, ffn_overlap
from sim.components.flash import FlashDevice
from sim.engine import simulate
from sim.policies.presets import preset_config

HOST = dict(host_cpu_s_per_read=1e-5, compute_lost_s_per_read=2e-5, compute_lost_s_per_batch=0.0,
            read_delay_s_per_read=3e-6, read_delay_s_per_batch=1e-4, framework_compute_lost_s_per_read=3e-5,
            framework_compute_lost_s_per_batch=4e-4, framework_read_delay_s_per_read=8e-6,
            framework_read_delay_s_per_batch=3e-4)
PROBES = dict(framework_probe_op_s=4e-6, kernel_probe_op_s=3e-5, long_kernel_probe_op_s=1e-3,
              long_kernel_compute_lost_s_per_read=5e-6, long_kernel_compute_lost_s_per_batch=1e-4,
              long_kernel_read_delay_s_per_read=0.0, long_kernel_read_delay_s_per_batch=0.0)
READS = [16, 64, 128, 512]
# per batch (seconds) at READS: the kernel probe's delay small below one read per thread (64)
CURVES = {"kernel": {"compute_lost_s": [3e-4, 1.2e-3, 2.4e-3, 1.0e-2], "read_delay_s": [1e-4, 5e-4, 8e-4, 2e-3]},
          "ffn_step": {"compute_lost_s": [4e-4, 1.6e-3, 2.8e-3, 1.1e-2], "read_delay_s": [5e-4, 1e-3, 1.4e-3, 3.2e-3]}}


def _profile(base: DeviceProfile, curves: dict | None = CURVES, reads: list | None = READS, **flash) -> DeviceProfile:
    data = base.model_dump(mode="json", exclude_none=True)
    data["flash"].update({**HOST, **PROBES, **flash})
    if curves is not None:
        data["flash"]["host_cpu_curves"] = curves
    if reads is not None:
        data["flash"]["host_cpu_batch_reads"] = reads
    return DeviceProfile.model_validate(data)


def test_batch_cost_curve_hand_computed() -> None:
    c = BatchCost(1.0, 1.0, 1.0, 1.0, (tuple(map(float, READS)), (3e-4, 1.2e-3, 2.4e-3, 1e-2), (1e-4, 5e-4, 8e-4, 2e-3)))
    assert c.at(0) == (0.0, 0.0)
    assert c.at(8) == pytest.approx((1.5e-4, 5e-5))                  # below the first size: proportional
    assert c.at(16) == pytest.approx((3e-4, 1e-4))                   # at the points: the points
    assert c.at(128) == pytest.approx((2.4e-3, 8e-4))
    assert c.at(96) == pytest.approx((1.8e-3, 6.5e-4))               # halfway between 64 and 128
    assert c.at(1024) == pytest.approx((1e-2 + 512 * (7.6e-3 / 384), 2e-3 + 512 * (1.2e-3 / 384)))   # last slope
    lin = BatchCost(2e-5, 1e-4, 3e-6, 2e-4)                          # no curve: n x per read + per batch
    assert lin.at(100) == pytest.approx((100 * 2e-5 + 1e-4, 100 * 3e-6 + 2e-4))
    falling = BatchCost(0, 0, 0, 0, ((10.0, 20.0), (2e-3, 1e-3), (0.0, 0.0)))
    assert falling.at(1000)[0] == 0.0                                # extrapolation never below 0
    one = BatchCost(0, 0, 0, 0, ((64.0,), (6.4e-4,), (3.2e-4,)))
    assert one.at(128) == pytest.approx((1.28e-3, 6.4e-4))           # one size: proportional everywhere


def test_curves_replace_the_terms_and_the_ffn_step_takes_its_own(m1) -> None:
    prof = _profile(m1)
    py, native = HostCpu.of(prof, python_loop=True), HostCpu.of(prof)
    # a compiled loop: the kernel curve (no framework curve: the framework's per-read terms)
    assert native.cost(96) == pytest.approx((1.8e-3, 6.5e-4))
    assert native.cost(96, framework=1.0) == pytest.approx((96 * 3e-5 + 4e-4, 96 * 8e-6 + 3e-4))
    # a Python loop at the kernel probe's rhythm: the kernel curve; its FFN step: the FFN-step curve
    assert py.cost(96, op_s=3e-5) == pytest.approx((1.8e-3, 6.5e-4))
    assert py.cost(96, op_s=3e-5, ffn=1.0) == pytest.approx((2.2e-3, 1.2e-3))
    assert py.cost(96, op_s=3e-5, ffn=0.25) == pytest.approx((1.9e-3, 0.25 * 1.2e-3 + 0.75 * 6.5e-4))
    assert py.cpu_share(96, 0.01, op_s=3e-5, ffn=1.0) == pytest.approx(1 - 2.2e-3 / 0.01)
    assert py.delay_s(96, op_s=3e-5, ffn=1.0) == pytest.approx(1.2e-3)
    # without seconds per call the probes do not apply, nor the FFN-step curve
    assert py.cost(96, ffn=1.0) == native.cost(96)
    flash = FlashDevice()
    flash.enable_host_cpu(py)
    end = flash.submit(0.0, 0.01, 1e6, 96, "prefetch", step=0, op_s=3e-5, ffn=0.5)
    assert end == pytest.approx(0.01 + 0.5 * (6.5e-4 + 1.2e-3))
    (_, _, share), = flash.cpu_segments_after(0.0, 0.0, 3e-5, 1.0)
    assert share == pytest.approx(1 - 2.2e-3 / end)


def test_ffn_overlap_hand_computed() -> None:
    """Which code a prefetch's reads wait behind: attention 3 s, then FFN step 1 s, repeating."""
    assert ffn_overlap(0.0, 3.0, 3.0, 1.0, False) == 0.0              # within the next attention
    assert ffn_overlap(0.0, 4.0, 3.0, 1.0, False) == pytest.approx(0.25)
    assert ffn_overlap(2.0, 4.0, 3.0, 1.0, False) == pytest.approx(0.5)
    assert ffn_overlap(3.5, 7.5, 3.0, 1.0, False) == pytest.approx(0.25)   # across a period
    assert ffn_overlap(0.0, 1.0, 3.0, 1.0, True) == 1.0               # a lookahead: this FFN step first
    assert ffn_overlap(0.5, 2.5, 3.0, 1.0, True) == pytest.approx(0.25)
    assert ffn_overlap(1.0, 1.0, 3.0, 1.0, False) == 0.0 == ffn_overlap(0.0, 1.0, 0.0, 0.0, False)


def test_a_prefetch_delay_follows_the_code_it_overlaps(m1) -> None:
    """With the FFN-step curve, a batch that ends within the next attention is delayed at the
    attention's rhythm only; one that runs on through the FFN step takes that curve for its share."""
    py = HostCpu.of(_profile(m1), python_loop=True)
    flash = FlashDevice()
    flash.enable_host_cpu(py)
    # 96 reads served in 2 s after the issue; attention 3 s at the kernel rhythm, then 1 s of FFN step
    end = flash.submit(0.0, 2.0, 1e6, 96, "prefetch", step=0, overlap_s=10.0, op_s=1.0,
                       pattern=(3.0, 1.0, False, 3e-5))
    assert end == pytest.approx(2.0 + 6.5e-4)                       # the kernel curve at 96 reads
    flash = FlashDevice()
    flash.enable_host_cpu(py)
    end = flash.submit(0.0, 4.0, 1e6, 96, "prefetch", step=0, overlap_s=10.0, op_s=1.0,
                       pattern=(3.0, 1.0, False, 3e-5))
    assert end == pytest.approx(4.0 + 0.75 * 6.5e-4 + 0.25 * 1.2e-3)
    # a profile without the FFN-step curve keeps the layer's rhythm (op_s) and ignores the pattern
    plain = HostCpu.of(_profile(m1, curves={"kernel": CURVES["kernel"]}), python_loop=True)
    assert not plain.has_ffn_step
    flash = FlashDevice()
    flash.enable_host_cpu(plain)
    end = flash.submit(0.0, 4.0, 1e6, 96, "prefetch", step=0, overlap_s=10.0, op_s=3e-5,
                       pattern=(3.0, 1.0, False, 1.0))
    assert end == pytest.approx(4.0 + 6.5e-4)


def test_profiles_without_curves_price_as_before(m1) -> None:
    with_curves = HostCpu.of(_profile(m1, curves={}, reads=READS), python_loop=True)
    without = HostCpu.of(_profile(m1, curves=None, reads=None), python_loop=True)
    for n, op, ffn in ((10, 3e-5, 0.0), (200, 1e-4, 1.0), (600, 4e-6, 0.5)):
        assert with_curves.cost(n, op_s=op, ffn=ffn) == without.cost(n, op_s=op, ffn=ffn)
        lost_r, lost_b, delay_r, delay_b = without.at(op)
        assert without.cost(n, op_s=op, ffn=ffn) == pytest.approx((n * lost_r + lost_b, n * delay_r + delay_b))


def test_curve_validation(m1) -> None:
    with pytest.raises(ValidationError, match="go together"):
        _profile(m1, reads=None)
    with pytest.raises(ValidationError, match="go together"):
        _profile(m1, curves=None)
    with pytest.raises(ValidationError, match="increasing"):
        _profile(m1, reads=[16, 16, 128, 512])
    with pytest.raises(ValidationError, match="one value per"):
        _profile(m1, reads=[16, 64, 128])
    with pytest.raises(ValidationError, match="unknown probe 'gpu'"):
        _profile(m1, curves={"gpu": CURVES["kernel"]})
    with pytest.raises(ValidationError, match=r">= 0|is outside \[0"):
        _profile(m1, curves={"kernel": {**CURVES["kernel"], "read_delay_s": [1e-4, -1.0, 1e-3, 2e-3]}})
    with pytest.raises(ValidationError, match="need host_cpu_s_per_read > 0"):
        data = m1.model_dump(mode="json", exclude_none=True)
        data["flash"].update(host_cpu_batch_reads=READS, host_cpu_curves=CURVES)
        DeviceProfile.model_validate(data)


def _means(res) -> dict[str, float]:  # type: ignore[no-untyped-def]
    toks = res.tokens
    return {k: sum(getattr(t, k) for t in toks) / len(toks) for k in ("latency_s", "io_s", "compute_s")}


def test_a_costlier_ffn_step_slows_a_delta_prefetch_run(small_trace, base_profile) -> None:
    """The same delta-prefetch run on profiles that differ only in the FFN-step curve: the loop whose
    FFN step delays reads more (and loses more compute to them) runs slower and reads longer; a
    compiled loop does not look at the FFN-step curve."""
    cfg = preset_config("neuroprefetcher").with_overrides(["predictor.rank=0", "compute.framework=kernels",
                                                           "prefetch=delta"])
    cheap = {"kernel": CURVES["kernel"], "ffn_step": CURVES["kernel"]}
    dear = {"kernel": CURVES["kernel"], "ffn_step": {k: [4 * v for v in vs] for k, vs in CURVES["ffn_step"].items()}}
    # reads a quarter as fast as this-host's table, so that the prefetches run on into the FFN step
    # whatever the calibration's balance of reads and attention (on a fast disk a prefetch ends first)
    t = base_profile.flash.read_table
    slow = {"chunk_bytes": list(t.chunk_bytes), "in_flight": list(t.in_flight),
            "bytes_per_s": [[v / 4 for v in row] for row in t.bytes_per_s]}
    a = _means(simulate(small_trace, None, _profile(base_profile, curves=cheap, read_table=slow), cfg, fast=False))
    b = _means(simulate(small_trace, None, _profile(base_profile, curves=dear, read_table=slow), cfg, fast=False))
    assert b["latency_s"] > a["latency_s"] and b["io_s"] > a["io_s"]
    native = cfg.with_overrides(["compute.decoder=native"])
    assert _means(simulate(small_trace, None, _profile(base_profile, curves=cheap, read_table=slow), native,
                           fast=False)) == \
        pytest.approx(_means(simulate(small_trace, None, _profile(base_profile, curves=dear, read_table=slow), native,
                                      fast=False)))
