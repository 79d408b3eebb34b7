"""Flash read model: sustained read throughput (bytes/s) as a function of chunk size and reads in flight.

Two forms, chosen by the profile:

* **Table** (measured): throughput over a grid `chunk_bytes` x `in_flight`, interpolated in two
  separable steps, exact at every table point:
    - along in_flight, throughput piecewise linear in the count;
    - along the chunk size, a read's *time* piecewise linear in its *bytes*: between two measured
      chunks c0 < c1 a read costs t(c) = t0 + (c - c0) / (c1 - c0) * (t1 - t0), with t = c / bw.
      That is the affine cost of a read (a fixed part plus bytes over a bandwidth) fitted through
      the two points, the model the closed form below uses everywhere. Throughput linear in
      log2(chunk) overstates it wherever the reads are bound by their count rather than their
      bytes: on this host at 64 in flight 8 KiB and 16 KiB reads cost 18.8 and 19.4 us, and a
      12 KiB bundle came out at 18.2 us, cheaper than either (19.1 us with the time
      interpolated). Where t1 >= t0 the interpolant's time is monotone, and so is its throughput wherever the table's throughput increases.
  Outside the grid it clamps, with a physical reading:
    - chunk < smallest chunk: a read cannot be faster than the smallest measured read, so it costs
      the same time as one: bytes_per_s = bw(c_min, q) * chunk / c_min;
    - chunk > largest chunk: the device is saturated: bytes_per_s = bw(c_max, q);
    - in_flight > largest in_flight: no further parallelism: bw(c, q_max);
    - in_flight < smallest in_flight (only if the table starts above 1): latency-bound, scaled by
      q / q_min.
* **CPU-capped** (`CpuBoundReadCurve`, profiles with `flash.request_cpu_s`): either form capped at
  the requests per second the host CPU can issue through the I/O path.
* **Closed form** (datasheet / paper devices, no measured grid): each read costs
  `latency_s + chunk / sequential_bytes_per_s`; with q reads in flight the device delivers
  `q * chunk / (latency_s + chunk / seq)`, capped by the controller's IOPS limit `iops_max * chunk`
  and by the sequential bandwidth. Every parameter comes from the profile, with its source.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TableReadCurve:
    """A measured grid. `table_bytes_per_s[i][j]` is the throughput at `chunk_bytes[i]`, `in_flight[j]`."""

    chunk_bytes: tuple[int, ...]
    in_flight: tuple[int, ...]
    table_bytes_per_s: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        # tuples whatever the caller passed (lists from YAML or code): the curve is hashable, so the
        # simulator's read-cost tables can be cached per curve (sim/components/flash.py)
        object.__setattr__(self, "chunk_bytes", tuple(self.chunk_bytes))
        object.__setattr__(self, "in_flight", tuple(self.in_flight))
        object.__setattr__(self, "table_bytes_per_s", tuple(tuple(row) if np.iterable(row) else row
                                                            for row in self.table_bytes_per_s))
        c = np.asarray(self.chunk_bytes, dtype=float)
        q = np.asarray(self.in_flight, dtype=float)
        bw = np.asarray(self.table_bytes_per_s, dtype=float)
        if c.ndim != 1 or len(c) < 1 or np.any(c <= 0) or np.any(np.diff(c) <= 0):
            raise ValueError("read_table.chunk_bytes must be positive and strictly increasing")
        if q.ndim != 1 or len(q) < 1 or np.any(q < 1) or np.any(np.diff(q) <= 0):
            raise ValueError("read_table.in_flight must be >= 1 and strictly increasing")
        if bw.shape != (len(c), len(q)):
            raise ValueError(
                f"read_table.bytes_per_s must have {len(c)} rows (chunk sizes) of {len(q)} values "
                f"(in-flight counts), got shape {bw.shape}"
            )
        if not np.all(np.isfinite(bw)) or np.any(bw <= 0):
            raise ValueError("read_table.bytes_per_s values must be finite and > 0")
        object.__setattr__(self, "_c", c)
        object.__setattr__(self, "_q", q)
        object.__setattr__(self, "_bw", bw)

    def bytes_per_s(self, chunk_bytes: float, in_flight: float = 1) -> float:
        """Sustained throughput for reads of `chunk_bytes` with `in_flight` outstanding."""
        return float(self.bytes_per_s_many(np.asarray([chunk_bytes], float), in_flight)[0])

    def bytes_per_s_many(self, chunk_bytes: np.ndarray, in_flight: float = 1) -> np.ndarray:
        """Vectorised over chunk sizes (one in-flight count)."""
        if in_flight <= 0:
            raise ValueError(f"in_flight must be > 0, got {in_flight}")
        chunk = np.asarray(chunk_bytes, dtype=float)
        if np.any(chunk <= 0):
            raise ValueError("chunk_bytes must be > 0")
        q_tab: np.ndarray = self._q  # type: ignore[attr-defined]
        bw_tab: np.ndarray = self._bw  # type: ignore[attr-defined]
        c_tab: np.ndarray = self._c  # type: ignore[attr-defined]
        # Step 1: the column for this in-flight count (linear in q, clamped at the ends).
        q_scale = 1.0
        q = float(in_flight)
        if q < q_tab[0]:
            q_scale, q = q / q_tab[0], q_tab[0]
        col = np.array([np.interp(q, q_tab, bw_tab[i]) for i in range(len(c_tab))]) * q_scale
        # Step 2: along the chunk size, a read's time linear in its bytes between the two table
        # chunks around it (module docstring); below the table a read costs a smallest read's time,
        # above it the largest chunk's throughput holds.
        if len(c_tab) == 1:
            out = np.full_like(chunk, col[0])
        else:
            c = np.clip(chunk, c_tab[0], c_tab[-1])
            hi = np.clip(np.searchsorted(c_tab, c, side="right"), 1, len(c_tab) - 1)
            lo = hi - 1
            w = (c - c_tab[lo]) / (c_tab[hi] - c_tab[lo])
            out = c / ((1.0 - w) * (c_tab[lo] / col[lo]) + w * (c_tab[hi] / col[hi]))
            out[w == 0.0] = col[lo][w == 0.0]      # exact at table points (no round trip through a time)
            out[w == 1.0] = col[hi][w == 1.0]
        small = chunk < c_tab[0]
        out[small] = col[0] * chunk[small] / c_tab[0]
        return out


@dataclass(frozen=True)
class ClosedFormReadCurve:
    """min(q*c / (latency + c/seq), iops_max*c, seq): see the module docstring."""

    sequential_bytes_per_s: float
    latency_s: float
    iops_max: float

    def __post_init__(self) -> None:
        for name in ("sequential_bytes_per_s", "latency_s", "iops_max"):
            v = getattr(self, name)
            if not np.isfinite(v) or v <= 0:
                raise ValueError(f"{name} must be finite and > 0, got {v}")

    def bytes_per_s(self, chunk_bytes: float, in_flight: float = 1) -> float:
        return float(self.bytes_per_s_many(np.asarray([chunk_bytes], float), in_flight)[0])

    def bytes_per_s_many(self, chunk_bytes: np.ndarray, in_flight: float = 1) -> np.ndarray:
        if in_flight <= 0:
            raise ValueError(f"in_flight must be > 0, got {in_flight}")
        c = np.asarray(chunk_bytes, dtype=float)
        if np.any(c <= 0):
            raise ValueError("chunk_bytes must be > 0")
        per_read_s = self.latency_s + c / self.sequential_bytes_per_s
        parallel = in_flight * c / per_read_s
        return np.minimum(np.minimum(parallel, self.iops_max * c), self.sequential_bytes_per_s)


@dataclass(frozen=True)
class CpuBoundReadCurve:
    """A read curve capped by the host CPU each request costs through the I/O path.

    Each read request takes `request_cpu_s` of CPU (system call, submission, completion interrupt,
    waking the reader thread); q reader threads run on at most `io_cores` cores at a time, so the
    host issues at most min(q, io_cores) / request_cpu_s requests per second whatever the device
    could serve: bytes_per_s = min(base(c, q), c * min(q, io_cores) / request_cpu_s). Only a cap: a
    published fio/CrystalDiskMark table already holds its own host's per-request time in its
    latencies, so the CPU time is not added to each read's latency as well."""

    base: TableReadCurve | ClosedFormReadCurve
    request_cpu_s: float
    io_cores: int = 1

    def __post_init__(self) -> None:
        if not (np.isfinite(self.request_cpu_s) and self.request_cpu_s > 0):
            raise ValueError(f"request_cpu_s must be finite and > 0, got {self.request_cpu_s}")
        if self.io_cores < 1:
            raise ValueError(f"io_cores must be >= 1, got {self.io_cores}")

    def cpu_iops(self, in_flight: float) -> float:
        """Requests per second the CPU can issue with `in_flight` reader threads."""
        return min(float(in_flight), float(self.io_cores)) / self.request_cpu_s

    def bytes_per_s(self, chunk_bytes: float, in_flight: float = 1) -> float:
        return float(self.bytes_per_s_many(np.asarray([chunk_bytes], float), in_flight)[0])

    def bytes_per_s_many(self, chunk_bytes: np.ndarray, in_flight: float = 1) -> np.ndarray:
        c = np.asarray(chunk_bytes, dtype=float)
        return np.minimum(self.base.bytes_per_s_many(c, in_flight), c * self.cpu_iops(in_flight))


ReadCurve = TableReadCurve | ClosedFormReadCurve | CpuBoundReadCurve


def read_time_s(curve: ReadCurve, chunk_bytes: float, n_reads: int, in_flight: int) -> float:
    """Time to complete `n_reads` reads of `chunk_bytes` with at most `in_flight` outstanding.

    With fewer reads than slots only `n_reads` are in flight, so the device runs at that depth.
    """
    if n_reads <= 0:
        return 0.0
    q = min(in_flight, n_reads)
    return n_reads * chunk_bytes / curve.bytes_per_s(chunk_bytes, q)
