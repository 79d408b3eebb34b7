"""Reader throughput vs `flashsim bench flash`, side by side on the same file (target: >= 90%).

Run with `make bench` (or `pytest -s -m "" tests/benchmarks/test_bench_reader.py`). Prints, for each
chunk size x reads in flight: the raw benchmark's random-read throughput (python threads doing
os.preadv in a loop, as `flashsim bench flash` measures), the BundleReader's throughput reading
neuron sets whose runs of adjacent bundles coalesce into exactly that chunk size (wall time of
whole `read()` calls, planning included, into a neuron cache's rows), and their ratio. Both read
the same store file with O_DIRECT, alternating, so drift on a shared host hits both alike.
Nothing here asserts a time.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from devices.model_spec import ModelSpec
from real.bench.bench_io import BenchFile, random_read_bytes_per_s
from real.io.reader import BundleReader
from real.runtime.cache_matrices import LayerCache
from real.weights.convert import write_shape_store
from real.weights.store import open_store

CHUNKS = (16384, 65536, 262144, 1 << 20)
IN_FLIGHT = (1, 4, 16, 32)
DURATION_S = 1.0      # per side and point, in SLICES alternating slices
SLICES = 10
BUNDLE = 16384        # relu FFN, d_model 4096, fp16: up row + down column = 16 KiB, already 4 KiB aligned


def _runs(store, k: int, n_runs: int, rng: np.random.Generator) -> np.ndarray:
    """n_runs runs of k adjacent slots, at least one free slot apart: each run is one read."""
    blocks = np.sort(rng.choice(store.n_neurons // (k + 1), n_runs, replace=False))
    slots = (blocks[:, None] * (k + 1) + np.arange(k)[None, :]).ravel()
    return store.neuron_at[0][slots].astype(np.int64)


@pytest.mark.slow
def test_reader_vs_bench_flash(tmp_path):
    # 512 MiB: big enough that the reads do not all come from a small, hot region of the disk.
    spec = ModelSpec(name="bench-16k", family="opt", n_layers=1, d_model=4096, d_ff=32768, n_heads=32, n_kv_heads=32,
                     head_dim=128, vocab_size=1000, ffn_kind="relu", dtype="fp16")
    store = open_store(write_shape_store(spec, tmp_path / "store", seed=0, dtype="fp16"))
    assert store.layout("bundled").stride_bytes == BUNDLE
    path = store.file_path(0, "bundled")
    bf = BenchFile(path, 0, seed=0, direct=True, keep=True)
    rng = np.random.default_rng(0)
    rows = []
    for c in CHUNKS:
        k = c // BUNDLE
        for q in IN_FLIGHT:
            # sparse sets (at most a quarter of the possible runs), so reads stay random as in the bench
            n_runs = min(store.n_neurons // (k + 1) // 4, max((16 << 20) // c, 8 * q))
            cache = LayerCache(n_runs * k, store.n_neurons, store.bundle_bytes, BUNDLE)
            raw_rates, rd_rates = [], []
            with BundleReader(store, in_flight=q, max_chunk_bytes=c, direct=True) as reader:
                for _ in range(SLICES):  # alternate short slices: host drift hits both sides alike
                    raw_rates.append(random_read_bytes_per_s(bf, c, q, DURATION_S / SLICES, rng))
                    t_slice, nbytes = 0.0, 0
                    while t_slice < DURATION_S / SLICES:
                        ids = store.sort_by_position(0, _runs(store, k, n_runs, rng))
                        start, stop = cache.append(ids)
                        t = time.perf_counter()
                        s = reader.read(0, ids, cache.rows[start:stop])
                        t_slice += time.perf_counter() - t
                        assert s.reads_issued == n_runs and s.bytes_copied == 0
                        nbytes += s.bytes_read
                        cache.clear()
                    rd_rates.append(nbytes / t_slice)
            # The median of the per-slice ratios is robust to bursts of load from other jobs.
            ratio = float(np.median(np.array(rd_rates) / np.array(raw_rates)))
            rows.append((c, q, n_runs, float(np.median(raw_rates)), float(np.median(rd_rates)), ratio))
    bf.close()
    print("\nreader vs bench flash (same file, O_DIRECT; MiB/s = medians over slices; ratio = median of per-slice ratios)")
    print(f"{'chunk':>8} {'q':>3} {'reads/call':>10} {'bench':>8} {'reader':>8} {'ratio':>6}")
    for c, q, n, raw, rd, ratio in rows:
        print(f"{c // 1024:>6}Ki {q:>3} {n:>10} {raw / 2**20:>8.0f} {rd / 2**20:>8.0f} {ratio:>6.2f}")
    ratios = np.array([r[-1] for r in rows])
    for c in CHUNKS:
        r = [row[-1] for row in rows if row[0] == c]
        print(f"{c // 1024:>6}Ki: median ratio {np.median(r):.2f}")
    print(f"ratio: median {np.median(ratios):.2f}, min {ratios.min():.2f}, max {ratios.max():.2f} (target >= 0.90)")
    assert np.all(ratios > 0)
