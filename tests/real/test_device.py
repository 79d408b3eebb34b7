"""Device selection: the CPU path runs here; CUDA pinning is checked on hardware only."""

from __future__ import annotations

import pytest

from devices.errors import FlashsimError
from real.buffers import AlignedBuffer
from real.device import choose_device, pin_host_buffer, unpin_host_buffer


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
