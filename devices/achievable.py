"""Achievable vs peak: which of a profile's numbers the simulator uses, power modes, and where each
input comes from.

A bundled profile carries two sets of numbers side by side (devices/schema.py): the **peaks** in the
fields the simulator reads (datasheet DRAM bandwidth, GEMV FLOP rate, the SSD's closed form) and the
**achievable** numbers beside them, each with its own source and kind (measured / published /
datasheet / estimate): the DRAM bandwidth a batch-1 decode sustains, the dense GEMV's efficiency per
dtype, the sparse gather + GEMV's efficiency, a published random-read table over request size and
queue depth, and the CPU each read request costs through the I/O path.

`at_bound(profile, "achievable")` (the simulator's default) folds the achievable numbers into the
fields the simulator reads:
  * memory.bandwidth_bytes_per_s <- memory.sustained_bandwidth_bytes_per_s;
  * compute.gemv_efficiency stays (sim/components/compute.py streams a run's weights at the sustained
    bandwidth x the efficiency of its dtype);
  * compute.gather_bytes_per_s <- the rate that makes gather + GEMV over the selected rows take
    1 / sparse_gemv_efficiency of the dense GEMV's time per byte: with D the dense GEMV rate (fp16)
    and s the efficiency, b / G + b / D = b / (s D), so G = D s / (1 - s), never above the profile's
    own gather_bytes_per_s (the peak bound's rate, so the ceiling stays a ceiling);
  * flash.read_table <- flash.read_table_achievable; flash.request_cpu_s stays (FlashSpec.curve caps
    the reads at io_cores / request_cpu_s requests per second, devices/curves.py CpuBoundReadCurve)
    unless the profile's I/O CPU is already measured (bench flash's batch overheads or host-CPU
    terms: `FlashSpec.measured_io_cpu`), where it is dropped so nothing is counted twice;
  * where the compute itself runs on the CPU (compute.cpu_cores set) each read also takes
    request_cpu_s / cpu_cores of the decoder's time while both run (flash.host_cpu_s_per_read and
    compute_lost_s_per_read, sim/components/compute.py HostCpu); the read itself is not delayed
    (the kernel's completion work preempts user compute).
`at_bound(profile, "peak")` drops every achievable number and, on a profile that is not measured, the
estimated per-kernel launch overhead (a fused or graph-replayed runtime pays close to none): the
datasheet ceiling, which no real run beats.

Power modes (`power_modes` in the profile, `name@MODE` on the command line, devices/power_modes.py)
are applied when the profile is loaded, before the bound is folded. A mode that sets energy numbers
(`energy.compute_busy_w.value`) relabels the energy section with its name; one that sets none keeps the
numbers of the mode they were published for, and `inputs()` names that mode.
"""

from __future__ import annotations

from typing import Any

from devices.errors import FlashsimError
from devices.schema import DeviceProfile

BOUNDS = ("achievable", "peak")


def _validate(data: dict[str, Any], where: str) -> DeviceProfile:
    from pydantic import ValidationError

    try:
        return DeviceProfile.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise FlashsimError(f"device {where}: field {loc!r}: {err['msg']}") from None


def at_bound(profile: DeviceProfile, bound: str = "achievable") -> DeviceProfile:
    """The profile whose simulator-facing fields hold the `bound` numbers (module docstring); a
    profile already folded comes back as it is (folding is done once)."""
    if bound not in BOUNDS:
        raise FlashsimError(f"--bound {bound}: choose one of {', '.join(BOUNDS)}")
    if profile.bound != "raw":
        if profile.bound != bound:
            raise FlashsimError(f"device {profile.name}: already folded to {profile.bound}; load it again for {bound}")
        return profile
    data = profile.model_dump()
    mem, comp, fl = data["memory"], data["compute"], data["flash"]
    if bound == "achievable":
        if mem["sustained_bandwidth_bytes_per_s"] is not None:
            mem["bandwidth_bytes_per_s"] = mem["sustained_bandwidth_bytes_per_s"]
        s = comp["sparse_gemv_efficiency"]
        if s is not None:
            dense = mem["bandwidth_bytes_per_s"] * profile.compute.gemv_efficiency_for("fp16")
            comp["gather_bytes_per_s"] = min(dense * s / (1.0 - s), comp["gather_bytes_per_s"])
        if fl["read_table_achievable"] is not None:
            fl["read_table"] = fl["read_table_achievable"]
        if profile.flash.measured_io_cpu:
            fl["request_cpu_s"] = None
        elif fl["request_cpu_s"] and comp.get("cpu_cores"):
            per_read = fl["request_cpu_s"] / comp["cpu_cores"]
            fl.update(host_cpu_s_per_read=per_read, compute_lost_s_per_read=per_read, read_delay_s_per_read=0.0)
    else:
        if profile.source.kind != "measured":
            # a datasheet profile's per-kernel launch overhead is an estimate of one runtime; a runtime
            # that fuses kernels or replays a graph pays close to none, so the ceiling charges none
            comp["op_overhead_s"] = 0.0
        mem["sustained_bandwidth_bytes_per_s"] = mem["sustained_bandwidth_source"] = None
        comp["gemv_efficiency"] = comp["gemv_efficiency_source"] = None
        comp["sparse_gemv_efficiency"] = comp["sparse_gemv_efficiency_source"] = None
        fl["read_table_achievable"] = fl["read_table_achievable_source"] = None
        fl["request_cpu_s"] = fl["request_cpu_source"] = None
    out = _validate(data, profile.name)
    out._power_mode = profile.power_mode
    out._bound = bound
    return out


def resolved(profile: DeviceProfile, bound: str | None = None) -> DeviceProfile:
    """What the simulator runs on: a raw profile folded to `bound` (default achievable); a folded
    one as it is (a different `bound` than its own is an error)."""
    if profile.bound != "raw" and bound is None:
        return profile
    return at_bound(profile, bound or "achievable")


def _peak_kind(profile: DeviceProfile) -> str:
    return "measured" if profile.source.kind == "measured" else "datasheet"


def inputs(profile: DeviceProfile, bound: str = "achievable", dtype: str | None = None) -> list[dict[str, Any]]:
    """Each device input the simulator uses at `bound` on a raw profile (power mode applied): name,
    value, kind (measured / published / datasheet / estimate) and source."""
    m, c, f = profile.memory, profile.compute, profile.flash
    peak = _peak_kind(profile)
    ach = bound == "achievable"
    rows: list[dict[str, Any]] = []

    def add(name: str, value: Any, kind: str, source: str) -> None:
        rows.append({"input": name, "value": value, "kind": kind, "source": source})

    if ach and m.sustained_bandwidth_bytes_per_s is not None and m.sustained_bandwidth_source is not None:
        add("dram_bandwidth_bytes_per_s", m.sustained_bandwidth_bytes_per_s, m.sustained_bandwidth_source.kind,
            m.sustained_bandwidth_source.source)
    else:
        add("dram_bandwidth_bytes_per_s", m.bandwidth_bytes_per_s, peak, m.source)
    if ach and c.gemv_efficiency and c.gemv_efficiency_source is not None:
        eff = c.gemv_efficiency_for(dtype) if dtype else dict(c.gemv_efficiency)
        add("gemv_efficiency" + (f"_{dtype}" if dtype else ""), eff, c.gemv_efficiency_source.kind,
            c.gemv_efficiency_source.source)
    if ach and c.sparse_gemv_efficiency is not None and c.sparse_gemv_efficiency_source is not None:
        add("sparse_gemv_efficiency", c.sparse_gemv_efficiency, c.sparse_gemv_efficiency_source.kind,
            c.sparse_gemv_efficiency_source.source)
    else:
        add("gather_bytes_per_s", c.gather_bytes_per_s, peak if profile.source.kind == "measured" else "estimate",
            c.source)
    add("gemv_flops_per_s", dict(c.gemv_flops_per_s), peak, c.source)
    if ach and f.read_table_achievable is not None and f.read_table_achievable_source is not None:
        add("flash_read_table", "published table", f.read_table_achievable_source.kind,
            f.read_table_achievable_source.source)
    elif f.read_table is not None:
        add("flash_read_table", "measured table", peak, f.source)
    else:
        add("flash_read_model", "closed form (sequential, latency, iops_max)", peak, f.source)
    if ach and f.request_cpu_s and f.request_cpu_source is not None and not f.measured_io_cpu:
        add("flash_request_cpu_s", f.request_cpu_s, f.request_cpu_source.kind,
            f.request_cpu_source.source + f" (I/O path on {f.io_cores or 1} cores)")
    cal = profile.source.calibration
    if cal is not None:
        # what `flashsim calibrate` found when it wrote this profile (devices/section_base.py Calibration)
        add("calibration", f"{cal.mode} calibration on {cal.date}, verdict {cal.verdict}", "measured",
            "; ".join(x for x in (cal.detail, f"next: {cal.next_step}" if cal.next_step else None) if x))
    elif profile.source.kind == "measured":
        add("calibration", "no verdict recorded", "measured",
            "written by flashsim bench or an earlier calibrate, which did not record one: run flashsim calibrate")
    if profile.power_modes is not None and profile.power_mode is not None:
        pm = profile.power_modes.modes[profile.power_mode]
        add("power_mode", profile.power_mode, "datasheet", f"{pm.description} [{pm.source}]")
        e = profile.energy
        if e is not None and e.power_mode is not None and e.power_mode.lower() != profile.power_mode.lower():
            # the energy numbers were taken in another mode (none published for this one): say so
            add("energy_power_mode", e.power_mode, "estimate",
                f"the energy numbers hold for power mode {e.power_mode}, not {profile.power_mode}: no "
                f"published energy figure for {profile.power_mode}; its clocks draw less (lower modes) or "
                f"more (higher modes) than these")
    return rows


def inputs_by_kind(rows: list[dict[str, Any]]) -> dict[str, list[str]]:
    """{kind: [input names]} of `inputs()`' rows, for one-line summaries."""
    out: dict[str, list[str]] = {}
    for r in rows:
        out.setdefault(r["kind"], []).append(r["input"])
    return out
