"""Device selection: the CPU path runs here; CUDA pinning is checked on hardware only."""

from __future__ import annotations

import numpy as np
import pytest

from devices.errors import FlashsimError
from real.io.buffers import AlignedBuffer
from real.runtime.device import choose_device, pin_host_buffer, unpin_host_buffer


def test_cpu_is_chosen_and_needs_no_pinning():
    dev = choose_device("cpu")
    assert (dev.kind, dev.unified_memory) == ("cpu", True)
    assert pin_host_buffer(AlignedBuffer(4096).array, dev) is None
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        assert choose_device("auto").kind == "cpu"
        with pytest.raises(FlashsimError, match="no CUDA device"):
            choose_device("cuda")
    with pytest.raises(FlashsimError, match="choose auto, cpu or cuda"):
        choose_device("tpu")


@pytest.mark.hardware
def test_cuda_pins_an_aligned_buffer_in_place():
    torch = pytest.importorskip("torch")
    dev = choose_device("cuda")
    buf = AlignedBuffer(1 << 20)
    handle = pin_host_buffer(buf.array, dev)
    try:
        t = torch.from_numpy(buf.array)
        assert t.is_pinned()
        assert torch.equal(t.to(dev.torch_device()).cpu(), t)
    finally:
        unpin_host_buffer(handle)


def test_host_scratch_pins_on_cuda_only_and_repins_when_it_grows():
    from real.runtime.device import ComputeDevice, HostScratch

    cpu = HostScratch(ComputeDevice("cpu", "cpu", True), pin=lambda a, d: pytest.fail("pinned on the CPU"))
    a = cpu.get(4, 8256)
    assert a.shape == (4, 8256) and a.dtype == np.uint8 and cpu.get(3, 8256) is a
    calls = []
    gpu = HostScratch(ComputeDevice("cuda", "fake", True), pin=lambda a, d: calls.append(("pin", a.ctypes.data)) or a.ctypes.data,
                      unpin=lambda h: calls.append(("unpin", h)))
    b = gpu.get(4, 8256)
    assert b.ctypes.data % 4096 == 0 and calls == [("unpin", None), ("pin", b.ctypes.data)]
    assert gpu.get(4, 8256) is b and len(calls) == 2            # big enough: no new pin
    c = gpu.get(9, 8256)                                          # grows: the old one is unpinned first
    assert c.shape == (9, 8256) and calls[2:] == [("unpin", b.ctypes.data), ("pin", c.ctypes.data)]
    gpu.close()
    assert calls[-1] == ("unpin", c.ctypes.data)
