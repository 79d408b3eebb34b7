"""Published-baselines check, streaming half: the simulator against published measurements of models
served from flash with less DRAM than the model (naive loading, hybrid, mmap demand paging).

`analysis/data/published_baselines.yaml`'s `streaming_rows` list each such measurement with its device,
model, dtype, DRAM budget, the policy preset (and `--set` overrides) that expresses the published
configuration, the published figure and its metric (`io_ms_per_token`: the flash I/O time per token
alone; `ms_per_token`; `tokens_per_s`), and its source. `recompute_streaming()` replays each row on
a short synthetic trace of the row's model (the streaming policies read the same bytes whatever the
activity, so the trace's sparsity statistics do not enter these figures) with the profile's
achievable numbers, and beside them the peak bound. Nothing here feeds the profiles. Each row has its
own error bound (`max_error`); a row whose device inputs come from the publication it reproduces is
marked `circular` (with its reason) and scored apart: agreeing with it checks the replay's arithmetic,
not the device numbers.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from analysis.baselines import DATA
from devices import load_model, load_profile
from devices.achievable import at_bound
from devices.errors import FlashsimError
from sim.metric_names import (
    FLASH_BYTES_PER_TOKEN,
    FLASH_THROUGHPUT_BYTES_PER_S,
    IO_MS_PER_TOKEN,
    MS_PER_TOKEN,
    TOKENS_PER_S,
)

METRICS = (IO_MS_PER_TOKEN, MS_PER_TOKEN, TOKENS_PER_S)
TRACE_TOKENS = 48          # enough for mmap's page cache to reach its steady state on the rows' models
TRACE_SEED = 0
MODEL_BYTES_TOLERANCE = 0.10   # the simulated model must hold the published model's bytes within 10%


@dataclass(frozen=True)
class StreamingRow:
    device: str                  # a profile name, optionally NAME@MODE
    model: str                   # a bundled model spec
    dtype: str
    dram_budget_bytes: int       # the DRAM the published run had for the model (memory.dram_budget_bytes)
    model_bytes: int             # the published model's size on flash (a check against the spec)
    preset: str                  # the policy preset that expresses the published configuration
    metric: str                  # one of METRICS
    published: float
    framework: str
    conditions: str
    source: str
    settings: list[str] = field(default_factory=list)   # `--set KEY=VALUE` overrides on the preset
    max_error: float = 0.25      # this row's bound on the error (recompute_streaming)
    bound_reason: str = ""       # why a bound wider than the 25% target
    circular: bool = False       # the device inputs come from the publication this row reproduces
    circular_reason: str = ""


def load_streaming_rows(path: Path = DATA) -> list[StreamingRow]:
    """The table's streaming rows (FlashsimError on a malformed file or an unknown metric)."""
    try:
        data = yaml.safe_load(path.read_text())
        rows = [StreamingRow(**r) for r in data.get("streaming_rows", [])]
    except (OSError, KeyError, TypeError, AttributeError, yaml.YAMLError) as e:
        raise FlashsimError(f"{path}: cannot read the published streaming baselines ({e})") from None
    for r in rows:
        if r.metric not in METRICS:
            raise FlashsimError(f"{path}: streaming row {r.device}/{r.model}: metric {r.metric!r} is not one of "
                                f"{', '.join(METRICS)}")
    return rows


def _summary_value(s: dict[str, Any], metric: str) -> float:
    if metric == TOKENS_PER_S:
        return 1e3 / float(s[MS_PER_TOKEN])
    return float(s[metric])


def streaming_value(row: StreamingRow, trace_dir: Path, bound: str = "achievable") -> dict[str, Any]:
    """The row's metric as the simulator gives it, with the bytes read per token, on `bound` numbers."""
    from sim.engine import build  # sim is imported lazily, as in analysis/baselines.py
    from sim.policies.presets import preset_config
    from traces.format import open_trace
    from traces.synthetic import synthesize

    spec = load_model(row.model, dtype=row.dtype)
    profile = load_profile(row.device)
    if spec.total_weight_bytes <= row.dram_budget_bytes:
        raise FlashsimError(f"streaming row {row.device}/{row.model}: the model ({spec.total_weight_bytes} B) "
                            f"fits in the DRAM budget ({row.dram_budget_bytes} B): not a streaming baseline")
    if abs(spec.total_weight_bytes / row.model_bytes - 1.0) > MODEL_BYTES_TOLERANCE:
        raise FlashsimError(f"streaming row {row.device}/{row.model}: the spec at {row.dtype} holds "
                            f"{spec.total_weight_bytes} B, the published model {row.model_bytes} B: not the same "
                            f"bytes on flash (check the row's dtype)")
    path = trace_dir / f"{row.model}-{TRACE_TOKENS}"
    if not path.exists():
        synthesize(path, load_model(row.model), TRACE_TOKENS, TRACE_SEED, active_fraction=0.05, overlap=0.5,
                   hot_skew=0.25, magnitudes=False)
    cfg = preset_config(row.preset).with_overrides(
        [*row.settings, f"memory.dram_budget_bytes={row.dram_budget_bytes}"])
    s = build(open_trace(path), spec, at_bound(profile, bound), cfg).run(fast="auto").summary()
    return {"value": _summary_value(s, row.metric), FLASH_BYTES_PER_TOKEN: float(s[FLASH_BYTES_PER_TOKEN]),
            FLASH_THROUGHPUT_BYTES_PER_S: float(s[FLASH_THROUGHPUT_BYTES_PER_S])}


def streaming_peak_bound(row: StreamingRow, flash_bytes_per_token: float) -> float:
    """The row's metric no run can beat: the bytes the policy must read per token at the fastest the
    storage allows (the larger of the sequential read and the link: the datasheet ceilings), the
    compute overlapped entirely. In the metric's unit (ms for times, tok/s)."""
    f = load_profile(row.device).flash
    rate = max(f.sequential_read_bytes_per_s, f.link_bytes_per_s or 0.0)
    ms = 1e3 * flash_bytes_per_token / rate
    return 1e3 / ms if row.metric == TOKENS_PER_S else ms


def recompute_streaming(rows: list[StreamingRow] | None = None) -> list[dict[str, Any]]:
    """Every streaming row with the simulator's figure, the peak bound's, and the error
    (simulated / published - 1 for tokens_per_s; published / simulated - 1 for times, so that a
    positive error always means the simulator promises more speed than was measured)."""
    out = []
    with tempfile.TemporaryDirectory(prefix="flashsim-baselines-") as tmp:
        for r in rows if rows is not None else load_streaming_rows():
            sim = streaming_value(r, Path(tmp))
            peak = {"value": streaming_peak_bound(r, sim[FLASH_BYTES_PER_TOKEN])}
            if r.metric == TOKENS_PER_S:
                err = sim["value"] / r.published - 1.0
            else:
                err = r.published / sim["value"] - 1.0
            out.append({**r.__dict__, "simulated": sim["value"], "peak_bound": peak["value"],
                        FLASH_BYTES_PER_TOKEN: sim[FLASH_BYTES_PER_TOKEN],
                        FLASH_THROUGHPUT_BYTES_PER_S: sim[FLASH_THROUGHPUT_BYTES_PER_S], "error": err,
                        "within_bound": abs(err) <= r.max_error})
    return out
