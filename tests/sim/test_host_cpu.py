"""Host CPU shared by compute and I/O (profiles with flash.host_cpu_s_per_read > 0): hand-computed
FIFO batches and CPU shares, and end-to-end properties through the DES (sim/components/compute.py
HostCpu, flash.py FlashDevice, pipeline.py Decoder)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from devices import list_profiles, load_profile
from devices.schema import DeviceProfile
from sim.components.compute import MIN_CPU_SHARE, HostCpu, stretch
from sim.components.flash import FlashDevice
from sim.engine import simulate
from sim.policies.presets import preset_config


def _with_host(profile: DeviceProfile, **flash: float) -> DeviceProfile:
    data = profile.model_dump(mode="json", exclude_none=True)
    data["flash"].update(flash)
    return DeviceProfile.model_validate(data)


def test_only_this_host_declares_shared_cpu() -> None:
    """Profiles that declare no host CPU cost keep the old model (golden numbers unchanged)."""
    for name in list_profiles():
        p = load_profile(name)
        assert (HostCpu.of(p) is not None) == (name == "this-host"), name


def test_host_cpu_defaults_and_validation(m1) -> None:
    h = HostCpu.of(_with_host(m1, host_cpu_s_per_read=1e-5))
    assert h == HostCpu(1e-5, 1e-5, 1e-5)                     # both effects default to the CPU time
    h = HostCpu.of(_with_host(m1, host_cpu_s_per_read=1e-5, compute_lost_s_per_read=3e-5, read_delay_s_per_read=2e-5))
    assert h == HostCpu(1e-5, 3e-5, 2e-5)
    h = HostCpu.of(_with_host(m1, host_cpu_s_per_read=1e-5, compute_lost_s_per_batch=1e-3, read_delay_s_per_batch=2e-4))
    assert (h.lost_s_per_batch, h.delay_s_per_batch) == (1e-3, 2e-4)
    with pytest.raises(ValidationError, match="compute_lost_s_per_batch needs host_cpu_s_per_read > 0"):
        _with_host(m1, compute_lost_s_per_batch=1e-3)
    with pytest.raises(ValidationError, match="needs host_cpu_s_per_read > 0"):
        _with_host(m1, compute_lost_s_per_read=3e-5)
    with pytest.raises(ValidationError):
        _with_host(m1, host_cpu_s_per_read=-1.0)


def test_cpu_share_hand_computed() -> None:
    h = HostCpu(1e-5, 2e-5, 5e-6)
    assert h.cpu_share(100, 0.01) == pytest.approx(1 - 100 * 2e-5 / 0.01)   # 0.8
    hb = HostCpu(1e-5, 2e-5, 5e-6, lost_s_per_batch=1e-3, delay_s_per_batch=4e-4)
    assert hb.cpu_share(100, 0.01) == pytest.approx(1 - (100 * 2e-5 + 1e-3) / 0.01)   # 0.7
    flash = FlashDevice()
    flash.enable_host_cpu(hb)
    assert flash.submit(0.0, 0.01, 1e6, 100, "prefetch", step=0) == pytest.approx(0.01 + 100 * 5e-6 + 4e-4)
    assert h.cpu_share(1000, 0.01) == MIN_CPU_SHARE                        # would be negative: floored
    assert h.cpu_share(5, 0.0) == 1.0


def test_flash_device_prefetch_pays_cpu_demand_does_not() -> None:
    flash = FlashDevice()
    flash.enable_host_cpu(HostCpu(1e-5, 2e-5, 5e-6))
    # demand: 100 reads in 10 ms, decoder waits (nothing computes): service unchanged
    assert flash.submit(0.0, 0.01, 1e6, 100, "demand", step=0) == pytest.approx(0.01)
    # prefetch: 200 reads, 10 ms on the device + 200 x 5 us of CPU the compute holds
    end = flash.submit(0.02, 0.01, 1e6, 200, "prefetch", step=1)
    assert end == pytest.approx(0.02 + 0.01 + 200 * 5e-6)
    assert flash.host_cpu_extra_s == {1: pytest.approx(200 * 5e-6)}
    segs = list(flash.cpu_segments_after(0.0))
    assert segs[0] == pytest.approx((0.0, 0.01, 1 - 100 * 2e-5 / 0.01))
    assert segs[1] == pytest.approx((0.02, 0.031, 1 - 200 * 2e-5 / 0.011))
    assert list(flash.cpu_segments_after(0.015)) == [segs[1]]              # ended batches dropped
    # 5 ms of compute from t = 0.02 at share 1 - 4e-3 / 0.011 (= 7/11)
    share = segs[1][2]
    assert stretch(0.02, 0.005, flash.cpu_segments_after(0.02)) == pytest.approx(0.005 / share)


def test_device_without_host_cpu_unchanged() -> None:
    flash = FlashDevice()
    assert flash.submit(0.0, 0.01, 1e6, 100, "prefetch", step=1) == 0.01
    assert not flash.host_cpu_extra_s and not flash.cpu_segments_after(0.0)


def _means(res) -> dict[str, float]:  # type: ignore[no-untyped-def]
    n = len(res.tokens)
    return {f: sum(getattr(t, f) for t in res.tokens) / n for f in ("latency_s", "io_s", "compute_s", "stall_s")}


def test_no_prefetch_is_identical(small_trace, base_profile) -> None:
    """Without prefetch the decoder waits for every read: nothing overlaps, the host CPU costs nothing."""
    cfg = preset_config("llm-in-a-flash").with_overrides(["prefetch=none"])
    host = _with_host(base_profile, host_cpu_s_per_read=2e-5, compute_lost_s_per_read=5e-5, read_delay_s_per_read=3e-5)
    a = simulate(small_trace, None, base_profile, cfg, fast=False)
    b = simulate(small_trace, None, host, cfg, fast=False)
    assert [t.latency_s for t in a.tokens] == [t.latency_s for t in b.tokens]
    assert [t.io_s for t in a.tokens] == [t.io_s for t in b.tokens]


def test_prefetch_overlap_costs_compute_and_io(small_trace, base_profile) -> None:
    cfg = preset_config("neuroprefetcher").with_overrides(["predictor.rank=0"])
    off = simulate(small_trace, None, base_profile, cfg, fast=False)
    zero = simulate(small_trace, None, _with_host(base_profile, host_cpu_s_per_read=1e-5, compute_lost_s_per_read=0.0,
                                                  read_delay_s_per_read=0.0), cfg, fast=False)
    on = simulate(small_trace, None, _with_host(base_profile, host_cpu_s_per_read=1e-5, compute_lost_s_per_read=5e-5,
                                                read_delay_s_per_read=3e-5), cfg, fast=False)
    assert [t.latency_s for t in zero.tokens] == pytest.approx([t.latency_s for t in off.tokens], rel=1e-12)
    m_off, m_on = _means(off), _means(on)
    assert sum(t.prefetch_bytes for t in on.tokens) > 0
    assert m_on["compute_s"] > m_off["compute_s"] and m_on["latency_s"] > m_off["latency_s"]
    # io_s grows by the prefetch reads x read_delay_s_per_read: never more than every read's delay
    extra = [b.io_s - a.io_s for a, b in zip(off.tokens, on.tokens)]
    assert all(e >= -1e-15 for e in extra) and max(extra) > 0
    assert all(e <= t.reads_issued * 3e-5 + 1e-12 for e, t in zip(extra, on.tokens))
    # same workload: bytes and counts do not depend on timing
    assert [t.bytes_read for t in on.tokens] == [t.bytes_read for t in off.tokens]


def test_prefetch_waits_at_most_for_the_compute_it_overlaps() -> None:
    """With little compute to overlap, a prefetch's CPU work has little to wait for."""
    flash = FlashDevice()
    flash.enable_host_cpu(HostCpu(1e-5, 2e-5, 5e-6))
    end = flash.submit(0.0, 0.01, 1e6, 200, "prefetch", step=2, overlap_s=1e-4)
    assert end == pytest.approx(0.01 + 1e-4) and flash.host_cpu_extra_s == {2: pytest.approx(1e-4)}


@pytest.mark.parametrize(("bundled", "align", "staged"), [(False, 4096, True), (True, 4096, False), (True, 0, True)])
def test_staged_reads_priced_per_read(gated_trace, base_profile, bundled, align, staged) -> None:
    """flash.staged_s_per_read is added to each read a direct-I/O reader must stage: unbundled rows
    that are not 4 KiB multiples, or any packed store; a padded bundle lands in place."""
    cfg = preset_config("llm-in-a-flash").with_overrides(
        ["prefetch=none", f"bundling.bundled={str(bundled).lower()}", f"bundling.align_bytes={align}"])
    a = simulate(gated_trace, None, base_profile, cfg, fast=False)
    b = simulate(gated_trace, None, _with_host(base_profile, staged_s_per_read=1e-5), cfg, fast=False)
    assert sum(t.reads_issued for t in a.tokens) > 0
    for ta, tb in zip(a.tokens, b.tokens, strict=True):
        assert tb.io_s - ta.io_s == pytest.approx(1e-5 * ta.reads_issued if staged else 0.0, abs=1e-12)
        assert tb.reads_issued == ta.reads_issued


def test_framework_share_slows_prefetch_overlap_more(small_trace, base_profile) -> None:
    """A Python loop (the default decoder, no probes in the profile) contends as framework code:
    larger framework interference constants cost more compute and io than the kernel ones alone."""
    prof = base_profile
    cfg = preset_config("neuroprefetcher").with_overrides(["predictor.rank=0"])
    kernels = _with_host(prof, host_cpu_s_per_read=1e-5, compute_lost_s_per_read=1e-5, read_delay_s_per_read=1e-6)
    fw = _with_host(prof, host_cpu_s_per_read=1e-5, compute_lost_s_per_read=1e-5, read_delay_s_per_read=1e-6,
                    framework_compute_lost_s_per_read=5e-5, framework_read_delay_s_per_read=1e-5)
    a, b = _means(simulate(small_trace, None, kernels, cfg, fast=False)), _means(simulate(small_trace, None, fw, cfg, fast=False))
    assert b["latency_s"] > a["latency_s"] and b["io_s"] > a["io_s"]
    native = ["compute.framework=kernels", "compute.decoder=native"]
    c = _means(simulate(small_trace, None, fw, cfg.with_overrides(native), fast=False))
    d = _means(simulate(small_trace, None, kernels, cfg.with_overrides(native), fast=False))
    assert c == d        # no framework code and a compiled loop: the framework constants never apply
    # a Python layer loop (the default, compute.decoder=python) contends as framework code in every
    # phase, with or without HF modules: the framework constants apply even under framework=kernels
    e = _means(simulate(small_trace, None, fw, cfg.with_overrides(["compute.framework=kernels"]), fast=False))
    assert e["latency_s"] > c["latency_s"] and e["io_s"] > c["io_s"]


def test_python_loop_uses_the_framework_constants_in_every_phase(m1) -> None:
    prof = _with_host(m1, host_cpu_s_per_read=1e-5, compute_lost_s_per_read=2e-5, read_delay_s_per_read=3e-6,
                      compute_lost_s_per_batch=1e-4, framework_compute_lost_s_per_read=7e-5,
                      framework_read_delay_s_per_batch=4e-4)
    native, py = HostCpu.of(prof), HostCpu.of(prof, python_loop=True)
    assert (native.lost_s_per_read, native.delay_s_per_batch) == (2e-5, 0.0)
    # the framework values where the profile has them, the kernel ones where it does not
    assert (py.lost_s_per_read, py.lost_s_per_batch, py.delay_s_per_read, py.delay_s_per_batch) == (7e-5, 1e-4, 3e-6, 4e-4)
    assert py.cpu_share(100, 0.02) == pytest.approx(1 - (100 * 7e-5 + 1e-4) / 0.02)
    assert native.cpu_share(100, 0.02) == pytest.approx(1 - (100 * 2e-5 + 1e-4) / 0.02)


@pytest.mark.parametrize("fast", [False, True])
def test_reader_planning_is_a_stall_before_the_demand_reads(small_trace, base_profile, fast) -> None:
    """flash.plan_s_per_neuron x the neurons a demand batch reads (computed - hits without prefetch) and
    plan_s_per_batch per layer that reads delay the layer (stall, latency) but are not I/O time."""
    cfg = preset_config("llm-in-a-flash").with_overrides(["prefetch=none"])
    a = simulate(small_trace, None, base_profile, cfg, fast=fast)
    b = simulate(small_trace, None, _with_host(base_profile, plan_s_per_neuron=1e-6), cfg, fast=fast)
    c = simulate(small_trace, None, _with_host(base_profile, plan_s_per_batch=1e-4), cfg, fast=fast)
    L = small_trace.spec.n_layers
    assert sum(t.reads_issued for t in a.tokens) > 0
    for ta, tb, tc in zip(a.tokens, b.tokens, c.tokens, strict=True):
        assert tb.io_s == ta.io_s and tc.io_s == ta.io_s
        assert tb.stall_s - ta.stall_s == pytest.approx(1e-6 * (ta.computed - ta.hits), abs=1e-12)
        assert tb.latency_s - ta.latency_s == pytest.approx(tb.stall_s - ta.stall_s, abs=1e-12)
        batches = (tc.stall_s - ta.stall_s) / 1e-4            # layers that read this step
        assert batches == pytest.approx(round(batches), abs=1e-6) and (0 < round(batches) <= L) == (ta.reads_issued > 0)


def test_reader_planning_delays_a_prefetch(small_trace, base_profile) -> None:
    cfg = preset_config("neuroprefetcher").with_overrides(["predictor.rank=0"])
    a = _means(simulate(small_trace, None, base_profile, cfg, fast=False))
    b = _means(simulate(small_trace, None, _with_host(base_profile, plan_s_per_batch=1e-4), cfg, fast=False))
    assert b["io_s"] > a["io_s"]          # prefetch batches land later by their planning


def test_a_steps_prefetches_wait_in_all_at_most_for_its_compute(small_trace, base_profile) -> None:
    """Delta prefetch with a huge per-read delay: the reads' CPU work can only wait for compute that
    runs, and the decoder issues one batch per layer, so each batch waits at most for one layer's
    compute: what a step's prefetches add to io_s is at most that step's compute and memory
    management (the values without the host CPU model: nothing stretched)."""
    cfg = preset_config("neuroprefetcher").with_overrides(["predictor.rank=0"])
    off = simulate(small_trace, None, base_profile, cfg, fast=False)
    zero = simulate(small_trace, None, _with_host(base_profile, host_cpu_s_per_read=1e-5, compute_lost_s_per_read=0.0,
                                                  read_delay_s_per_read=0.0), cfg, fast=False)
    huge = simulate(small_trace, None, _with_host(base_profile, host_cpu_s_per_read=1e-5, compute_lost_s_per_read=0.0,
                                                  read_delay_s_per_read=1.0), cfg, fast=False)
    extra = [h.io_s - z.io_s for z, h in zip(zero.tokens, huge.tokens, strict=True)]
    assert max(extra) > 0
    # the prefetch consumed at step s was issued at step s - 1, next to that step's compute
    for e, prev in zip(extra[1:], off.tokens[:-1]):
        assert e <= prev.compute_s + prev.mem_mgmt_s + 1e-12


def test_a_delta_prefetch_is_issued_when_its_layer_ends(small_trace, base_profile) -> None:
    """The backend issues the delta prefetch of (s + 1, l) after layer l's FFN and cache update (its
    reads land in rows the drop of computed-but-not-kept neurons frees), so the reads' CPU cost
    stretches the next layers, never the FFN of their own layer: every prefetch batch's issue time
    is the end of that layer's FFN interval of step s."""
    cfg = preset_config("neuroprefetcher").with_overrides(["predictor.rank=0"])
    host = _with_host(base_profile, host_cpu_s_per_read=1e-5, compute_lost_s_per_read=5e-5, read_delay_s_per_read=3e-5)
    res = simulate(small_trace, None, host, cfg, fast=False, timeline=True)
    ffn_end = {(iv.step, iv.layer): iv.t_end_s for iv in res.intervals or [] if iv.name.startswith("FFN")}
    batches = [b for b in res.flash_log or [] if b.tag == "prefetch"]
    assert batches
    for b in batches:
        assert b.t_issue_s == pytest.approx(ffn_end[(b.step - 1, b.layer)], abs=1e-15)


@pytest.mark.parametrize(("bundled", "d_model", "segmented"), [(False, 1024, True), (True, 1024, False), (False, 64, False)])
def test_segmented_reads_pay_each_extra_destination_segment(gated_trace, base_profile, bundled, d_model, segmented):
    """flash.segment_s per extra destination buffer of a read: unbundled fp32 rows of d_model 1024
    are exactly 4 KiB, land in place, one cache row each, so a coalesced read of r rows pays r - 1
    (rows read = demand bytes / 4 KiB, reads = reads_issued); bundled runs land in consecutive cache
    rows, and unaligned (staged) rows in one staging buffer: nothing."""
    from tests.sim.helpers import tiny_spec

    spec = tiny_spec(n_layers=3, d_model=d_model, d_ff=192, ffn_kind="swiglu", name="tiny-gated").model_copy(
        update={"dtype": "fp32"})
    cfg = preset_config("llm-in-a-flash").with_overrides(
        ["prefetch=none", f"bundling.bundled={str(bundled).lower()}", "bundling.align_bytes=4096"])
    a = simulate(gated_trace, spec, base_profile, cfg, fast=False)
    b = simulate(gated_trace, spec, _with_host(base_profile, segment_s=1e-4), cfg, fast=False)
    extra = 0
    for ta, tb in zip(a.tokens, b.tokens, strict=True):
        rows = ta.demand_bytes // 4096 if segmented else ta.reads_issued
        assert tb.io_s - ta.io_s == pytest.approx(1e-4 * (rows - ta.reads_issued), abs=1e-12)
        extra += rows - ta.reads_issued
    assert (extra > 0) == segmented


PROBES = dict(framework_probe_op_s=4e-6, kernel_probe_op_s=3e-5, long_kernel_probe_op_s=1e-3,
              long_kernel_compute_lost_s_per_read=5e-6, long_kernel_compute_lost_s_per_batch=1e-4,
              long_kernel_read_delay_s_per_read=0.0, long_kernel_read_delay_s_per_batch=0.0)
HOST = dict(host_cpu_s_per_read=1e-5, compute_lost_s_per_read=2e-5, compute_lost_s_per_batch=0.0,
            read_delay_s_per_read=3e-6, read_delay_s_per_batch=1e-4, framework_compute_lost_s_per_read=3e-5,
            framework_compute_lost_s_per_batch=4e-4, framework_read_delay_s_per_read=8e-6,
            framework_read_delay_s_per_batch=3e-4)


def test_python_loop_terms_follow_its_seconds_per_torch_call(m1) -> None:
    """With the three probes, a Python loop's terms are the probes' linear in log(seconds per call),
    the nearest probe's outside them."""
    prof = _with_host(m1, **HOST, **PROBES)
    assert prof.flash.probe_points() == [(4e-6, 3e-5, 4e-4, 8e-6, 3e-4), (3e-5, 2e-5, 0.0, 3e-6, 1e-4),
                                         (1e-3, 5e-6, 1e-4, 0.0, 0.0)]
    py, native = HostCpu.of(prof, python_loop=True), HostCpu.of(prof)
    assert not native.probes and len(py.probes) == 3
    assert py.at(1e-6) == py.at(4e-6) == (3e-5, 4e-4, 8e-6, 3e-4)
    assert py.at(1.0) == (5e-6, 1e-4, 0.0, 0.0)
    assert py.at(3e-5) == (2e-5, 0.0, 3e-6, 1e-4)
    # the geometric mean of two probes' seconds per call: halfway between their terms
    assert py.at((4e-6 * 3e-5) ** 0.5) == pytest.approx((2.5e-5, 2e-4, 5.5e-6, 2e-4))
    assert py.at((3e-5 * 1e-3) ** 0.5) == pytest.approx((1.25e-5, 5e-5, 1.5e-6, 5e-5))
    op = (3e-5 * 1e-3) ** 0.5
    assert py.cpu_share(100, 0.01, op) == pytest.approx(1 - (100 * 1.25e-5 + 5e-5) / 0.01)     # 0.87
    assert py.delay_s(100, op) == pytest.approx(100 * 1.5e-6 + 5e-5)
    assert py.cpu_share(100, 0.01) == native.cpu_share(100, 0.01)          # no seconds per call: the kernels'
    flash = FlashDevice()
    flash.enable_host_cpu(py)
    end = flash.submit(0.0, 0.01, 1e6, 100, "prefetch", step=0, op_s=op)
    assert end == pytest.approx(0.01 + 100 * 1.5e-6 + 5e-5)
    (a, b, share), = flash.cpu_segments_after(0.0, 4e-6)
    assert share == pytest.approx(1 - (100 * 3e-5 + 4e-4) / end)


def test_probe_terms_validation(m1) -> None:
    _with_host(m1, **HOST, **PROBES)
    with pytest.raises(ValidationError, match="go together"):
        _with_host(m1, **HOST, **{**PROBES, "long_kernel_probe_op_s": None})
    no_fw = {k: v for k, v in HOST.items() if not k.startswith("framework_")}
    with pytest.raises(ValidationError, match="go together"):
        _with_host(m1, **no_fw, **PROBES)
    with pytest.raises(ValidationError, match="must increase"):
        _with_host(m1, **HOST, **{**PROBES, "kernel_probe_op_s": 2e-3})
    assert _with_host(m1, **HOST).flash.probe_points() is None


def test_a_loop_with_shorter_calls_loses_more_to_prefetch(small_trace, base_profile) -> None:
    """The same run on profiles whose probes differ only in their seconds per call: the loop sits
    nearer the framework probe when the probes' calls are longer, and loses more; with every probe
    at the kernel terms the Python loop equals a compiled loop under the kernel terms."""
    cfg = preset_config("neuroprefetcher").with_overrides(["predictor.rank=0", "compute.framework=kernels"])
    near_long = _with_host(base_profile, **HOST, **{**PROBES, "framework_probe_op_s": 1e-9,
                                                    "kernel_probe_op_s": 2e-9, "long_kernel_probe_op_s": 3e-9})
    near_fw = _with_host(base_profile, **HOST, **{**PROBES, "framework_probe_op_s": 10.0,
                                                  "kernel_probe_op_s": 20.0, "long_kernel_probe_op_s": 30.0})
    a = _means(simulate(small_trace, None, near_long, cfg, fast=False))
    b = _means(simulate(small_trace, None, near_fw, cfg, fast=False))
    assert b["latency_s"] > a["latency_s"] and b["io_s"] > a["io_s"]
    flat = {**PROBES, "long_kernel_compute_lost_s_per_read": 2e-5, "long_kernel_compute_lost_s_per_batch": 0.0,
            "long_kernel_read_delay_s_per_read": 3e-6, "long_kernel_read_delay_s_per_batch": 1e-4,
            "kernel_probe_op_s": 1e-4, "long_kernel_probe_op_s": 1e-3}   # the long probe at the kernel terms
    # probes at femtoseconds per call: every layer's loop lies past the long probe
    slow_calls = {k: (v if not k.endswith("probe_op_s") else v * 1e-9) for k, v in flat.items()}
    py = _means(simulate(small_trace, None, _with_host(base_profile, **HOST, **slow_calls), cfg, fast=False))
    native = _means(simulate(small_trace, None, _with_host(base_profile, **HOST),
                             cfg.with_overrides(["compute.decoder=native"]), fast=False))
    assert py == pytest.approx(native)


def test_a_python_loop_loses_the_prefetch_planning(small_trace, base_profile) -> None:
    """A prefetch's planning (flash.plan_s_per_batch / _per_neuron: NumPy on the reader's thread,
    holding the interpreter lock) is compute a Python loop loses whole; a compiled loop, none."""
    py, native = HostCpu(1e-5, 2e-5, 5e-6, python_loop=True), HostCpu(1e-5, 2e-5, 5e-6)
    assert py.cpu_share(100, 0.01, plan_s=1e-3) == pytest.approx(1 - (100 * 2e-5 + 1e-3) / 0.01)    # 0.7
    assert native.cpu_share(100, 0.01, plan_s=1e-3) == native.cpu_share(100, 0.01)
    flash = FlashDevice()
    flash.enable_host_cpu(py)
    end = flash.submit(0.0, 0.01, 1e6, 100, "prefetch", step=0, plan_s=1e-3)
    (a, b, share), = flash.cpu_segments_after(0.0)
    assert share == pytest.approx(1 - (100 * 2e-5 + 1e-3) / end)
    cfg = preset_config("neuroprefetcher").with_overrides(["predictor.rank=0", "compute.framework=kernels"])
    host = _with_host(base_profile, **HOST)
    planned = _with_host(base_profile, **HOST, plan_s_per_batch=2e-4)
    runs = {(loop, p): _means(simulate(small_trace, None, prof, cfg.with_overrides([f"compute.decoder={loop}"]),
                                       fast=False))
            for loop in ("python", "native") for p, prof in (("no", host), ("yes", planned))}
    # the planning delays the prefetch's landing either way (pf_s); only the Python loop also loses it
    d_py = runs["python", "yes"]["compute_s"] - runs["python", "no"]["compute_s"]
    d_native = runs["native", "yes"]["compute_s"] - runs["native", "no"]["compute_s"]
    assert d_py > 0 and d_py > d_native   # (a later landing can even shorten the overlap under native)


def test_each_phase_of_a_python_loop_takes_its_own_seconds_per_call(small_trace, base_profile, monkeypatch) -> None:
    """A Python loop's attention is placed among the probes by the attention's compute over its calls
    (69 in a transformers layer), its memory management and FFN by theirs over the FFN step's 22; a
    compiled loop passes no seconds per call at all."""
    import numpy as np

    from sim.components.compute import LOOP_ATTENTION_OPS, LOOP_FFN_OPS
    from sim.engine import build

    seen: list[float] = []
    orig = FlashDevice.cpu_segments_after

    def spy(self, t_s, op_s=0.0):  # type: ignore[no-untyped-def]
        seen.append(op_s)
        return orig(self, t_s, op_s)

    monkeypatch.setattr(FlashDevice, "cpu_segments_after", spy)
    # a lookahead prefetch is issued at the FFN's start: it overlaps the FFN and the next attention
    cfg = preset_config("neuroprefetcher").with_overrides(["predictor.rank=0", "compute.framework=hf",
                                                           "prefetch=lookahead"])
    sim = build(small_trace, None, _with_host(base_profile, **HOST, **PROBES), cfg)
    sim.run(fast=False)
    p = sim.planner.arr
    a_tot = np.maximum(p.attn.flop_s, p.attn.mem_s) + p.attn.ovh_s                      # [S]
    ffn = (p.mgmt_mem_s + p.mgmt_ovh_s + p.ffn_gather_s + np.maximum(p.ffn_flop_s, p.ffn_mem_s) + p.ffn_ovh_s)
    attention = a_tot / LOOP_ATTENTION_OPS["hf"]
    ffn_step = ffn / LOOP_FFN_OPS                                                          # [S, L]
    layer = (ffn + a_tot[:, None]) / (LOOP_ATTENTION_OPS["hf"] + LOOP_FFN_OPS)           # the lm_head's
    allowed = np.concatenate([attention, ffn_step.ravel(), layer.ravel()])
    assert seen and all(np.isclose(allowed, op).any() for op in seen)
    assert any(np.isclose(attention, op).any() for op in seen)                   # the attention's own rhythm ...
    assert any(np.isclose(ffn_step.ravel(), op).any() for op in seen)            # ... and the FFN step's
    assert not np.allclose(attention[:, None], ffn_step, rtol=0.05)                # two different rhythms
    seen.clear()
    build(small_trace, None, _with_host(base_profile, **HOST, **PROBES), cfg.with_overrides(["compute.decoder=native"])
          ).run(fast=False)
    assert seen and set(seen) == {0.0}
