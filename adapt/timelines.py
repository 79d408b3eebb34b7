"""Memory-availability timelines for adaptation episodes: what the co-running world leaves the model.

Owns: the compact timeline syntax of `flashsim adapt eval --timelines` / `--budgets`, and building
each timeline as a `sim.components.memory.BudgetTimeline` (a step function of simulated time; bytes).

Syntax (one timeline; parameters comma-separated; sizes and times as below):

    0.8                                    constant: 80% of the full need (same as const:level=0.8)
    const:level=300MiB                     constant, in bytes
    step:t=40%,from=1.0,to=0.6             `from` until t, then `to`
    sawtooth:period=25%,low=0.6,high=1.0[,levels=8]
                                           each period the budget falls from high to low in `levels`
                                           equal steps (a co-runner that grows), then jumps back to high
    bursts:seed=3[,rate=4,depth=0.3,dur=10%,base=1.0]
                                           co-running applications arrive as a Poisson process (`rate`
                                           arrivals per horizon), each takes `depth` of the full need
                                           for an exponential time of mean `dur`; overlapping bursts add
                                           up; available = max(0, base - sum of active depths)
    file:PATH                              a JSON or CSV budget timeline file in bytes
                                           (format: sim/components/memory.py's docstring)

Sizes: a bare number is a fraction of the model's full need (weights + KV cache at the end of the
workload, `BlockMemory.full_need_bytes`), `N%` a percentage of it, a number with a unit (`300MiB`,
`1e8B`) bytes. Times: `N%` a share of the horizon (the episode's duration with nothing dropped, so a
timeline means the same on every device), or a duration with a unit (`2s`, `150ms`). Periodic and
random timelines are generated up to `HORIZON_SPAN` horizons; the last level holds after that.

Workload pressure is not a timeline: the KV cache grows by batch x kv_bytes_per_token of every kept
MHA block at each decode step (`sim.blocks.BlockMemory.kv_bytes`), which the episode accounts for.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from devices.errors import FlashsimError
from devices.suggest import hint
from devices.units import format_bytes, parse_bytes, parse_seconds
from sim.components.memory import BudgetTimeline, load_budget_timeline

# Periodic / random timelines are generated this many horizons ahead: a pruned model runs faster
# than the dense one, but not more than a few times faster with the blocks GSI allows dropping.
HORIZON_SPAN = 4.0

KINDS: dict[str, dict[str, str | None]] = {   # kind -> parameter -> default (None: required)
    "const": {"level": None},
    "step": {"t": None, "from": None, "to": None},
    "sawtooth": {"period": None, "low": None, "high": None, "levels": "8"},
    "bursts": {"seed": None, "rate": "4", "depth": "0.3", "dur": "10%", "base": "1.0"},
    "file": {},
}
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


@dataclass(frozen=True)
class TimelineContext:
    """What relative sizes and times refer to."""

    full_need_bytes: int      # weights + KV at the end of the workload, nothing dropped
    horizon_s: float          # the episode's simulated duration with nothing dropped


@dataclass(frozen=True)
class TimelineSpec:
    """A parsed timeline: kind, raw parameters, and the text it came from (its label)."""

    kind: str
    params: dict[str, str]
    text: str
    path: str = ""

    @property
    def label(self) -> str:
        return self.text

    def build(self, ctx: TimelineContext) -> BudgetTimeline:
        return build_timeline(self, ctx)


def parse_timeline(text: str, where: str = "--timelines") -> TimelineSpec:
    """One timeline from the syntax above; FlashsimError (one line) naming the bad part."""
    raw = text.strip()
    if not raw:
        raise FlashsimError(f"{where}: empty timeline; e.g. 0.8, step:t=40%,from=1.0,to=0.6, "
                            "sawtooth:period=25%,low=0.6,high=1.0, bursts:seed=3, file:PATH")
    if ":" not in raw:
        _size(raw, f"{where} {raw!r}", TimelineContext(1, 1.0))  # validate: a bare size is a constant
        return TimelineSpec("const", {"level": raw}, raw)
    kind, _, rest = raw.partition(":")
    kind = kind.strip()
    if kind not in KINDS:
        raise FlashsimError(f"{where} {raw!r}: unknown timeline kind {kind!r}; "
                            f"{hint(kind, KINDS, 'use one of')} (e.g. step:t=40%,from=1.0,to=0.6)")
    if kind == "file":
        path = rest.strip()
        if not path:
            raise FlashsimError(f"{where} {raw!r}: give the file, e.g. file:budget.csv")
        if not Path(path).is_file():
            raise FlashsimError(f"{where} {raw!r}: budget timeline file {path} not found")
        return TimelineSpec("file", {}, raw, path)
    params: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not value:
            raise FlashsimError(f"{where} {raw!r}: {item!r} is not key=value")
        if key not in KINDS[kind]:
            raise FlashsimError(f"{where} {raw!r}: unknown parameter {key!r} for {kind}; "
                                f"{hint(key, KINDS[kind])}")
        if key in params:
            raise FlashsimError(f"{where} {raw!r}: parameter {key!r} given twice")
        params[key] = value
    missing = [k for k, d in KINDS[kind].items() if d is None and k not in params]
    if missing:
        raise FlashsimError(f"{where} {raw!r}: missing parameter {missing[0]!r} for {kind} "
                            f"(needs {', '.join(k for k, d in KINDS[kind].items() if d is None)})")
    full = {k: params.get(k, d) for k, d in KINDS[kind].items()}
    spec = TimelineSpec(kind, {k: v for k, v in full.items() if v is not None}, raw)
    build_timeline(spec, TimelineContext(10**9, 1.0))  # every value checked now, not mid-evaluation
    return spec


def parse_timelines(text: str, where: str = "--timelines") -> list[TimelineSpec]:
    """Several timelines separated by ';' (commas separate parameters)."""
    return [parse_timeline(t, where) for t in text.split(";") if t.strip()]


def parse_budgets(text: str, where: str = "--budgets") -> list[TimelineSpec]:
    """Constant budgets '0.8,0.6' (fractions, N% or sizes with units) as const timelines."""
    out = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            raise FlashsimError(f"{where} {text!r}: empty item; e.g. --budgets 0.8,0.6")
        _size(item, f"{where} {item!r}", TimelineContext(1, 1.0))
        out.append(TimelineSpec("const", {"level": item}, item))
    return out


# ---- values --------------------------------------------------------------------------------------
def _size(value: str, where: str, ctx: TimelineContext) -> int:
    v = value.strip()
    try:
        if v.endswith("%") and _NUMBER.match(v[:-1].strip()):
            frac = float(v[:-1]) / 100
        elif _NUMBER.match(v):
            frac = float(v)
        else:
            return parse_bytes(v, where)
    except FlashsimError as e:
        raise FlashsimError(f"{e}; give a fraction of the full need (0.6), a percentage (60%) or a size "
                            "with a unit (300MiB)") from None
    if not 0 <= frac <= 100:
        raise FlashsimError(f"{where}: fraction {v} out of range; give e.g. 0.6 or 60% of the full need")
    return int(round(frac * ctx.full_need_bytes))


def _time(value: str, where: str, ctx: TimelineContext) -> float:
    v = value.strip()
    if v.endswith("%") and _NUMBER.match(v[:-1].strip()):
        pct = float(v[:-1])
        if pct < 0:
            raise FlashsimError(f"{where}: must be >= 0, got {v}")
        return pct / 100 * ctx.horizon_s
    if _NUMBER.match(v):
        raise FlashsimError(f"{where}: {v!r} needs a unit: a share of the horizon (40%) or a duration "
                            "(2s, 150ms)")
    return parse_seconds(v, where)


def _count(value: str, where: str, lo: int) -> int:
    try:
        n = int(value)
    except ValueError:
        raise FlashsimError(f"{where}: {value!r} is not an integer") from None
    if n < lo:
        raise FlashsimError(f"{where}: must be >= {lo}, got {n}")
    return n


def _float(value: str, where: str) -> float:
    if not _NUMBER.match(value.strip()):
        raise FlashsimError(f"{where}: {value!r} is not a number")
    x = float(value)
    if x < 0:
        raise FlashsimError(f"{where}: must be >= 0, got {value}")
    return x


# ---- building ------------------------------------------------------------------------------------
def build_timeline(spec: TimelineSpec, ctx: TimelineContext) -> BudgetTimeline:
    """The BudgetTimeline of `spec` for a model and horizon (bytes, seconds)."""
    w = f"timeline {spec.text!r}:"
    p = spec.params
    if spec.kind == "file":
        return load_budget_timeline(spec.path)
    if spec.kind == "const":
        return BudgetTimeline((0.0,), (_size(p["level"], f"{w} level", ctx),))
    if spec.kind == "step":
        t = _time(p["t"], f"{w} t", ctx)
        a, b = _size(p["from"], f"{w} from", ctx), _size(p["to"], f"{w} to", ctx)
        return BudgetTimeline((0.0, t), (a, b)) if t > 0 else BudgetTimeline((0.0,), (b,))
    if spec.kind == "sawtooth":
        period = _time(p["period"], f"{w} period", ctx)
        low, high = _size(p["low"], f"{w} low", ctx), _size(p["high"], f"{w} high", ctx)
        levels = _count(p["levels"], f"{w} levels", 2)
        if period <= 0:
            raise FlashsimError(f"{w} period must be > 0")
        if low > high:
            raise FlashsimError(f"{w} low ({format_bytes(low)}) must not exceed high ({format_bytes(high)})")
        n_periods = max(1, math.ceil(HORIZON_SPAN * ctx.horizon_s / period))
        ramp = [int(round(high - (high - low) * i / (levels - 1))) for i in range(levels)]
        ts = [k * period + i * period / levels for k in range(n_periods) for i in range(levels)]
        return BudgetTimeline(tuple(ts), tuple(ramp * n_periods))
    if spec.kind == "bursts":
        return _bursts(spec, ctx)
    raise AssertionError(spec.kind)


def _bursts(spec: TimelineSpec, ctx: TimelineContext) -> BudgetTimeline:
    w = f"timeline {spec.text!r}:"
    p = spec.params
    seed = _count(p["seed"], f"{w} seed", 0)
    rate = _float(p["rate"], f"{w} rate")                    # arrivals per horizon
    depth = _size(p["depth"], f"{w} depth", ctx)
    base = _size(p["base"], f"{w} base", ctx)
    mean_dur_s = _time(p["dur"], f"{w} dur", ctx)
    end_s = HORIZON_SPAN * ctx.horizon_s
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    starts: list[float] = []
    t = 0.0
    while rate > 0 and ctx.horizon_s > 0:
        t += float(rng.exponential(ctx.horizon_s / rate))
        if t >= end_s:
            break
        starts.append(t)
    durs = rng.exponential(mean_dur_s, size=len(starts)) if mean_dur_s > 0 else np.zeros(len(starts))
    events = sorted([(s, +1) for s in starts] + [(s + float(d), -1) for s, d in zip(starts, durs)])
    ts, vals, active = [0.0], [base], 0
    for time_s, delta in events:
        active += delta
        level = max(0, base - active * depth)
        if time_s == ts[-1]:
            vals[-1] = level
        else:
            ts.append(time_s)
            vals.append(level)
    return BudgetTimeline(tuple(ts), tuple(int(v) for v in vals))


def describe(tl: BudgetTimeline, full_need_bytes: int) -> str:
    """'min 60% .. max 100% of the full need, 9 changes' (for tables)."""
    lo, hi = min(tl.available_bytes), max(tl.available_bytes)
    return (f"{100 * lo / full_need_bytes:.0f}%..{100 * hi / full_need_bytes:.0f}% of the full need, "
            f"{len(tl.t_s) - 1} changes")
