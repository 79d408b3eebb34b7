"""The CUDA branches of the compute benches (real/bench/bench_cuda.py) and of real/runtime/device.py, run on the CPU
with torch.cuda replaced at the torch boundary only: is_available, get_device_properties,
synchronize, cudart's cudaHostRegister, and Tensor.to for a CUDA target (the tensor stays on the CPU,
the call is recorded). What is asserted: which tensors go to the GPU with which shapes and dtypes,
that the gather scratch is page-locked (and released), that the host-to-device copies are
asynchronous and every timed phase ends at a synchronize, and that the results make valid profile
sections."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from devices.schema import ComputeSpec, MemorySpec, load_profile
from real.bench import bench_cuda as BC
from real.runtime.device import (
    CUDA_HOST_REGISTER_DEFAULT,
    CUDA_HOST_REGISTER_MAPPED,
    ComputeDevice,
    choose_device,
)

torch = pytest.importorskip("torch")


class FakeCuda:
    """The torch.cuda boundary of one fake GPU; `log` holds ("to", shape, dtype, non_blocking) and
    ("sync",) in call order, `registered` / `unregistered` the cudaHostRegister calls."""

    def __init__(self, monkeypatch, *, integrated: bool, major: int):
        self.log: list[tuple] = []
        self.registered: list[tuple[int, int, int]] = []
        self.unregistered: list[int] = []
        self.props = SimpleNamespace(name="Fake Orin" if integrated else "Fake RTX", is_integrated=integrated,
                                     major=major, minor=7, total_memory=16 << 30, L2_cache_size=1 << 20)
        fake = self
        original_to = torch.Tensor.to

        class Cudart:
            def cudaHostRegister(self, ptr, nbytes, flags):  # noqa: N802 (the CUDA runtime's name)
                fake.registered.append((ptr, nbytes, flags))
                return 0

            def cudaHostUnregister(self, ptr):  # noqa: N802
                fake.unregistered.append(ptr)
                return 0

        def to(t, *args, **kwargs):
            target = kwargs.get("device", args[0] if args else None)
            if isinstance(target, (str, torch.device)) and torch.device(target).type == "cuda":
                fake.log.append(("to", tuple(t.shape), t.dtype, bool(kwargs.get("non_blocking", False))))
                return t
            return original_to(t, *args, **kwargs)

        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i=0: self.props)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: fake.log.append(("sync",)))
        monkeypatch.setattr(torch.cuda, "cudart", lambda: Cudart())
        monkeypatch.setattr(torch.Tensor, "to", to)

    def moved(self, shape: tuple[int, ...], dtype=None, non_blocking: bool | None = None) -> int:
        return sum(1 for e in self.log if e[0] == "to" and e[1] == shape and (dtype is None or e[2] == dtype)
                   and (non_blocking is None or e[3] == non_blocking))


@pytest.fixture
def small(monkeypatch):
    """Small grids and pools, so the whole CUDA bench runs on the CPU in seconds."""
    from real.bench import bench_dense_gemv, bench_sparse_ffn
    monkeypatch.setattr(BC, "QUICK_SHAPE", (512, 256))
    monkeypatch.setattr(BC, "QUICK_MIN_POOL_BYTES", 1 << 20)
    monkeypatch.setattr(BC, "QUICK_COPY_BYTES", 1 << 20)
    monkeypatch.setattr(BC, "OP_REPS", 20)
    monkeypatch.setattr(bench_sparse_ffn, "QUICK_D_MODEL", (128, 256))
    monkeypatch.setattr(bench_sparse_ffn, "QUICK_NEURONS", (16, 64))
    monkeypatch.setattr(bench_dense_gemv, "QUICK_IN_FEATURES", (128, 256))
    monkeypatch.setattr(bench_dense_gemv, "QUICK_OUT_FEATURES", (64, 512))


def test_choose_device_reads_the_gpu_and_pins_mapped_on_unified_memory(monkeypatch):
    from real.io.buffers import AlignedBuffer
    from real.runtime.device import pin_host_buffer, unpin_host_buffer

    fake = FakeCuda(monkeypatch, integrated=True, major=8)
    dev = choose_device("auto")
    assert dev == ComputeDevice("cuda", "Fake Orin", True) and choose_device("cuda") == dev
    buf = AlignedBuffer(1 << 16)
    handle = pin_host_buffer(buf.array, dev)
    unpin_host_buffer(handle)
    assert fake.registered == [(buf.array.ctypes.data, 1 << 16, CUDA_HOST_REGISTER_MAPPED)]
    assert fake.unregistered == [buf.array.ctypes.data]
    fake.props.is_integrated = False                        # a discrete GPU: plain page-locking
    dev = choose_device("cuda")
    pin_host_buffer(buf.array, dev)
    assert fake.registered[-1][2] == CUDA_HOST_REGISTER_DEFAULT and not dev.unified_memory


def test_bf16_only_from_compute_capability_8():
    assert list(BC.cuda_dtypes(torch, 8)) == ["fp32", "fp16", "bf16"]
    assert list(BC.cuda_dtypes(torch, 7)) == ["fp32", "fp16"]       # Volta / Xavier: no bf16 arithmetic


def test_sync_batch_times_calls_between_two_synchronizes(monkeypatch):
    fake = FakeCuda(monkeypatch, integrated=True, major=8)
    calls = []
    s = BC.sync_batch_s(torch, lambda r: (calls.append(r), fake.log.append(("call", r))), 4)
    assert s >= 0 and calls == [0, 0, 1, 2, 3]
    # warm-up, sync, then the four calls back to back, then one sync
    assert fake.log == [("call", 0), ("sync",), ("call", 0), ("call", 1), ("call", 2), ("call", 3), ("sync",)]


@pytest.mark.parametrize("integrated, major", [(True, 8), (False, 7)])
def test_cuda_bench_runs_the_backends_cuda_path(monkeypatch, small, integrated, major):
    from real.bench.bench_sparse_ffn import KERNELS

    fake = FakeCuda(monkeypatch, integrated=integrated, major=major)
    dev = choose_device("cuda")
    res = BC.run_cuda_compute_bench(torch, dev, quick=True, seed=0)
    dtypes = {"fp32": torch.float32, "fp16": torch.float16, **({"bf16": torch.bfloat16} if major >= 8 else {})}
    assert list(res["per_dtype"]) == list(dtypes)

    # dense GEMV: the [M, K] weights go to the GPU in each dtype, in distinct copies filling the pool
    for name, tdt in dtypes.items():
        n = res["per_dtype"][name]["pool_matrices"]
        assert res["device"]["pool_bytes"] == 4 << 20              # 4 x the 1 MiB L2 (> the 1 MiB minimum)
        assert n == max(2, -(-(4 << 20) // (512 * 256 * tdt.itemsize)))
        assert fake.moved((512, 256), tdt) == n
        assert res["per_dtype"][name]["dense_gemv_flops_per_s"] > 0
    # the sparse FFN: every (d_model, neurons) cell copies the gathered segments [k, d] to the GPU
    # asynchronously (from the page-locked scratch), in each dtype
    for tdt in dtypes.values():
        for d in (128, 256):
            for k in (16, 64):
                assert fake.moved((k, d), tdt, non_blocking=True) >= 3 * 4     # 3 segments x >= MIN_REPS + 1
    # ... and each phase is timed to a synchronize: the three copies, then a sync
    for i, e in enumerate(fake.log):
        if e[0] == "to" and e[3] and (i + 1 == len(fake.log) or fake.log[i + 1][0] != "to"):
            assert fake.log[i + 1] == ("sync",)
    # the gather scratch and the host-to-device buffer were page-locked, with the flags of the
    # device's memory, page-aligned, and every registration released
    flags = CUDA_HOST_REGISTER_MAPPED if integrated else CUDA_HOST_REGISTER_DEFAULT
    assert fake.registered and all(f == flags and p % 4096 == 0 for p, _, f in fake.registered)
    assert sorted(p for p, _, _ in fake.registered) == sorted(fake.unregistered)
    assert any(nbytes == 1 << 20 for _, nbytes, _ in fake.registered)      # the H2D probe's buffer

    sp = res["sparse_ffn"]
    assert list(sp) == list(dtypes)
    assert all(len(sp[n][kk]) == 2 and all(v > 0 for row in sp[n][kk] for v in row) for n in sp for kk in KERNELS)
    dg = res["dense_gemv"]["fp32"]
    assert dg["in_features"] == [128, 256] and dg["out_features"] == [64, 512]
    mem = res["memory"]
    assert mem["stream_copy_bytes_per_s"] > 0 and mem["stream_triad_bytes_per_s"] > 0 and mem["h2d_bytes_per_s"] > 0
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert res["memory_capacity_bytes"] == (ram if integrated else 16 << 30)
    assert res["op_overhead_s"] > 0 and res["device"]["capability"] == [major, 7]

    # the profile sections: the GPU's fields, the host-side ones kept from a CPU bench's section
    cpu = load_profile("this-host").compute.model_dump(mode="json", exclude_none=True)
    compute, memory = BC.cuda_compute_sections(res, cpu, "2026-12-04", "flashsim bench compute --device cuda",
                                               "measured by flashsim bench compute")
    # The stand-in's rates are CPU timings of tiny ops (a copy that is no copy, fp16 GEMVs without fp16
    # units), not a GPU's: lift the ones below the plausibility floors of devices/limits.py (checked on
    # real profiles in tests/devices) into range, so this checks the sections' structure.
    compute = {**compute, "gemv_flops_per_s": {k: max(v, 1e9) for k, v in compute["gemv_flops_per_s"].items()}}
    memory = {**memory, "bandwidth_bytes_per_s": max(memory["bandwidth_bytes_per_s"], 1e10)}
    spec = ComputeSpec.model_validate(compute)
    assert set(spec.gemv_flops_per_s) == set(dtypes) and spec.gemv_row_s == 0.0 and spec.transpose_bytes_per_s is None
    assert set(cpu) - set(BC.GPU_FIELDS) <= {"source", "threads"}    # no host-side compute term left to keep
    assert spec.gemv_flops_per_s["fp32"] == pytest.approx(res["per_dtype"]["fp32"]["dense_gemv_flops_per_s"], rel=1e-3)
    assert "CUDA on Fake" in spec.source and "host-side terms" not in spec.source
    assert memory["unified"] is integrated and "unified from cudaDeviceProp.integrated" in memory["source"]
    MemorySpec.model_validate({"reserved_bytes": 1 << 20, **memory})
    assert "on the GPU" in memory["source"]


def test_bench_compute_device_cuda_writes_the_gpu_section(monkeypatch, small, tmp_path, capsys):
    from flashsim.main import main

    FakeCuda(monkeypatch, integrated=True, major=8)
    # the stand-in's "GPU" rates are CPU timings of tiny ops, below the plausibility floors a real GPU's
    # clear (devices/limits.py): widen those two floors for this test of the writing path
    from devices import limits
    wide = {"MemorySpec.bandwidth_bytes_per_s", "MemorySpec.sustained_bandwidth_bytes_per_s",
            "ComputeSpec.gemv_flops_per_s"}
    monkeypatch.setattr(limits, "FIELD_LIMITS", [(k, limits.Limit(0, lim.hi, lim.unit, lim.reason) if k in wide else lim)
                                                 for k, lim in limits.FIELD_LIMITS])
    out = tmp_path / "gpu.yaml"
    assert main(["bench", "compute", "--device", "cuda", "--quick", "--out", str(out), "--name", "gpu-test",
                 "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    prof = load_profile(out)
    assert res["device"]["name"] == "Fake Orin" and "--device cuda" in res["command"]
    assert prof.compute.source.startswith("measured by flashsim bench compute") and "CUDA on Fake Orin" in prof.compute.source
    assert prof.memory.bandwidth_bytes_per_s == pytest.approx(res["memory"]["stream_copy_bytes_per_s"], rel=1e-3)
    assert prof.compute.sparse_ffn is not None and set(prof.compute.sparse_ffn.tables) == {"fp32", "fp16", "bf16"}


def test_calibrate_writes_a_cuda_profile_beside_the_cpu_one(monkeypatch, small, tmp_path):
    import argparse

    from flashsim.commands.calibrate import _cuda_profile

    FakeCuda(monkeypatch, integrated=True, major=8)
    dev = choose_device("cuda")
    cpu_prof = load_profile("this-host")
    target = tmp_path / "orin.yaml"
    args = argparse.Namespace(name="orin", path="/mnt/nvme/x", quick=True, seed=0, threads=1)
    info = _cuda_profile(args, cpu_prof, target, dev)
    gpu = load_profile(tmp_path / "orin-cuda.yaml")
    assert info["path"] == str(tmp_path / "orin-cuda.yaml") and gpu.name == "orin-cuda"
    assert gpu.flash == cpu_prof.flash                                     # the flash just measured, as is
    assert "CUDA on Fake Orin" in gpu.compute.source and "/mnt/nvme/x" in gpu.description
    assert not target.exists()                                             # the CPU profile is the caller's
    assert gpu.memory.unified and "memory.unified" in gpu.source.notes.split(";")[0]    # measured, not carried


def test_device_cuda_without_a_gpu_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    from flashsim.main import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", "compute", "--device", "cuda", "--quick", "--no-write"]) == 2
    disk = tmp_path / "disk"
    disk.mkdir()
    assert main(["calibrate", "--path", str(disk), "--device", "cuda", "--quick", "--out", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("no CUDA device") == 2 and "Traceback" not in err
    assert list(disk.iterdir()) == [] and not (tmp_path / "p.yaml").exists()


def test_cpu_section_is_kept_only_when_the_cpu_bench_measured_it():
    prof = load_profile("jetson-orin-nano-8gb")            # a datasheet compute section
    assert BC.measured_cpu_compute(prof) is None
    here = load_profile("this-host")
    kept = BC.measured_cpu_compute(here)
    assert (kept is not None) == here.compute.source.startswith("measured by flashsim bench compute")
    assert BC._pool_bytes(60 << 20, False) == 256 << 20 and BC._pool_bytes(100 << 20, False) == 400 << 20


def test_run_on_falls_back_to_the_cpu_bench_without_a_gpu_and_refuses_numpy_on_cuda(monkeypatch):
    from devices.errors import FlashsimError
    from real.bench import bench_compute
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(bench_compute, "run_compute_bench", lambda **kw: {"cpu_bench": kw})
    assert BC.run_on("auto", quick=True, threads=2) == {"cpu_bench": {"quick": True, "framework": "auto", "seed": 0,
                                                                      "threads": 2}}
    FakeCuda(monkeypatch, integrated=True, major=8)
    with pytest.raises(FlashsimError, match="drop --framework numpy"):
        BC.run_on("cuda", framework="numpy")
    with pytest.raises(FlashsimError, match="--threads 0"):
        BC.run_on("auto", threads=0)
