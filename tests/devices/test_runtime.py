"""The runtime as an input (devices/runtime.py): bundled files with sources, kernel counts and dispatch
cost priced by the compute model by hand, the header, unknown names."""

from __future__ import annotations

import numpy as np
import pytest

from devices.errors import FlashsimError
from devices.model_spec import load_model
from devices.runtime import DEFAULT_RUNTIME, list_runtimes, load_runtime
from devices.schema import load_profile
from flashsim.main import main
from sim.components.compute import ComputeModel
from sim.config import RunConfig
from sim.policies.presets import preset_config


def test_bundled_runtimes_load_with_sources() -> None:
    assert DEFAULT_RUNTIME in list_runtimes() and "eager-pytorch" in list_runtimes()
    for name in list_runtimes():
        rt = load_runtime(name)
        assert rt.name == name
        assert rt.kernels_source.source and rt.dispatch_source.source
        assert rt.kernels.attention_gemvs <= rt.kernels.attention


def test_op_cost_is_the_slower_of_launch_and_dispatch() -> None:
    eager, fused = load_runtime("eager-pytorch"), load_runtime("llama.cpp")
    assert eager.op_s(1e-5) == pytest.approx(1.5e-5)   # the host issues ops slower than the GPU launches them
    assert eager.op_s(4e-5) == pytest.approx(4e-5)
    assert fused.op_s(1e-5) == pytest.approx(1e-5)     # graph-launched: the device's own launch cost


def test_compute_model_prices_the_runtime_kernels_by_hand() -> None:
    spec = load_model("llama-2-7b")
    prof = load_profile("apple-m1-max")   # op_overhead_s 1e-5, no measured GEMV tables
    fused = ComputeModel(spec, prof)
    eager = ComputeModel(spec, prof, runtime=load_runtime("eager-pytorch"))
    n, c = np.array([1.0]), np.array([[1000.0]])
    assert fused.ffn(n, c).ovh_s[0, 0] == pytest.approx((3 + 3 + 1) * 1e-5)    # base 3 + 3 GEMVs + gather
    assert eager.ffn(n, c).ovh_s[0, 0] == pytest.approx((9 + 3 + 1) * 1.5e-5)
    one = np.array([1.0])
    assert fused.attention(one, one, one, np.array([True])).ovh_s[0] == pytest.approx(8 * 1e-5)
    assert eager.attention(one, one, one, np.array([True])).ovh_s[0] == pytest.approx(24 * 1.5e-5)
    assert eager.head(1, one).ovh_s[0] == pytest.approx(8 * 1.5e-5 + spec.vocab_size * eager.row_s)


def test_unknown_runtime_names_close_matches() -> None:
    with pytest.raises(FlashsimError, match="unknown runtime 'eager'; did you mean 'eager-pytorch'"):
        RunConfig.from_dict({**preset_config("naive").to_dict(), "compute": {"runtime": "eager"}})


def test_replay_header_names_the_runtime(capsys: pytest.CaptureFixture) -> None:
    args = ["replay", "--trace", "traces/data/smollm2-135m-builtin", "--device", "jetson-orin-nano-8gb",
            "--preset", "naive", "--tokens", "4"]
    assert main([*args, "--runtime", "eager-pytorch"]) == 0
    eager = capsys.readouterr().out
    assert "runtime eager-pytorch" in eager.splitlines()[0]
    assert main(args) == 0
    assert f"runtime {DEFAULT_RUNTIME}" in capsys.readouterr().out.splitlines()[0]
