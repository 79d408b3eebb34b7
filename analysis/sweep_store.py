"""The on-disk layout of a sweep directory: manifest, lock, and the append-only Parquet dataset.

    DIR/manifest.json          what produced the results (written once, atomically; checked on reruns)
    DIR/.lock                  flock()ed while a sweep writes DIR (released by the kernel on kill -9)
    DIR/results/part-*.parquet one file per flushed batch of finished points; each written to a
                               hidden temporary name, fsync()ed, then os.replace()d into place

A part file is either complete or absent, so the set of finished points is the union of the parts'
`point_id` columns, and a rerun runs only the others: killed at any moment, a sweep loses at most
the points that had not been flushed, and never writes one twice. Sizes are bytes, times seconds.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from devices.errors import FlashsimError

FORMAT = "flashsim-sweep"
SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
RESULTS = "results"
LOCK = ".lock"
PART_GLOB = "part-*.parquet"
# Fields that must match for a rerun to add to existing results (git commit is informative only:
# the package version is the promise that results are comparable).
COMPATIBLE_FIELDS = ("format", "schema_version", "flashsim_version", "evaluator", "spec_sha256", "inputs")


def flashsim_version() -> str:
    try:
        return metadata.version("flashsim")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "unknown"


def git_commit() -> dict[str, Any]:
    """The commit of the checkout flashsim runs from, and whether it has local changes (None if unknown)."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            return {"commit": None, "dirty": None}
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
        return {"commit": head.stdout.strip(), "dirty": bool(dirty.stdout.strip()) if dirty.returncode == 0 else None}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def check_out_dir(out: Path) -> None:
    """DIR must be new, empty, or a sweep directory (one with a manifest)."""
    if out.exists() and not out.is_dir():
        raise FlashsimError(f"{out}: exists and is not a directory; choose another --out")
    if out.is_dir() and not (out / MANIFEST).is_file():
        stray = sorted(p.name for p in out.iterdir() if p.name != LOCK)
        if stray:
            raise FlashsimError(f"{out}: not empty and not a sweep directory (no {MANIFEST}; found "
                                f"{', '.join(stray[:3])}); choose a new --out")


@contextmanager
def locked(out: Path) -> Iterator[None]:
    """Hold DIR/.lock for the duration; a second sweep on the same DIR fails at once."""
    out.mkdir(parents=True, exist_ok=True)
    fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FlashsimError(f"{out}: another sweep is writing this directory; wait for it or "
                                "choose another --out") from None
        yield
    finally:
        os.close(fd)


def write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_manifest(out: Path) -> dict[str, Any]:
    path = out / MANIFEST
    try:
        m = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FlashsimError(f"{out}: not a sweep directory ({MANIFEST} is missing)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FlashsimError(f"{path}: unreadable manifest ({e}); the directory is damaged") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise FlashsimError(f"{path}: field 'format': not a flashsim sweep manifest")
    return m


def ensure_manifest(out: Path, manifest: dict[str, Any]) -> None:
    """Write the manifest of a new sweep, or check that DIR's results came from the same one."""
    path = out / MANIFEST
    if not path.exists():
        write_json_atomic(path, manifest)
        return
    old = read_manifest(out)
    for key in COMPATIBLE_FIELDS:
        if old.get(key) != manifest.get(key):
            raise FlashsimError(
                f"{out}: holds results of an incompatible sweep ({key} differs: "
                f"{_short(old.get(key))} there, {_short(manifest.get(key))} now); use a new --out"
            )


def _short(v: Any) -> str:
    if isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v):
        return f"sha256 {v[:16]}"  # a hash: its first 16 hex digits tell it apart
    s = json.dumps(v, sort_keys=True, default=str)
    return s if len(s) <= 60 else s[:57] + "..."


def part_files(out: Path) -> list[Path]:
    return sorted((out / RESULTS).glob(PART_GLOB))


def remove_stale_temporaries(out: Path) -> int:
    """Temporary part files left by a killed sweep (never valid results); returns how many."""
    stale = list((out / RESULTS).glob(".part-*.tmp*")) if (out / RESULTS).is_dir() else []
    for p in stale:
        p.unlink(missing_ok=True)
    return len(stale)


def finished_point_ids(out: Path) -> set[str]:
    """Point ids already in DIR/results (reads only that column)."""
    done: set[str] = set()
    for f in part_files(out):
        try:
            ids = pq.read_table(f, columns=["point_id"]).column("point_id").to_pylist()
        except (pa.ArrowException, OSError, KeyError) as e:
            raise FlashsimError(f"{f}: unreadable result file ({e}); the directory is damaged") from None
        dup = done.intersection(ids)
        if dup or len(set(ids)) != len(ids):
            raise FlashsimError(f"{f}: point {sorted(dup)[0] if dup else '?'} appears twice in the results; "
                                "the directory was written by two sweeps at once")
        done.update(ids)
    return done


class ResultWriter:
    """Buffers finished rows and writes them as one part file per flush (atomic, fsync'ed)."""

    def __init__(self, out: Path):
        self.dir = out / RESULTS
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rows: list[dict[str, Any]] = []
        self.n_written = 0

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)

    def flush(self) -> Path | None:
        if not self.rows:
            return None
        table = pa.Table.from_pandas(pd.DataFrame(self.rows), preserve_index=False)
        name = f"part-{uuid.uuid4().hex[:16]}.parquet"
        tmp = self.dir / f".{name}.tmp"
        with open(tmp, "wb") as f:
            pq.write_table(table, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.dir / name)
        self.n_written += len(self.rows)
        self.rows = []
        return self.dir / name
