"""Named random streams: one `seed` -> independent `np.random.Generator`s, one per consumer.

Each stream is derived from `np.random.SeedSequence(seed)` with a spawn key computed from its
name (a CRC-32 of the UTF-8 name), so a stream's numbers depend only on (seed, name): adding a
policy, or asking for streams in another order, never changes another consumer's numbers. This is
NumPy's documented way to get independent parallel streams (spawn keys of one SeedSequence).
Nothing in flashsim touches the global `np.random` state.
"""

from __future__ import annotations

import zlib

import numpy as np


class RngStreams:
    """`streams.get("predictor/layer3")` -> the Generator for that name (created once, cached)."""

    def __init__(self, seed: int):
        if not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
        self.seed = int(seed)
        self._streams: dict[str, np.random.Generator] = {}

    def get(self, name: str) -> np.random.Generator:
        g = self._streams.get(name)
        if g is None:
            key = (zlib.crc32(name.encode("utf-8")),)
            g = np.random.default_rng(np.random.SeedSequence(self.seed, spawn_key=key))
            self._streams[name] = g
        return g

    def fresh(self, name: str) -> np.random.Generator:
        """A new generator for `name` from its start (not cached): for re-running a stream."""
        key = (zlib.crc32(name.encode("utf-8")),)
        return np.random.default_rng(np.random.SeedSequence(self.seed, spawn_key=key))
