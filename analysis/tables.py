"""Result tables: the column names figures and reports read (units in the names), and their loaders.

Three tables:
  - **results** (one row per sweep point): the point columns of `analysis.sweep.POINT_COLUMNS`,
    the simulator's summary metrics (below), and, added on load, one `param.<key>` column per
    swept parameter (decoded from `overrides_json`) and a `label` (preset and overrides).
  - **validation** (simulator vs real backend), long format, one row per configuration and metric:
    `config` (a label), `metric` (a summary metric name, so its unit is in the name), `sim` and
    `real` (the simulated and the measured value, same unit). Optional: `device`, `model`, `token`
    (when the comparison is per token rather than per run). The JSON that `flashsim validate
    --json` prints is read as this table too (one row per configuration and metric).
  - **memory records** (a run's memory over time): `t_s` (simulated time, s), `resident_bytes`
    (bytes in DRAM at that time), `budget_bytes` (the DRAM budget in force then); the simulator's
    `MemorySample`s, or its per-step records (`flashsim replay --records`), read as steps.
Loaders read Parquet (or CSV) and raise FlashsimError naming the file and the missing column.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from analysis import sweep_store as store
from devices.errors import FlashsimError
from sim import metric_names as names
from sim.energy import COMPONENTS

# ---- summary metrics (the keys of a RunResult summary, named where they are produced) ----------
MS_PER_TOKEN = names.MS_PER_TOKEN
TOKENS_PER_S = names.TOKENS_PER_S
IO_MS = names.IO_MS_PER_TOKEN
COMPUTE_MS = names.COMPUTE_MS_PER_TOKEN
STALL_MS = names.STALL_MS_PER_TOKEN
MEMORY_MGMT_MS = names.MEMORY_MGMT_MS_PER_TOKEN
FLASH_BYTES = names.FLASH_BYTES_PER_TOKEN
FLASH_THROUGHPUT = names.FLASH_THROUGHPUT_BYTES_PER_S
DRAM_PEAK = names.DRAM_PEAK_BYTES
MASS_KEPT = names.ACTIVATION_MASS_KEPT
SUMMARY_METRICS = (MS_PER_TOKEN, TOKENS_PER_S, IO_MS, COMPUTE_MS, STALL_MS, MEMORY_MGMT_MS,
                   FLASH_BYTES, FLASH_THROUGHPUT, DRAM_PEAK, MASS_KEPT)
# Energy per decode token (sim/energy.py): total joules and millijoules by component, flattened
# from the summary's energy_mj_per_token mapping; empty (None) for devices without energy numbers.
JOULES_PER_TOKEN = names.JOULES_PER_TOKEN
ENERGY_COMPONENTS = COMPONENTS
ENERGY_MJ = tuple(f"{names.ENERGY_MJ_PER_TOKEN}.{c}" for c in ENERGY_COMPONENTS)

# ---- point columns -----------------------------------------------------------------------------
POINT_ID = "point_id"
POINT_INDEX = "point_index"
PRESET = "preset"
DEVICE = "device"
MODEL = "model"
TRACE = "trace"
BUDGET = "dram_budget_bytes"
OVERRIDES = "overrides_json"
STATUS = "status"
ERROR = "error"
LABEL = "label"
PARAM_PREFIX = "param."
# The dimensions a point varies along (figures label and group rows by the ones that vary).
DIMENSIONS = (TRACE, MODEL, DEVICE, BUDGET, PRESET)

# ---- validation and memory tables --------------------------------------------------------------
VALIDATION_COLUMNS = ("config", "metric", "sim", "real")
VALIDATION_OPTIONAL = ("device", "model", "token")
T_S = "t_s"
RESIDENT_BYTES = "resident_bytes"
BUDGET_BYTES = "budget_bytes"
MEMORY_COLUMNS = (T_S, RESIDENT_BYTES, BUDGET_BYTES)


@dataclass(frozen=True)
class ResultSet:
    """A results table and, for a sweep directory, its manifest.

    It reads as the table: `to_pandas()` is the DataFrame itself, and DataFrame attributes and
    indexing pass through (`r.shape`, `r.columns`, `r["tokens_per_s"]`, `r.groupby(...)`, `len(r)`)."""

    table: pd.DataFrame
    manifest: dict[str, Any] | None
    source: Path

    def to_pandas(self) -> pd.DataFrame:
        """The results as a pandas DataFrame, one row per point (the same object as `table`)."""
        return self.table

    def __getattr__(self, name: str) -> Any:
        # Called only for names a ResultSet does not have: DataFrame attributes, never private ones.
        if name.startswith("_") or name == "table":
            raise AttributeError(name)
        return getattr(self.table, name)

    def __getitem__(self, key: Any) -> Any:
        return self.table[key]

    def __len__(self) -> int:
        return len(self.table)

    @property
    def ok(self) -> pd.DataFrame:
        """The rows whose point ran (status 'ok')."""
        t = self.table
        return t[t[STATUS] == "ok"] if STATUS in t else t

    @property
    def param_columns(self) -> list[str]:
        return [c for c in self.table.columns if c.startswith(PARAM_PREFIX)]

    @property
    def n_expected(self) -> int | None:
        return None if self.manifest is None else int(self.manifest.get("n_points", 0))


def read_table(path: str | Path, what: str = "table") -> pd.DataFrame:
    """A Parquet or CSV file as a DataFrame; FlashsimError when missing or unreadable."""
    path = Path(path)
    if not path.is_file():
        raise FlashsimError(f"{path}: {what} file not found")
    try:
        if path.suffix == ".parquet":
            return pq.read_table(path).to_pandas()
        if path.suffix == ".csv":
            return pd.read_csv(path)
    except (pa.ArrowException, OSError, ValueError, pd.errors.ParserError) as e:
        raise FlashsimError(f"{path}: unreadable {what} ({e})") from None
    raise FlashsimError(f"{path}: a {what} must be a .parquet or .csv file")


def require_columns(df: pd.DataFrame, columns: tuple[str, ...] | list[str], source: Path | str,
                    what: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise FlashsimError(f"{source}: not a {what}: column(s) {', '.join(missing)} missing "
                            f"(a {what} has {', '.join(columns)})")


def load_results(path: str | Path) -> ResultSet:
    """A sweep directory (manifest + results/) or a results file, with param.* and label columns."""
    path = Path(path)
    if path.is_dir():
        manifest = store.read_manifest(path)
        parts = store.part_files(path)
        frames = [read_table(f, "result file") for f in parts]
        frames = [f for f in frames if len(f)]
        if not frames:
            raise FlashsimError(f"{path}: no results yet (0 of {manifest.get('n_points', '?')} points "
                                "finished); run `flashsim sweep` into this directory first")
        table = pd.concat(frames, ignore_index=True)
    else:
        if not path.exists():
            raise FlashsimError(f"{path}: no such sweep directory or results file")
        manifest = None
        table = read_table(path, "results table")
        if table.empty:
            raise FlashsimError(f"{path}: the results table is empty")
    require_columns(table, (PRESET, STATUS), path, "results table")
    if POINT_ID in table:
        dup = table[POINT_ID][table[POINT_ID].duplicated()]
        if len(dup):
            raise FlashsimError(f"{path}: point {dup.iloc[0]} appears twice in the results; the "
                                "directory was written by two sweeps at once")
    if POINT_INDEX in table:
        table = table.sort_values(POINT_INDEX, kind="stable").reset_index(drop=True)
    if BUDGET in table:  # None ("the device's DRAM") in some part files, ints in others: one dtype
        table[BUDGET] = pd.to_numeric(table[BUDGET], errors="coerce").astype("float64")
    for col in table.columns:  # text columns: missing is None, whichever part file a row came from
        if not pd.api.types.is_numeric_dtype(table[col]) and not pd.api.types.is_bool_dtype(table[col]):
            table[col] = table[col].astype(object).where(table[col].notna(), None)
    table = _with_params(table)
    return ResultSet(table, manifest, path)


def _with_params(table: pd.DataFrame) -> pd.DataFrame:
    """Decode overrides_json into one param.<key> column per key (numeric when every value is)."""
    table = table.copy()
    if OVERRIDES in table:
        decoded = [json.loads(s) if isinstance(s, str) else {} for s in table[OVERRIDES]]
        keys = sorted({k for d in decoded for k in d})
        for k in keys:
            col = pd.Series([d.get(k) for d in decoded], index=table.index, dtype=object)
            values = col.dropna()
            numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
            table[PARAM_PREFIX + k] = pd.to_numeric(col) if numeric and len(values) else col
    else:
        decoded = [{} for _ in range(len(table))]
    if LABEL not in table:
        table[LABEL] = [
            p + (f"[{','.join(f'{k}={v}' for k, v in sorted(d.items()))}]" if d else "")
            for p, d in zip(table[PRESET].astype(str), decoded)
        ]
    return table


def load_validation(path: str | Path) -> pd.DataFrame:
    """A validation table (see the module docstring), or the JSON of `flashsim validate --json`
    (its `configs[i].metrics[m].sim/real`); sim and real must be finite numbers."""
    path = Path(path)
    df = _validate_json(path) if path.suffix == ".json" else read_table(path, "validation table")
    require_columns(df, VALIDATION_COLUMNS, path, "validation table")
    if df.empty:
        raise FlashsimError(f"{path}: the validation table is empty")
    for c in ("sim", "real"):
        values = pd.to_numeric(df[c], errors="coerce")
        if values.isna().any():
            raise FlashsimError(f"{path}: column '{c}' holds a value that is not a number "
                                f"(row {int(values.isna().to_numpy().argmax())})")
        df[c] = values
    return df


def _validate_json(path: Path) -> pd.DataFrame:
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FlashsimError(f"{path}: validation file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FlashsimError(f"{path}: not JSON ({e})") from None
    configs = report.get("configs") if isinstance(report, dict) else None
    if not isinstance(configs, list):
        raise FlashsimError(f"{path}: not the JSON of `flashsim validate --json` (no 'configs' list)")
    rows = []
    for i, c in enumerate(configs):
        metrics = c.get("metrics") if isinstance(c, dict) else None
        if not isinstance(metrics, dict):
            raise FlashsimError(f"{path}: configs[{i}] has no 'metrics' mapping")
        for metric, v in metrics.items():
            if not isinstance(v, dict) or "sim" not in v or "real" not in v:
                raise FlashsimError(f"{path}: configs[{i}].metrics.{metric} needs 'sim' and 'real'")
            rows.append({"config": str(c.get("config", i)), "metric": metric, "sim": v["sim"], "real": v["real"]})
    return pd.DataFrame(rows, columns=list(VALIDATION_COLUMNS))


def load_memory_records(path: str | Path) -> pd.DataFrame:
    """A memory-over-time table (t_s, resident_bytes, budget_bytes), sorted by time.

    Also accepts the per-step records of `flashsim replay --records` (t_start_s, t_end_s,
    resident_bytes, budget_bytes): each step's values hold from its start, and the last step's
    end closes the line."""
    df = read_table(path, "memory records table")
    if T_S not in df and {"t_start_s", "t_end_s"} <= set(df.columns) and len(df):
        last = df.iloc[[-1]].assign(t_start_s=df["t_end_s"].iloc[-1])
        df = pd.concat([df, last], ignore_index=True).rename(columns={"t_start_s": T_S})
    require_columns(df, MEMORY_COLUMNS, path, "memory records table")
    if df.empty:
        raise FlashsimError(f"{path}: the memory records table is empty")
    return df.sort_values(T_S, kind="stable").reset_index(drop=True)
