"""The weight store's integrity check on the read path: its cost per run against the run's reads
(target: under 3%), side by side in one process.

Run with `make bench` (or `pytest -s -m "" tests/benchmarks/test_bench_store_integrity.py`). A "run"
is what `flashsim real read` does on a SmolLM2-shaped store (8 layers, fp16, padded bundles):
`TOKENS` tokens, each reading `FRACTION` of every layer's neurons with the direct-I/O reader. Printed,
as medians over alternating repetitions:
* the run's reads (open with verify="sizes", then every read call);
* the verified-once record's check (`record_matches`: one stat per file and the record's JSON, what
  `open_store(verify="record")` adds to a run whose store did not change) - what every run pays;
* a full SHA-256 + extent-CRC verify (`verify="full"`) - what a run would pay without the record,
  and what the first run after any change pays;
* CRC32 (zlib) of every byte the run read - what checking each read as its bytes arrive would cost.
Nothing here asserts a time.
"""

from __future__ import annotations

import statistics
import time
import zlib

import numpy as np

from devices.model_spec import ModelSpec
from real.io.reader import BundleReader
from real.runtime.cache_matrices import LayerCache
from real.weights.convert import write_shape_store
from real.weights.store import open_store
from real.weights.store_integrity import record_matches

TOKENS = 10
FRACTION = 0.3
REPS = 7


def _run(path, rng: np.random.Generator) -> tuple[float, int, list[np.ndarray]]:
    t0 = time.perf_counter()
    store = open_store(path, verify="sizes")
    k = int(FRACTION * store.n_neurons)
    rows = []
    with BundleReader(store, in_flight=8) as reader:
        cache = LayerCache(k, store.n_neurons, store.bundle_bytes, reader.dest_row_bytes)
        nbytes = 0
        for _ in range(TOKENS):
            for layer in range(store.n_layers):
                ids = store.sort_by_position(layer, np.sort(rng.choice(store.n_neurons, k, replace=False)))
                start, stop = cache.append(ids)
                nbytes += reader.read(layer, ids, cache.rows[start:stop]).bytes_read
                rows.append(np.array(cache.rows[start:stop]))
                cache.clear()
    return time.perf_counter() - t0, nbytes, rows


def _time(fn) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def test_integrity_check_cost(tmp_path):
    spec = ModelSpec(name="smollm2-8l", family="llama", n_layers=8, d_model=576, d_ff=1536, n_heads=9,
                     n_kv_heads=3, head_dim=64, vocab_size=49152, ffn_kind="swiglu", tied_embeddings=True)
    path = write_shape_store(spec, tmp_path / "store", seed=0, dtype="fp16")
    names = list(open_store(path, verify="record").manifest.files)   # the first run: verifies, writes the record
    assert record_matches(path, names)
    rng = np.random.default_rng(0)
    reads, record, full, crc = [], [], [], []
    for _ in range(REPS):                              # alternate: drift on a shared host hits all alike
        t, nbytes, rows = _run(path, rng)
        reads.append(t)
        sizes = _time(lambda: open_store(path, verify="sizes"))
        record.append(statistics.median(_time(lambda: record_matches(path, names)) for _ in range(20)))
        full.append(_time(lambda: open_store(path, verify="full")) - sizes)
        crc.append(_time(lambda rows=rows: [zlib.crc32(r) for r in rows]))
    r, c, f, x = (statistics.median(v) for v in (reads, record, full, crc))
    print(f"\nstore {path.name}: 8 layers x 1536 neurons fp16, a run = {TOKENS} tokens x 8 layers x "
          f"{FRACTION:.0%} of the neurons, {nbytes / 2**20:.1f} MiB read (medians of {REPS})")
    print(f"  run's reads                       {r * 1e3:9.2f} ms")
    print(f"  verified-once record check        {c * 1e3:9.3f} ms   {c / r:7.2%} of the reads (target < 3%)")
    print(f"  full verify (SHA-256 + CRC)       {f * 1e3:9.2f} ms   {f / r:7.1%} of the reads")
    print(f"  CRC32 of every byte read          {x * 1e3:9.2f} ms   {x / r:7.1%} of the reads")
