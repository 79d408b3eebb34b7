"""The device-specific part of the real backend, kept small and named: where compute runs and how
host buffers are made visible to it.

* CPU (this host, and what the tests run): compute on host memory; buffers are the page-aligned
  mappings of `real.buffers.AlignedBuffer`, which direct I/O reads land in.
* CUDA (a desktop GPU or a Jetson): the same host buffers are page-locked in place with
  `cudaHostRegister`, so the GPU can DMA from them without a bounce copy. On a Jetson (unified
  memory: `torch.cuda.get_device_properties(0).is_integrated`) CPU and GPU share the DRAM; a
  registered buffer is then directly addressable by kernels (zero copy), which is what the
  LLM-in-a-flash style neuron cache wants. This path needs a CUDA build of torch and is tested
  only on hardware (`pytest -m hardware`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from devices.errors import FlashsimError

CUDA_HOST_REGISTER_DEFAULT = 0    # cudaHostRegisterDefault
CUDA_HOST_REGISTER_MAPPED = 2     # cudaHostRegisterMapped: device pointer for zero-copy access


@dataclass(frozen=True)
class ComputeDevice:
    kind: str              # "cpu" or "cuda"
    name: str
    unified_memory: bool   # CPU and accelerator share one DRAM (Jetson, Apple silicon, CPU-only)

    def torch_device(self) -> Any:
        import torch

        return torch.device(self.kind)


def choose_device(preference: str = "auto") -> ComputeDevice:
    """"cpu", "cuda" or "auto" (CUDA when torch sees a GPU, else CPU)."""
    if preference not in ("auto", "cpu", "cuda"):
        raise FlashsimError(f"--device {preference}: choose auto, cpu or cuda")
    if preference == "cpu":
        return ComputeDevice("cpu", "cpu", True)
    try:
        import torch
    except ImportError:
        if preference == "cuda":
            raise FlashsimError("--device cuda needs torch with CUDA; install flashsim[real]") from None
        return ComputeDevice("cpu", "cpu", True)
    if not torch.cuda.is_available():
        if preference == "cuda":
            raise FlashsimError("--device cuda: torch sees no CUDA device on this host")
        return ComputeDevice("cpu", "cpu", True)
    props = torch.cuda.get_device_properties(0)
    return ComputeDevice("cuda", props.name, bool(getattr(props, "is_integrated", False)))


def pin_host_buffer(array: Any, device: ComputeDevice) -> Any:
    """Page-lock a page-aligned host NumPy buffer in place for `device` (a no-op on CPU).

    Returns a handle to pass to `unpin_host_buffer`, or None when nothing was done."""
    if device.kind != "cuda":
        return None
    import torch

    cudart = torch.cuda.cudart()
    flags = CUDA_HOST_REGISTER_MAPPED if device.unified_memory else CUDA_HOST_REGISTER_DEFAULT
    ptr, nbytes = array.ctypes.data, array.nbytes
    err = cudart.cudaHostRegister(ptr, nbytes, flags)
    if int(err) != 0:
        raise FlashsimError(f"cudaHostRegister of {nbytes} bytes failed (error {int(err)})")
    return ptr


def unpin_host_buffer(handle: Any) -> None:
    if handle is None:
        return
    import torch

    torch.cuda.cudart().cudaHostUnregister(handle)
