"""Achievable vs peak folding, power modes, and the CPU cap on reads (hand-computed expectations)."""

import pytest

from devices import load_profile
from devices.achievable import at_bound, inputs
from devices.curves import ClosedFormReadCurve, CpuBoundReadCurve
from devices.errors import FlashsimError


def test_cpu_cap_hand_computed():
    base = ClosedFormReadCurve(3.5e9, 50e-6, 1e6)
    cap = CpuBoundReadCurve(base, request_cpu_s=20e-6, io_cores=4)
    # 4 KiB at q=32: device min(32*4096/(50us+1.17us), 4.096e9, 3.5e9) = 2.56 GB/s;
    # CPU: min(32, 4) / 20 us = 200K req/s -> 819.2 MB/s
    assert cap.bytes_per_s(4096, 32) == pytest.approx(4096 * 200_000)
    # q=1: CPU 1 / 20 us = 50K req/s -> 204.8 MB/s; device 4096 / 51.17 us = 80.0 MB/s (device-bound)
    assert cap.bytes_per_s(4096, 1) == pytest.approx(base.bytes_per_s(4096, 1))
    # 1 MiB at q=32: CPU 200K x 1 MiB >> 3.5 GB/s: the device's
    assert cap.bytes_per_s(1 << 20, 32) == pytest.approx(3.5e9)


def test_folding_nano():
    raw = load_profile("jetson-orin-nano-8gb")
    assert raw.power_mode == "25w"
    ach, peak = at_bound(raw, "achievable"), at_bound(raw, "peak")
    assert ach.memory.bandwidth_bytes_per_s == raw.memory.sustained_bandwidth_bytes_per_s
    assert peak.memory.bandwidth_bytes_per_s == raw.memory.bandwidth_bytes_per_s
    # achievable reads are capped by 4 cores / 20 us at small requests; the peak closed form is not
    assert ach.flash.bytes_per_s(4096, 64) == pytest.approx(4096 * 4 / 20e-6)
    assert peak.flash.bytes_per_s(4096, 64) > ach.flash.bytes_per_s(4096, 64)
    assert peak.compute.gemv_efficiency is None and ach.compute.gemv_efficiency_for("int4") == 0.70
    # the ceiling charges no estimated launch overhead (a fused runtime pays close to none)
    assert peak.compute.op_overhead_s == 0.0 and ach.compute.op_overhead_s == raw.compute.op_overhead_s > 0
    assert at_bound(load_profile("this-host"), "peak").compute.op_overhead_s == \
        load_profile("this-host").compute.op_overhead_s          # measured: kept
    assert at_bound(ach, "achievable") is ach
    with pytest.raises(FlashsimError):
        at_bound(ach, "peak")


def test_power_modes():
    m7 = load_profile("jetson-orin-nano-8gb@7w")
    assert m7.power_mode == "7w"
    assert m7.memory.bandwidth_bytes_per_s == pytest.approx(6.83e10)
    assert m7.flash.io_cores == 3
    assert m7.compute.gemv_flops_per_s["fp16"] == pytest.approx(8.36e11)
    with pytest.raises(FlashsimError, match="unknown power mode"):
        load_profile("jetson-orin-nano-8gb@99w")
    with pytest.raises(FlashsimError, match="no power modes"):
        load_profile("rtx4090-nvme@7w")


def test_measured_host_not_double_counted():
    host = load_profile("this-host")
    # bench flash's batch overheads / host-CPU terms hold the I/O CPU: no CPU cap on its table
    assert host.flash.measured_io_cpu
    data = host.model_dump()
    data["flash"]["request_cpu_s"] = 30e-6
    data["flash"]["request_cpu_source"] = {"kind": "measured", "source": "test"}
    from devices.schema import DeviceProfile

    p = at_bound(DeviceProfile.model_validate(data), "achievable")
    assert p.flash.request_cpu_s is None
    assert type(p.flash.curve).__name__ == "TableReadCurve"


def test_cpu_compute_takes_decoder_time():
    raw = load_profile("phone-ufs4")
    data = raw.model_dump()
    data["compute"]["cpu_cores"] = 4
    from devices.schema import DeviceProfile

    p = at_bound(DeviceProfile.model_validate(data), "achievable")
    # each read takes request_cpu_s / cpu_cores of the decoder's time; the read is not delayed
    assert p.flash.host_cpu_s_per_read == pytest.approx(1.0e-5 / 4)
    assert p.flash.host_cpu_terms()[0] == pytest.approx(2.5e-6)
    assert p.flash.host_cpu_terms()[2] == 0.0


def test_inputs_name_kinds():
    kinds = {r["input"]: r["kind"] for r in inputs(load_profile("jetson-orin-nano-8gb"))}
    assert kinds["flash_read_table"] == "published"
    assert kinds["power_mode"] == "datasheet"
    assert {r["kind"] for r in inputs(load_profile("this-host"), "peak")} <= {"measured"}


def test_energy_follows_the_power_mode():
    """The Orin Nano's energy numbers are the default 25W mode's; MAXN_SUPER sets its own busy power
    (both published); 15W has none published, keeps 25W's, and the inputs name the mode they hold for."""
    d, mx, m15 = (load_profile(f"jetson-orin-nano-8gb{m}") for m in ("", "@maxn_super", "@15w"))
    assert d.energy.power_mode == "25w" and d.energy.compute_busy_w.value == pytest.approx(5.0)
    assert mx.energy.power_mode == "maxn_super" and mx.energy.compute_busy_w.value == pytest.approx(6.0)
    assert m15.energy.power_mode == "25w" and m15.energy.compute_busy_w.value == pytest.approx(5.0)
    names = lambda p: {r["input"]: r["value"] for r in inputs(p)}  # noqa: E731
    assert "energy_power_mode" not in names(d) and "energy_power_mode" not in names(mx)
    assert names(m15)["energy_power_mode"] == "25w"
