"""Quality of sweep results, for the report's headline and its what-if panel: each row's perplexity
ratio to the native model and the evidence it comes from, chosen as the planner chooses it
(analysis/quality_evidence.py: measured on the model or one of its size, exact for native weights with
every neuron computed, else the published ratio of the model nearest in size; none for a sparse row at a
size never measured). The activation-mass proxy cannot see quantization error, so the report's
"best at full quality" uses this, not the mass kept.

Columns added by `with_quality(table)`: `ppl_ratio` (float, NaN when unknown), `quality_evidence` (the
short name of the evidence) and `weight_bits` (None for native, 8 or 4).
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from typing import Any

import pandas as pd

from analysis import tables as T
from analysis.quality_evidence import DEFAULT_MAX_PPL_RATIO, QualityEvidence, quality_evidence
from analysis.quality_table import config_bits, load_quality_table
from devices.errors import FlashsimError

PPL = "ppl_ratio"
EVIDENCE = "quality_evidence"
BITS = "weight_bits"
FLOOR = DEFAULT_MAX_PPL_RATIO


@lru_cache(maxsize=16)
def _evidence(model: str | None, trace: str | None) -> QualityEvidence | None:
    """The evidence for a row's model: the named one, else the trace's own; None when neither loads."""
    from devices import load_model

    try:
        if model:
            spec = load_model(model)
        elif trace:
            from traces.format import open_trace

            spec = open_trace(trace).spec
        else:
            return None
        return quality_evidence(spec, load_quality_table())
    except (FlashsimError, OSError, ValueError):
        return None


def _overrides(row: pd.Series) -> tuple[str, ...]:
    raw = row.get(T.OVERRIDES)
    try:
        d = json.loads(raw) if isinstance(raw, str) and raw else {}
    except ValueError:
        d = {}
    return tuple(f"{k}={v}" for k, v in sorted(d.items()))


def row_quality(row: pd.Series) -> tuple[float, str, int | None]:
    """(ppl ratio or NaN, evidence name, weight bits) of one results row."""
    try:
        bits = config_bits(str(row[T.PRESET]), _overrides(row))
    except (FlashsimError, ValueError, KeyError):
        return math.nan, "unknown configuration", None
    mass = row.get(T.MASS_KEPT)
    mass = float(mass) if mass is not None and not pd.isna(mass) else None
    if mass is None:
        return math.nan, "did not run", bits
    model = row.get(T.MODEL)
    ev = _evidence(None if model is None or pd.isna(model) else str(model), str(row.get(T.TRACE) or "") or None)
    if ev is None:
        if bits is None and mass >= 1 - 1e-9:
            return 1.0, "exact (native, dense)", bits
        return math.nan, "model unknown", bits
    q = ev.lookup(bits, mass)
    if q is None:
        return math.nan, ev.unknown()["short"], bits
    return float(q["ppl_ratio"]), q["evidence"]["short"] + (" (bound)" if q["bound"] else ""), bits


def with_quality(table: pd.DataFrame) -> pd.DataFrame:
    """The results with ppl_ratio, quality_evidence and weight_bits columns (see the module doc)."""
    if T.PRESET not in table or table.empty:
        return table.assign(**{PPL: math.nan, EVIDENCE: None, BITS: None})
    rated = [row_quality(r) for _, r in table.iterrows()]
    return table.assign(**{PPL: [q[0] for q in rated], EVIDENCE: [q[1] for q in rated],
                           BITS: [q[2] for q in rated]})


def meets_floor(df: pd.DataFrame, floor: float = FLOOR) -> pd.Series:
    """Rows whose rated perplexity ratio is at most `floor` (unknown quality, or a bound below the
    measured curve, never meets it)."""
    bound = df[EVIDENCE].astype(str).str.endswith("(bound)")
    return df[PPL].notna() & (df[PPL] <= floor + 1e-12) & ~bound


def evidence_counts(df: pd.DataFrame) -> dict[str, Any]:
    """How many rows each evidence rated (for the report's note)."""
    return {str(k): int(v) for k, v in df[EVIDENCE].value_counts(dropna=True).items()}
