"""The reader's own costs around its reads, timed through real.io.reader on a small store (seconds).

`flashsim bench flash` runs these after its read grid, on a one-layer random-weight store of 4 KiB
bundles that it writes next to the bench file (the disk under test) and removes afterwards:

Batch overhead (`batch_overhead`; the profile's `flash.batch_overhead_by_ratio_s`, one row per
reads-in-flight entry of the table, one value per reads per thread): the reader issues each layer's
reads as one batch to its pool of threads and returns when the last read completes. Beyond its reads
at the grid's steady throughput a batch costs the call's setup, waking and collecting the threads and
the drain to its slowest read, and how much of that its reads hide depends on how many each thread
takes. At each depth q, real.io.reader reads batches of q, 2q, 4q and 8q random, non-adjacent neurons of
a one-layer store of 4 KiB bundles (`bench_store`) into cache rows; the overhead is the mean of each
size's batch time less the table's time for its reads (here, 64 in flight: 0.34 ms at one read per
thread, 0.30 ms at two, none at four and eight).

Reader planning (`read_plan_cost`; `flash.plan_s_per_batch` / `plan_s_per_neuron`): besides a
batch's reads the reader finds the missing neurons, appends their cache rows and plans the coalesced
reads (NumPy, a few dozen calls): timed as `BundleReader.read` less its reads (here ~170-320 us +
0.09 us per neuron; timed alone, without reads in between, half as much).
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from devices.model_spec import ModelSpec
from real.bench.call_time import mean_call_s
from real.io.buffers import round_up
from real.io.reader import BundleReader, ReadStats
from real.runtime.cache_matrices import LayerCache
from real.weights.convert import write_shape_store
from real.weights.store import WeightStore, open_store

PLAN_BATCH_NEURONS = (16, 512)    # the two batch sizes read_plan_cost times
BENCH_STORE_NEURONS = 4096        # the one-layer store the reader is timed on (4 KiB bundles: 16 MiB)
OVERHEAD_SLICES = 4               # batch_overhead: slices of reader batches per depth, steady reads around each
BATCH_READS_PER_THREAD = (1, 2, 4, 8)   # batch_overhead: batches of r x q reads at each depth q


@contextlib.contextmanager
def bench_store(folder: Path, seed: int) -> Iterator[WeightStore]:
    """A one-layer random-weight store of BENCH_STORE_NEURONS 4 KiB bundles (fp32, d_model 256, padded)
    in a temporary folder inside `folder` (the disk under test), removed afterwards."""
    spec = ModelSpec(name="bench-reader", family="llama", n_layers=1, d_model=256, d_ff=BENCH_STORE_NEURONS,
                     n_heads=2, n_kv_heads=1, head_dim=128, vocab_size=256, ffn_kind="swiglu", dtype="fp32")
    with tempfile.TemporaryDirectory(prefix="flashsim-reader-", dir=folder) as tmp:
        yield open_store(write_shape_store(spec, Path(tmp) / "store", seed=seed, dtype="fp32", layout="bundled"))


def reader_batches(store: WeightStore, in_flight: int, sizes: Sequence[int], duration_s: float,
                   rng: np.random.Generator, pause: Callable[[], None] | None = None,
                   pause_every_s: float = float("inf"), spaced: bool = False) -> Iterator[tuple[int, ReadStats, float]]:
    """real.io.reader with `in_flight` threads reading batches of `sizes` random neurons (cycled; sorted,
    as the backend asks) of `store`'s layer 0 into cache rows for `duration_s`, as the backend does
    (`LayerCache.missing`, `append`, `BundleReader.read`): yields (neurons, ReadStats, seconds of
    the three calls) per batch; the seconds less the reads' are read_plan_cost's quantity.
    `spaced`: only even neurons, so no two are adjacent and each neuron is one read (at most N / 2).
    `pause()`, when given, is called between batches every `pause_every_s` (its time does not count
    against `duration_s`)."""
    N = store.n_neurons
    with BundleReader(store, layout="bundled", in_flight=in_flight) as reader:
        cache = LayerCache(min(N, max(sizes)), N, store.bundle_bytes, reader.dest_row_bytes)
        t_end = time.perf_counter() + duration_s
        t_pause = time.perf_counter() + pause_every_s
        while time.perf_counter() < t_end:
            for n in sizes:
                ids = (2 * np.sort(rng.choice(N // 2, min(n, N // 2), replace=False)) if spaced
                       else np.sort(rng.choice(N, min(n, N), replace=False)))
                cache.clear()
                t0 = time.perf_counter()
                miss = cache.missing(ids)
                a, b = cache.append(miss)
                st = reader.read(0, miss, cache.rows[a:b])
                yield n, st, time.perf_counter() - t0
            if pause is not None and time.perf_counter() >= t_pause:
                p0 = time.perf_counter()
                pause()
                t_end += time.perf_counter() - p0
                t_pause = time.perf_counter() + pause_every_s


def table_time_s(curve: Any, chunk_bytes: np.ndarray, in_flight: int) -> float:
    """The read table's time for one batch of reads of these sizes, all issued together (depth
    min(in_flight, reads)); the batch overhead not included."""
    lens = np.asarray(chunk_bytes, np.float64)
    return float(np.sum(lens / curve.bytes_per_s_many(lens, min(in_flight, len(lens)))))


def batch_overhead(store: WeightStore, curve: Any, depths: Sequence[int], duration_s: float,
                   rng: np.random.Generator, steady_bytes_per_s: Callable[[int, int, float], float],
                   slices: int = OVERHEAD_SLICES, ratios: Sequence[int] = BATCH_READS_PER_THREAD) -> dict[str, Any]:
    """Per depth q and reads per thread r: what one read batch of real.io.reader costs beyond its reads
    at the disk's steady throughput (the profile's `flash.batch_overhead_by_ratio_s`): starting and
    collecting its q threads, the call's setup and the drain to the slowest read. At each depth a
    BundleReader with q threads reads batches of r * q random neurons for each r in `ratios` (4 KiB
    bundles, no two adjacent, so each neuron is one read) of `store` into cache rows, in turn, for
    `duration_s`, in `slices` slices; before the first slice and after each, `steady_bytes_per_s(chunk,
    q, seconds)` (bench flash's own loop) reads the same chunks steadily at the same depth, for half
    of `duration_s` in all. A batch's overhead is its reads' `seconds` less the table's time for
    them (`curve`, the grid just measured) scaled by the disk's state around its slice: the table's
    throughput over the steady reads' (the mean of the measurements before and after). The profile
    takes the mean over each size's batches (real/bench/call_time.py: a run pays every batch's drain, the
    slow ones' too), clipped at 0.
    Why per ratio: with one read per thread nothing hides the threads' wake-ups, while with several
    the later threads wake while the earlier ones read. On the 2-vCPU EPYC host at 64 in flight the
    one value per depth, the mean of batches of q and 4q, was 0.07 ms in one calibration, while
    validation's demand batches of 47-80 reads there (about one per thread) ran ~0.9 ms longer
    than the simulator priced them; by ratio, a calibration of the same host measured 0.34 ms at
    one read per thread and none at four.
    (Unscaled, the overhead took up whatever state the disk was in against the grid's mean: at 32 in
    flight it came out 0.05, 0.12, 0.20, 0.20 and 0.45 ms in five calibrations, and 0.11 ms against
    0.24 ms scaled, in the same two minutes, with the disk at 0.87x the table's time.) The scaling
    is exact in the disk's usual state; in its slow state short batches slow less than steady reads
    (bursts of 64 4 KiB reads 1.51x, steady reads 1.97x), so a depth measured there comes out low
    (0.17 against 0.35 ms for those bursts; unscaled it would be 0.86 ms)."""
    chunk = round_up(store.bundle_bytes)     # a bundle's read: its padded stride
    steady_s = duration_s / 2 / (slices + 1)
    overhead, batch_s, table_s, state_med = [], [], [], []
    for q in depths:
        sizes = tuple(r * q for r in ratios)
        tab = float(curve.bytes_per_s_many(np.array([float(chunk)]), q)[0])
        states: list[float] = []     # measured / table time per byte of steady reads, at each pause

        def measure(q: int = q, tab: float = tab, states: list[float] = states) -> None:
            states.append(tab / steady_bytes_per_s(chunk, q, steady_s))

        measure()
        rows: list[tuple[int, int, float, float]] = []    # (slice, neurons, seconds, table seconds)
        for n, st, _ in reader_batches(store, q, sizes, duration_s, rng, pause=measure,
                                       pause_every_s=duration_s / slices, spaced=True):
            rows.append((len(states) - 1, n, st.seconds, table_time_s(curve, st.chunk_bytes, q)))
        measure()
        around = [(states[i] + states[i + 1]) / 2 for i in range(len(states) - 1)]
        overhead.append([max(0.0, float(mean_call_s([sec - t_tab * around[i] for i, m, sec, t_tab in rows if m == n])))
                         for n in sizes])
        # reported beside it: the median batch of each size (the typical batch, robust to one stall)
        batch_s.append([float(np.median([r[2] for r in rows if r[1] == n])) for n in sizes])
        table_s.append([float(np.median([r[3] for r in rows if r[1] == n])) for n in sizes])
        state_med.append(float(np.median(states)))
    return {"bundle_bytes": store.bundle_bytes, "in_flight": list(depths), "reads_per_thread": list(ratios),
            "batch_neurons": [[r * q for r in ratios] for q in depths], "batch_s": batch_s, "table_s": table_s,
            "disk_state": state_med, "overhead_s": overhead, "duration_s_per_depth": 1.5 * duration_s}


def read_plan_cost(store: WeightStore, in_flight: int, seed: int, min_time_s: float = 0.3) -> dict[str, Any]:
    """The reader's own work for one batch besides its reads (the profile's `flash.plan_s_per_batch`
    / `plan_s_per_neuron`): which of the asked neurons are missing from the layer's cache, their
    cache rows (`LayerCache.missing` / `append`), the coalesced read plan and the call's setup
    (`BundleReader.read` less its reads' `seconds`), measured as the real backend pays it: real
    reads with `in_flight` threads from `store` (bench_store). Batches of PLAN_BATCH_NEURONS random
    neurons alternate for `min_time_s`; a straight line through the two means (real/bench/call_time.py).
    (Timed alone, without reads in between, the same code took half as long here: it runs right
    after the thread waits on I/O, with cold caches.)"""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x9A4]))
    times: dict[int, list[float]] = {n: [] for n in PLAN_BATCH_NEURONS}
    for n, st, call_s in reader_batches(store, in_flight, PLAN_BATCH_NEURONS, min_time_s, rng):
        times[n].append(call_s - st.seconds)
    (n1, n2), (t1, t2) = PLAN_BATCH_NEURONS, (float(mean_call_s(times[n])) for n in PLAN_BATCH_NEURONS)
    per_neuron = max(0.0, (t2 - t1) / (n2 - n1))
    return {"batch_neurons": list(PLAN_BATCH_NEURONS), "in_flight": in_flight, "batch_s": [t1, t2],
            "per_neuron_s": per_neuron, "per_batch_s": max(0.0, t1 - per_neuron * n1), "samples": len(times[n1])}


def median_of_rounds(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The first measurement's result with each float entry (and each entry of a list of floats)
    the median over `rounds` (results of read_plan_cost timed at different moments, so that a slow
    spell of the host covering one measurement's fraction of a second moves that measurement, not
    the profile), and each measurement's own float values under "rounds"."""
    out = dict(rounds[0])
    for k, v in rounds[0].items():
        if isinstance(v, float):
            out[k] = float(np.median([r[k] for r in rounds]))
        elif isinstance(v, list) and v and all(isinstance(x, float) for x in v):
            out[k] = np.median(np.array([r[k] for r in rounds], float), axis=0).tolist()
    out["rounds"] = [{k: v for k, v in r.items() if isinstance(v, float)} for r in rounds]
    return out
