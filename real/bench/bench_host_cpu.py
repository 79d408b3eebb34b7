"""The host CPU a batch of reads costs and how reads and a compute slow each other (seconds):
`probe_samples` (one round of slices), `probe_summary` (the profile's terms from the rounds).
`flashsim bench flash` (real/bench/bench_flash.py) runs one round after each sweep of its grid.

Host CPU of the reads (`probe_samples` rounds, `probe_summary`; the profile's
`flash.host_cpu_s_per_read`, `compute_lost_s_per_read`, `read_delay_s_per_read` and their
`_per_batch` counterparts, see sim/components/compute.py `HostCpu`): at PROBE_CHUNK_BYTES and the
largest reads in flight (bench flash's grid records the CPU time per read at every point besides),
reads are issued the way the real backend prefetches (a background thread handing
batches of B reads to a persistent pool of reader threads, real.io.reader's own `_Workers`, each
thread's reads landing in its next slot of the destination region, as the grid's do), for four
batch sizes B (`probe_batch_sizes`: 1/4, 1, 2 and 8 times the reads in flight), and short slices alternate: a decode-like compute
probe alone (a 1024 x 1024 fp32 GEMV and a normalisation, ~0.1-0.3 ms per iteration, on
`compute_threads` threads) | batches alone | both at once, PROBE_SLICES slices in all, in rounds
after each sweep of bench flash's grid, like the reader's planning (how much reads and compute slow each other
moved by a quarter within five minutes here). Medians over all slices (bursts of load from
other processes hit the three alike) give, per batch size, the batch time alone and with the
probe, the probe's time lost per batch and the CPU per read; a straight line through the two
largest batch sizes splits each effect into a per-batch and a per-read part (clipped at 0):
  * cpu_s_per_read: CPU time per read, batches alone;
  * compute_lost_s_per_read / _per_batch: the probe's lost time;
  * read_delay_s_per_read / _per_batch: how much longer a batch takes while the probe runs
    (`per_batch_size` keeps both effects at every size, for the report).
The probe runs three times: with the GEMV compute (kernels, which release the interpreter lock),
with decode steps of a tiny transformers llama (framework code, which holds it: the profile's
framework_* terms; it interferes 3-4x more here, compute lost 16-19 vs 5 us per read) and with a
PROBE_LONG_DIM-wide GEMV (long kernels, about 1 ms per torch call: long_kernel_*). Each probe's
torch calls per iteration are counted once (a TorchFunctionMode, untimed), so the profile keeps
its seconds per call (`*_probe_op_s`): a Python decoder loop re-takes the interpreter lock after
every call, and the simulator places a loop between the probes by its own seconds per call
(sim/components/compute.py, "A Python decoder loop").
Without torch the probe is NumPy. The load average is recorded with the numbers.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from devices.errors import FlashsimError
from devices.units import format_bytes
from real.bench.bench_io import BenchFile, _read_or_fail, _thread_slots, process_cpu_s

PROBE_CHUNK_BYTES = 16384     # near a bundle of a small model (12-24 KiB): the reads a prefetch issues
PROBE_SLICES = 20
PROBE_SLICE_S = 0.1
PROBE_DIM = 1024              # the probe GEMV: 4 MiB of fp32 weights, a decode layer's projection
PROBE_LONG_DIM = 4096         # the long-kernel probe: 64 MiB of fp32 weights, about 1 ms per torch call
# the kernel probe (profile's plain terms), framework_ and long_kernel_
PROBE_KINDS = ("host", "framework", "long")


def probe_batch_sizes(in_flight: int) -> tuple[int, ...]:
    """Reads per batch the probe measures at `in_flight` reads in flight: a quarter of the threads'
    worth, one read per thread, and 2x and 8x (the two the per-read and per-batch line goes through)."""
    return tuple(sorted({max(1, in_flight // 4), in_flight, 2 * in_flight, 8 * in_flight}))


class TorchCallCounter:
    """Counts torch calls made from Python (a TorchFunctionMode) while active."""

    def __init__(self, torch: Any):
        class Mode(torch.overrides.TorchFunctionMode):
            def __torch_function__(mode, func, types, args=(), kwargs=None):  # noqa: N805
                self.calls += 1
                return func(*args, **(kwargs or {}))

        self.calls, self.mode = 0, Mode()


def calls_per_iteration(probe: Callable[[float], int], duration_s: float = 0.05) -> float | None:
    """Mean torch calls per iteration of a probe (None without torch): one short untimed run under
    a counting mode (the probes' op rhythm: FlashSpec.framework_probe_op_s etc.)."""
    try:
        import torch
    except ImportError:
        return None
    counter = TorchCallCounter(torch)
    with counter.mode:
        n = probe(time.perf_counter() + duration_s)
    return counter.calls / n if n and counter.calls else None


def _compute_probe(threads: int, seed: int, dim: int = PROBE_DIM) -> Callable[[float], int]:
    """A decode-like compute loop on `threads` threads: run(until_perf_counter) -> iterations
    (a dim x dim GEMV and a normalisation per iteration)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((dim, dim), dtype=np.float32)
    try:
        import torch
    except ImportError:
        x = [rng.standard_normal(dim, dtype=np.float32)]

        def run_np(until: float) -> int:
            n = 0
            while time.perf_counter() < until:
                y = w @ x[0]
                x[0] = y / np.linalg.norm(y)
                n += 1
            return n

        return run_np
    torch.set_num_threads(threads)
    wt, xt = torch.from_numpy(w), [torch.from_numpy(rng.standard_normal(dim, dtype=np.float32))]

    def run_torch(until: float) -> int:
        n = 0
        with torch.no_grad():
            while time.perf_counter() < until:
                y = torch.mv(wt, xt[0])
                xt[0] = y / y.norm()
                n += 1
        return n

    return run_torch


def _framework_probe(threads: int, seed: int) -> Callable[[float], int] | None:
    """Framework-code compute: decode steps of a tiny random llama in transformers (Python module
    code holding the interpreter lock most of the time, like model mode's attention), restarted
    every 64 steps; None without transformers."""
    try:
        import torch
    except ImportError:
        return None
    from real.bench.bench_compute import tiny_llama
    from real.runtime.model_mode import _decode_step

    torch.set_num_threads(threads)
    tiny = tiny_llama(torch, 4, seed)
    if tiny is None:
        return None
    model, arg, ids = tiny
    state: dict[str, Any] = {"past": None, "steps": 0}

    def run(until: float) -> int:
        n = 0
        with torch.no_grad():
            while time.perf_counter() < until:
                if state["steps"] % 64 == 0:
                    state["past"] = None
                _, state["past"] = _decode_step(model, ids, state["past"], arg)
                state["steps"] += 1
                n += 1
        return n

    return run


def probe_samples(bf: BenchFile, chunk: int, in_flight: int, *, slices: int, slice_s: float = PROBE_SLICE_S,
                  compute_threads: int = 1, seed: int = 0, batch_reads: tuple[int, ...] | None = None,
                  kind: str = "host", round_: int = 0,
                  probe: Callable[[float], int] | None = None) -> dict[str, Any] | None:
    """One round of the host CPU probe: `slices` slices per batch size, each the compute alone |
    batches alone | both at once; returns the per-slice samples (None without a compute probe).
    `kind` (PROBE_KINDS): the kernel GEMV ("host"), the tiny llama ("framework") or the long GEMV;
    `probe`: any other compute, run(until_perf_counter) -> iterations (kind is then unused).
    Reads are issued as the real backend issues a prefetch: a background thread hands batches of B
    reads to a persistent pool of `in_flight` threads (the reader's own `_Workers`), one batch after
    another, at each of `batch_reads` (default `probe_batch_sizes`): the two largest separate the
    per-batch cost (waking and collecting the pool's threads) from the per-read cost (`probe_summary`)."""
    from real.io.reader import _Workers

    n_slots = (bf.size_bytes - chunk) // chunk + 1
    if n_slots < 1:
        raise FlashsimError(f"{bf.path}: {format_bytes(bf.size_bytes)} is smaller than a {format_bytes(chunk)} chunk")
    sizes = tuple(batch_reads or probe_batch_sizes(in_flight))
    torch_threads = _torch_threads()
    if kind not in PROBE_KINDS:
        raise ValueError(f"probe kind must be one of {PROBE_KINDS}, got {kind!r}")
    if probe is None:
        probe = (_framework_probe(compute_threads, seed) if kind == "framework" else
                 _compute_probe(compute_threads, seed, PROBE_LONG_DIM if kind == "long" else PROBE_DIM))
    if probe is None:
        _restore_torch_threads(torch_threads)
        return None
    calls = calls_per_iteration(probe)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xC0DE, round_]))
    # where the reads land: thread w takes its next slot of the huge-page region in turn, as the
    # grid's reads do and as a prefetch's reads land in cache rows (module doc, destinations)
    dest = bf.destination(in_flight * chunk)
    slots = [itertools.cycle([[mv] for mv in _thread_slots(dest, w, in_flight, chunk)]) for w in range(in_flight)]
    pool = _Workers(in_flight) if in_flight > 1 else None

    def one_batch(n: int) -> None:
        offs = (rng.integers(0, n_slots, n) * chunk).tolist()
        nxt = itertools.count()

        def work(w: int) -> None:
            mine = slots[w]
            while (j := next(nxt)) < n:
                _read_or_fail(bf.fd, next(mine), offs[j], bf.path)

        if pool is None:
            work(0)
        else:
            pool.run(work, min(in_flight, n))

    def batches_during(n: int, fn: Callable[[], Any]) -> tuple[list[float], float, float]:
        """Batches of n reads back to back on a background thread while fn() runs here:
        (durations of the batches that ended during fn, wall s of fn, process CPU s of fn)."""
        stop, done, errors = threading.Event(), [], []

        def issuer() -> None:
            try:
                while not stop.is_set():
                    t = time.perf_counter()
                    one_batch(n)
                    done.append((t, time.perf_counter()))
            except BaseException as e:  # handed to the caller
                errors.append(e)

        th = threading.Thread(target=issuer, daemon=True)
        th.start()
        try:
            c0, t0 = process_cpu_s(), time.perf_counter()
            fn()
            c1, t1 = process_cpu_s(), time.perf_counter()
        finally:
            stop.set()
            th.join()
        if errors:
            raise errors[0]
        return [b - a for a, b in done if a >= t0 and b <= t1], t1 - t0, c1 - c0

    it_alone: list[float] = []
    per: dict[int, dict[str, list[float]]] = {n: {"alone": [], "both": [], "lost": [], "cpu": []} for n in sizes}
    try:
        probe(time.perf_counter() + slice_s)                       # warm-up
        bf.drop_cache()
        for _ in range(slices):
            for n in sizes:
                t0 = time.perf_counter()
                k = probe(t0 + slice_s)
                it_alone.append((time.perf_counter() - t0) / max(k, 1))
                durs, wall, cpu = batches_during(n, lambda: time.sleep(slice_s))
                if durs:
                    per[n]["alone"].append(float(np.median(durs)))
                    per[n]["cpu"].append(cpu / (len(durs) * n))
                box = [0]

                def both(box: list[int] = box) -> None:
                    box[0] = probe(time.perf_counter() + slice_s)

                durs, wall, _ = batches_during(n, both)
                if durs:
                    per[n]["both"].append(float(np.median(durs)))
                    # compute lost per batch: the probe's extra time over the batches that ran meanwhile
                    per[n]["lost"].append((wall - box[0] * it_alone[-1]) * float(np.median(durs)) / wall)
    finally:
        if pool is not None:
            pool.close()
        _restore_torch_threads(torch_threads)
    return {"chunk_bytes": chunk, "in_flight": in_flight, "compute_threads": compute_threads, "slices": slices,
            "slice_s": slice_s, "batch_reads": list(sizes), "per": per, "it_alone": it_alone,
            "calls_per_iteration": calls, "load_average_1min": os.getloadavg()[0]}


def probe_summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The probe's result from the samples of one or more rounds (`probe_samples`, same chunk,
    depth and batch sizes): per batch size the medians over all slices, then a straight line
    through the two largest batch sizes splits each effect into a per-batch and a per-read part
    (>= 0)."""
    first = rounds[0]
    sizes = first["batch_reads"]
    med = {n: {k: float(np.median(v)) if (v := [x for r in rounds for x in r["per"][n][k]]) else float("nan")
               for k in ("alone", "both", "lost", "cpu")} for n in sizes}
    n1, n2 = sizes[-2:] if len(sizes) > 1 else (sizes[0], sizes[0])

    def line(y1: float, y2: float) -> tuple[float, float]:
        """(per batch, per read) through the two batch sizes, both >= 0."""
        per_read = max(0.0, (y2 - y1) / (n2 - n1))
        return max(0.0, y1 - per_read * n1), per_read

    delay = {n: med[n]["both"] - med[n]["alone"] for n in sizes}
    if n1 == n2:   # one size: all of it per read
        lost_b, lost_r, delay_b, delay_r = 0.0, max(0.0, med[n1]["lost"] / n1), 0.0, max(0.0, delay[n1] / n1)
    else:
        lost_b, lost_r = line(med[n1]["lost"], med[n2]["lost"])
        delay_b, delay_r = line(delay[n1], delay[n2])
    return {"chunk_bytes": first["chunk_bytes"], "in_flight": first["in_flight"],
            "compute_threads": first["compute_threads"], "slices": sum(r["slices"] for r in rounds),
            "rounds": len(rounds), "slice_s": first["slice_s"], "batch_reads": list(sizes),
            "cpu_s_per_read": float(np.nanmedian([med[n]["cpu"] for n in {n1, n2}])),
            "compute_lost_s_per_read": lost_r, "compute_lost_s_per_batch": lost_b,
            "read_delay_s_per_read": delay_r, "read_delay_s_per_batch": delay_b,
            "per_batch_size": {str(n): {"batch_s": med[n]["alone"], "batch_with_compute_s": med[n]["both"],
                                        "compute_lost_s": med[n]["lost"], "cpu_s_per_read": med[n]["cpu"],
                                        "delay_s": delay[n]}
                               for n in sizes},
            "probe_iteration_s": (it := float(np.median([x for r in rounds for x in r["it_alone"]]))),
            # seconds per torch call (None without torch, or a round that could not count)
            "op_s": it / calls if (calls := _median_calls(rounds)) else None,
            "load_average_1min": float(np.median([r["load_average_1min"] for r in rounds]))}


def _median_calls(rounds: list[dict[str, Any]]) -> float | None:
    calls = [r.get("calls_per_iteration") for r in rounds]
    return float(np.median(calls)) if calls and all(c for c in calls) else None  # type: ignore[arg-type]


def _torch_threads() -> int | None:
    try:
        import torch
    except ImportError:
        return None
    return torch.get_num_threads()


def _restore_torch_threads(n: int | None) -> None:
    if n is not None:
        import torch

        torch.set_num_threads(n)
