"""PyTorch's intra-op thread count for the span of a measurement: set on entry, the caller's
restored on exit (a probe times compute on the threads a profile or a decoder uses, not the
process default)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def torch_threads(torch: Any, n: int | None) -> Iterator[None]:
    """Run the block on `n` torch threads (None: leave the setting alone), then restore it."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
