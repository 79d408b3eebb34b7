"""The device-specific part of the real backend, kept small and named: where compute runs and how
host buffers are made visible to it.

* CPU (this host, and what the tests run): compute on host memory; buffers are the page-aligned
  mappings of `real.io.buffers.AlignedBuffer`, which direct I/O reads land in.
* CUDA (a desktop GPU or a Jetson): the same host buffers are page-locked in place with
  `cudaHostRegister`, so the GPU can DMA from them without a bounce copy. The real backend gathers
  the computed rows into a scratch that `HostScratch` allocates page-aligned and pins on CUDA, so
  its `.to(device, non_blocking=True)` copies are asynchronous (from pageable memory they are not). On a Jetson (unified
  memory: `torch.cuda.get_device_properties(0).is_integrated`) CPU and GPU share the DRAM; a
  registered buffer is then directly addressable by kernels (zero copy), which is what the
  LLM-in-a-flash style neuron cache wants. This path needs a CUDA build of torch and is tested
  only on hardware (`pytest -m hardware`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

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


class HostScratch:
    """A growable [rows, width] uint8 host buffer for the rows the compute reads. On CUDA it is
    page-aligned (AlignedBuffer) and page-locked with `pin` (pin_host_buffer) until it grows or
    closes; on the CPU it is a plain NumPy array (what bench compute's gathers write into)."""

    def __init__(self, device: ComputeDevice, pin: Any = None, unpin: Any = None):
        self.device = device
        self._pin, self._unpin = pin or pin_host_buffer, unpin or unpin_host_buffer
        self._buf: Any = None
        self._handle: Any = None
        self.array: Any = None

    def get(self, rows: int, width: int) -> Any:
        """The buffer with at least `rows` rows of exactly `width` bytes (reallocated, and pinned
        again, when it must grow)."""
        from real.io.buffers import AlignedBuffer

        if self.array is not None and self.array.shape[0] >= rows and self.array.shape[1] == width:
            return self.array
        self.close()
        if self.device.kind != "cuda":
            self.array = np.empty((rows, width), np.uint8)
            return self.array
        self._buf = AlignedBuffer(max(1, rows) * width)
        self.array = self._buf.view2d(rows, width)
        self._handle = self._pin(self.array, self.device)
        return self.array

    def close(self) -> None:
        self._unpin(self._handle)
        self._handle = None
        self.array = None
