"""Physical ranges of every number a user gives: device profiles, model specs, run parameters, CLI sizes.

A number outside its range is a typo or a unit slip (bytes for GiB, 1e308 for "fast"), never a device
or a model: refusing it at load time, with the field, the value and the range, keeps overflow warnings,
absurd results and runaway allocations out of every command. Each range states its physical reason.

How a field finds its range (first match wins): `FIELD_LIMITS` is an ordered list of
(`fnmatch` pattern over "Class.field", Limit). A new field whose name carries its unit (`_s`,
`_bytes`, `_bytes_per_s`, `_flops_per_s`) is covered by the unit patterns at the end; a field that
needs another range gets one line above them. `tests/robustness/test_limits.py` checks that every
numeric field of DeviceProfile and ModelSpec has a range other than the finite-only fallback.

Hooks: `check_field(owner, name, value)` is a pydantic field validator (devices/section_base.py
`Strict`, devices/model_spec.py `ModelSpec`); `check_param(where, value)` covers run parameters
(sim/params.py `build_params`); `check_size(what, size, limit, remedy)` refuses a work size before
anything is allocated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from devices.errors import FlashsimError

TiB = 2**40


@dataclass(frozen=True)
class Limit:
    """The closed range [lo, hi] of a number, its unit for messages and the physical reason of hi."""

    lo: float
    hi: float
    unit: str
    reason: str

    def describe(self) -> str:
        return f"[{_fmt(self.lo)}, {_fmt(self.hi)}] {self.unit}".rstrip() + f" ({self.reason})"

    def violation(self, value: float) -> str | None:
        """None when `value` is in range, else why not (finite, then the range)."""
        if isinstance(value, bool):
            return None
        try:
            v = float(value)
        except OverflowError:          # an int beyond float's range
            return f"{value} is outside {self.describe()}"
        if not math.isfinite(v):
            return f"{value} is not a finite number; the range is {self.describe()}"
        if not self.lo <= v <= self.hi:
            return f"{value:g} is outside {self.describe()}" if isinstance(value, float) else \
                f"{value} is outside {self.describe()}"
        return None


def _fmt(x: float) -> str:
    """Integers below 10^8 in full (65,536), others as 1e+12."""
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e8 else f"{x:g}"


# ---- the ranges, each with its reason ---------------------------------------------------------------
FLASH_RATE = Limit(0, 1e12, "bytes/s", "no flash device reads faster than 1 TB/s: PCIe 6.0 x16 carries ~128 GB/s")
DRAM_RATE = Limit(0, 1e13, "bytes/s", "no memory system moves 10 TB/s: HBM3e GPUs reach ~5-8 TB/s")
FLOP_RATE = Limit(0, 1e17, "FLOP/s", "no single processor computes 10^17 FLOP/s: the largest reach ~10^16 at 4 bits")
DRAM_SIZE = Limit(0, 16 * TiB, "bytes", "no device has more than 16 TiB of DRAM")
SIZE = Limit(0, 16 * TiB, "bytes", "no single buffer, chunk or read exceeds 16 TiB, the largest DRAM")
DURATION = Limit(0, 3600.0, "s", "no single operation a profile times (a read, a kernel, a batch) takes an hour")
IOPS = Limit(0, 1e9, "reads/s", "no storage device serves 10^9 reads/s (the fastest NVMe: ~10^7)")
QUEUE = Limit(0, 65536, "reads", "NVMe allows at most 65,536 commands per queue")
THREADS = Limit(0, 65536, "threads", "no host runs 65,536 compute threads")
BATCH_READS = Limit(0, 1e9, "reads", "10^9 reads per batch is more than any device serves in minutes")
WIDTH = Limit(0, 2**22, "", "no layer is 4M wide: the widest published FFN (PaLM-540B) has 196,608 neurons")

# Orders of magnitude a device's headline numbers cannot fall below: a value under the floor is a unit
# slip (MB/s typed as bytes/s, GiB typed as bytes), never a device the simulator is meant for.
FLASH_SEQUENTIAL = Limit(1e7, 1e12, "bytes/s", "a flash device the weights stream from reads 10 MB/s (an "
                         "SD card) to 1 TB/s (PCIe 6.0 x16 carries ~128 GB/s); below 1e7, MB/s was typed as bytes/s")
DRAM_BANDWIDTH = Limit(1e9, 1e13, "bytes/s", "DRAM moves 1 GB/s (one 16-bit LPDDR2 channel: ~3 GB/s) to 10 TB/s "
                       "(HBM3e GPUs: ~5-8 TB/s); below 1e9, GB/s or MB/s was typed as bytes/s")
GEMV_RATE = Limit(1e8, 1e17, "FLOP/s", "a processor computes 10^8 FLOP/s (one small in-order core: ~10^9) to "
                  "10^17 (the largest reach ~10^16 at 4 bits); below 1e8, GFLOP/s was typed as FLOP/s")
DRAM_CAPACITY = Limit(2**26, 16 * TiB, "bytes", "a device that runs a model has 64 MiB to 16 TiB of DRAM; below "
                      "64 MiB, GiB or MiB was typed as bytes")
READ_LATENCY = Limit(1e-6, 1.0, "s", "one small read takes 1 us (storage-class memory: ~10 us) to 1 s (a hard "
                     "disk seeks in ~10 ms); outside it, us or ms was typed as seconds")
IOPS_RATED = Limit(100.0, 1e9, "reads/s", "storage serves 100 reads/s (a hard disk) to 10^9 (the fastest NVMe: "
                   "~10^7)")

FIELD_LIMITS: list[tuple[str, Limit]] = [
    # headline numbers with a plausible order of magnitude (above), before their unit's wide range
    ("FlashSpec.sequential_read_bytes_per_s", FLASH_SEQUENTIAL),
    ("FlashSpec.link_bytes_per_s", FLASH_SEQUENTIAL),
    ("FlashSpec.read_latency_s", READ_LATENCY),
    ("MemorySpec.bandwidth_bytes_per_s", DRAM_BANDWIDTH),
    ("MemorySpec.sustained_bandwidth_bytes_per_s", DRAM_BANDWIDTH),
    ("MemorySpec.capacity_bytes", DRAM_CAPACITY),
    ("ComputeSpec.gemv_flops_per_s", GEMV_RATE),
    # flash rates: the table's throughput and the sequential bandwidth
    ("FlashSpec.*bytes_per_s", FLASH_RATE),
    ("ReadTable.bytes_per_s", FLASH_RATE),
    ("FlashSpec.iops_max", IOPS_RATED),
    ("FlashSpec.max_in_flight", QUEUE),
    ("ReadTable.in_flight", QUEUE),
    ("MoECosts.expert_reads_in_flight", QUEUE),
    ("MoECosts.host_copy*bytes_per_s", Limit(0, 1e12, "bytes/s", "no host-to-accelerator link carries 1 TB/s: "
                                             "PCIe 6.0 x16 ~128 GB/s, NVLink-C2C ~450 GB/s")),
    ("ReadTable.chunk_bytes", SIZE),
    ("FlashSpec.host_cpu_batch_reads", BATCH_READS),
    ("FlashSpec.cold_batch_reads", BATCH_READS),
    ("ComputeSpec.threads", THREADS),
    ("ComputeSpec.cpu_cores", THREADS),
    ("FlashSpec.io_cores", THREADS),
    ("ComputeSpec.*efficiency", Limit(0.0, 1.0, "", "a share of a rate: a kernel cannot beat the bandwidth it streams at")),
    # a power mode's values are checked again against their own field's range once applied
    ("PowerMode.set", Limit(0.0, 1e17, "", "the widest range of any field a mode sets (FLOP/s); each field's own range applies after")),
    # energy numbers (devices/section_energy.py): watts, joules per byte or per FLOP, all far below this
    ("SourcedValue.value", Limit(0.0, 1e5, "", "no device of this kind draws 100 kW; energy per byte or FLOP is far smaller")),
    ("MemorySpec.*_bytes", DRAM_SIZE),
    ("SparseFfnTable.d_model", WIDTH),
    ("SparseFfnTable.neurons", WIDTH),
    ("DenseGemvTable.in_features", WIDTH),
    ("DenseGemvTable.out_features", WIDTH),
    # model specs (devices/model_spec.py)
    ("ModelSpec.n_layers", Limit(1, 1e5, "layers", "no model has 10^5 layers: the deepest published have ~10^2")),
    ("ModelSpec.d_model", WIDTH),
    ("ModelSpec.d_ff", WIDTH),
    ("ModelSpec.n_heads", Limit(1, 2**16, "heads", "no attention layer has 65,536 heads")),
    ("ModelSpec.n_kv_heads", Limit(1, 2**16, "heads", "no attention layer has 65,536 heads")),
    ("ModelSpec.head_dim", Limit(1, 2**16, "", "no attention head is 65,536 wide")),
    ("ModelSpec.vocab_size", Limit(1, 2**24, "tokens", "no vocabulary has 16M tokens (the largest: ~10^6)")),
    ("ModelSpec.learned_positions", Limit(0, 2**24, "positions", "no learned position table has 16M rows")),
    ("ModelSpec.norms_per_layer", Limit(0, 64, "norms", "a decoder layer has a handful of norms")),
    # by unit suffix: every field named after its unit
    ("*_flops_per_s", FLOP_RATE),
    ("*bytes_per_s", DRAM_RATE),
    ("*_bytes", SIZE),
    ("*_s", DURATION),
    ("*_s_per_*", DURATION),
]

FINITE = Limit(-math.inf, math.inf, "", "any finite number")


def limit_for(owner: str, name: str) -> Limit:
    """The range of field `name` of class `owner` (FINITE when no pattern matches)."""
    key = f"{owner}.{name}"
    for pattern, lim in FIELD_LIMITS:
        if fnmatchcase(key, pattern) or ("." not in pattern and fnmatchcase(name, pattern)):
            return lim
    return FINITE


def _numbers(value: Any, path: str):
    """(path, number) of every number in a value: scalars, lists, lists of lists, dict values."""
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, (int, float)):
        yield path, value
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _numbers(v, f"{path}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _numbers(v, f"{path}.{k}")


def check_field(owner: str, name: str, value: Any) -> Any:
    """Raise ValueError (pydantic reports it under the field) for a number out of its range."""
    lim = limit_for(owner, name)
    for path, v in _numbers(value, ""):
        why = lim.violation(v)
        if why:
            raise ValueError(f"{name}{path} = {why}")
    return value


# ---- run parameters (sim/params.py) and CLI sizes -------------------------------------------------
MAX_STEPS = 10**6
PARAM_LIMITS: list[tuple[str, Limit]] = [
    ("*.k", Limit(0, MAX_STEPS, "steps", "a window longer than 10^6 tokens keeps every neuron, the same as 'inf'")),
    ("workload.tokens", Limit(0, MAX_STEPS, "tokens", "10^6 decode steps per run; split longer runs")),
    ("workload.prompt_tokens", Limit(0, MAX_STEPS, "tokens", "10^6 prompt tokens per sequence")),
    ("workload.batch", Limit(1, 4096, "sequences", "4096 sequences decoded together: beyond any on-device batch")),
    ("*_bytes", SIZE),
    ("*in_flight", QUEUE),
    ("*seed", Limit(0, 2**63 - 1, "", "a seed is a non-negative 64-bit integer")),
    ("*", Limit(-(2**53), 2**53, "", "integers beyond 2^53 lose precision as floats; no parameter needs them")),
]


def check_param(where: str, value: Any) -> Any:
    """Raise FlashsimError for a run parameter (int or float) out of its range; `where` is "slot.param"."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    for pattern, lim in PARAM_LIMITS:
        if fnmatchcase(where, pattern):
            why = lim.violation(value)
            if why:
                raise FlashsimError(f"{where}: {why}")
            break
    return value


def check_cli(option: str, value: Any, lim: Limit) -> Any:
    """Raise FlashsimError for a command-line number out of `lim` (the option names the field)."""
    if value is None:
        return value
    why = lim.violation(value)
    if why:
        raise FlashsimError(f"{option}: {why}")
    return value


MAX_PARAMS = 10**14                   # parameters of one model spec (devices/model_spec.py)

# Work sizes refused before allocating: what one command may build at once.
MAX_TRACE_CELLS = 2 * 10**10          # tokens x layers x neurons of one trace: 2.5 GB of packed masks
MAX_ROUTING_CELLS = 10**9             # tokens x MoE layers x top-k of one routing trace: 6 GB of ids + weights
MAX_GRID_POINTS = 10**6               # points of one sweep: a million simulations is days of CPU
MAX_READ_CALLS = 10**7                # tokens x layers of one `real read`
READER_THREADS = Limit(1, 1024, "reads", "each read in flight is a reader thread; a process cannot start "
                       "tens of thousands, and no device gains past a few hundred")


def check_size(what: str, size: int, limit: int, remedy: str) -> None:
    """FlashsimError when `size` exceeds `limit`, naming both and what to do."""
    if size > limit:
        raise FlashsimError(f"{what} is {size:,}, above the limit of {limit:,}; {remedy}")


def memory_available_bytes() -> int | None:
    """Memory this process may still take: the smallest of the machine's MemAvailable (Linux), its
    cgroup's memory.max less what the cgroup uses, and its address-space limit (ulimit -v);
    None when none is known."""
    limits = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    limits.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError):
        pass
    cgroup = Path("/sys/fs/cgroup")
    try:
        top = (cgroup / "memory.max").read_text().strip()
        if top != "max":
            limits.append(int(top) - int((cgroup / "memory.current").read_text()))
    except (OSError, ValueError):
        pass
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:       # less the address space already mapped
            vm = next(ln for ln in Path("/proc/self/status").read_text().splitlines() if ln.startswith("VmSize:"))
            limits.append(soft - int(vm.split()[1]) * 1024)
    except (ImportError, OSError, ValueError, StopIteration):
        pass
    return max(0, min(limits)) if limits else None


def check_memory(what: str, nbytes: int, remedy: str) -> None:
    """FlashsimError when allocating `nbytes` would exceed this machine's available memory."""
    avail = memory_available_bytes()
    if avail is not None and nbytes > avail:
        raise FlashsimError(f"{what} needs {nbytes / 2**30:,.1f} GiB, more than this machine's "
                            f"{avail / 2**30:,.1f} GiB available; {remedy}")
