"""Measured kernel times over a grid of (width, rows): the sparse FFN's and the dense GEMV's tables.

`KernelTable` holds one kernel's seconds per call t[i][j] at width d[i] and rows k[j] (measured by
`flashsim bench compute`) and answers t(d, k) for any width and any number of rows. The sparse
FFN's kernels (real/bench/bench_sparse_ffn.py) are tabled over d_model x computed neurons; a dense GEMV
(real/bench/bench_dense_gemv.py) over in_features x out_features:

* inside the grid: piecewise linear in (log d, log k) on log t, in two separable steps. Between two
  measured points a kernel's time grows as a power of its size, which is what a cache-size or an
  allocator cliff between them looks like from either side; exact at every grid point.
* above the largest d or k: the kernel streams at the edge's per-element rate, t = t(edge) x d /
  d_max (and x k / k_max): beyond the grid nothing gets cheaper per byte;
* below the smallest d or k: the smallest measured call's time. A kernel call does not get cheaper
  than the smallest one measured (its fixed dispatch and setup), the same reading the flash read
  table gives a read below its smallest chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# the table's cache rows: one neuron's gate | up | down, 4 KiB-aligned as a padded store's bundle
TABLE_ROW_ALIGN_BYTES = 4096


def table_row_bytes(d_model: int, dtype_bytes: int) -> int:
    """The bytes of one cache row the table was measured on (real/bench/bench_sparse_ffn.py)."""
    return -(-3 * d_model * dtype_bytes // TABLE_ROW_ALIGN_BYTES) * TABLE_ROW_ALIGN_BYTES


@dataclass(frozen=True)
class KernelTable:
    """t[i][j] seconds at d_model[i], neurons[j] (the width and the rows; `axes` names them in
    errors: ("in_features", "out_features") for a dense GEMV)."""

    d_model: tuple[int, ...]
    neurons: tuple[int, ...]
    seconds: tuple[tuple[float, ...], ...]
    axes: tuple[str, str] = ("d_model", "neurons")

    def __post_init__(self) -> None:
        d = np.asarray(self.d_model, float)
        k = np.asarray(self.neurons, float)
        t = np.asarray(self.seconds, float)
        for name, a in zip(self.axes, (d, k)):
            if a.ndim != 1 or len(a) < 1 or np.any(a < 1) or np.any(np.diff(a) <= 0):
                raise ValueError(f"{name} must be >= 1 and strictly increasing")
        if t.shape != (len(d), len(k)):
            raise ValueError(f"a kernel's seconds must have {len(d)} rows ({self.axes[0]}) of {len(k)} values "
                             f"({self.axes[1]}), got shape {t.shape}")
        if not np.all(np.isfinite(t)) or np.any(t <= 0):
            raise ValueError("a kernel's seconds must be finite and > 0")
        object.__setattr__(self, "_log_d", np.log(d))
        object.__setattr__(self, "_log_k", np.log(k))
        object.__setattr__(self, "_log_t", np.log(t))

    def at_width(self, d_model: float) -> np.ndarray:
        """log t over the neurons axis at one width (step one of the two)."""
        ld, lt = self._log_d, self._log_t   # type: ignore[attr-defined]
        x = np.log(float(d_model))
        if x <= ld[0]:
            return lt[0].copy()
        if x >= ld[-1]:
            return lt[-1] + (x - ld[-1])
        return np.array([np.interp(x, ld, lt[:, j]) for j in range(lt.shape[1])])

    def seconds_at(self, d_model: float, neurons: np.ndarray) -> np.ndarray:
        """Seconds per call at width `d_model` for each count in `neurons` (any shape; 0 -> 0)."""
        return self.curve(d_model)(neurons)

    def transposed(self) -> KernelTable:
        """The same kernel with the axes swapped: t'(k, d) = t(d, k). Inside the grid and beyond it the
        two answer alike (the interpolation is bilinear in logs; the edge rules are per axis)."""
        return KernelTable(self.neurons, self.d_model, tuple(zip(*self.seconds)), axes=(self.axes[1], self.axes[0]))

    def curve(self, d_model: float) -> KernelCurve:
        """The kernel at one width, as a function of the neurons computed (evaluated many times)."""
        return KernelCurve(self._log_k, self.at_width(d_model))   # type: ignore[attr-defined]


@dataclass(frozen=True)
class KernelCurve:
    """One width of a KernelTable: seconds per call against neurons computed."""

    log_k: np.ndarray
    log_t: np.ndarray

    def __call__(self, neurons: np.ndarray) -> np.ndarray:
        k = np.asarray(neurons, np.float64)
        pos = k > 0
        x = np.log(np.where(pos, k, 1.0))
        lk, lt = self.log_k, self.log_t
        y = np.interp(x, lk, lt)                                   # clamps at both ends
        y = np.where(x > lk[-1], lt[-1] + (x - lk[-1]), y)         # above: the edge's rate per neuron
        return np.where(pos, np.exp(y), 0.0)
