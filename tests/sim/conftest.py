"""Fixtures for the simulator tests: small seeded traces (built once per session) and devices."""

from __future__ import annotations

from pathlib import Path

import pytest

from devices import load_profile
from devices.schema import DeviceProfile
from tests.sim.helpers import dense_trace, tiny_spec
from traces.format import Trace, open_trace


@pytest.fixture(scope="session")
def traces_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sim_traces")


@pytest.fixture(scope="session")
def small_trace(traces_dir: Path) -> Trace:
    """2 layers x 256 ReLU neurons, 2 prompts (tasks qa, mt) of 4 prompt + 16 generated tokens."""
    spec = tiny_spec()
    return open_trace(dense_trace(traces_dir / "small", spec, n_prompt=4, n_gen=16, n_prompts=2, tasks=("qa", "mt")))


@pytest.fixture(scope="session")
def gated_trace(traces_dir: Path) -> Trace:
    """A SwiGLU-shaped (3 matrices) trace of 3 layers x 192 neurons, no prompt tokens."""
    spec = tiny_spec(n_layers=3, d_ff=192, ffn_kind="swiglu", name="tiny-gated")
    return open_trace(dense_trace(traces_dir / "gated", spec, n_prompt=0, n_gen=24, seed=3))


@pytest.fixture(scope="session")
def host() -> DeviceProfile:
    return load_profile("this-host")


@pytest.fixture(scope="session")
def m1() -> DeviceProfile:
    return load_profile("apple-m1-max")


@pytest.fixture(scope="session")
def recorded_path(traces_dir):  # type: ignore[no-untyped-def]
    """Another trace of the small trace's shape: its masks serve as recorded predictions."""
    p = traces_dir / "recorded"
    if not p.exists():
        dense_trace(p, tiny_spec(), n_prompt=4, n_gen=16, n_prompts=2, tasks=("qa", "mt"), seed=11)
    return p


@pytest.fixture(scope="session")
def base_profile() -> DeviceProfile:
    """this-host without the host CPU fields (that model off)."""
    data = load_profile("this-host").model_dump(mode="json", exclude_none=True)
    for k in ("host_cpu_s_per_read", "compute_lost_s_per_read", "read_delay_s_per_read", "compute_lost_s_per_batch",
              "read_delay_s_per_batch", "framework_compute_lost_s_per_read", "framework_compute_lost_s_per_batch",
              "framework_read_delay_s_per_read", "framework_read_delay_s_per_batch", "staged_s_per_read",
              "batch_overhead_s", "batch_overhead_reads_per_thread", "batch_overhead_by_ratio_s", "plan_s_per_batch", "plan_s_per_neuron",
              "segment_s",
              "framework_probe_op_s", "kernel_probe_op_s", "long_kernel_probe_op_s", "long_kernel_compute_lost_s_per_read",
              "long_kernel_compute_lost_s_per_batch", "long_kernel_read_delay_s_per_read",
              "long_kernel_read_delay_s_per_batch"):
        data["flash"].pop(k, None)
    return DeviceProfile.model_validate(data)
