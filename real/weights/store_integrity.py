"""A weight store's integrity on the read path: a verified-once record that any change invalidates.

`real verify` hashes every byte of a store (SHA-256): the proof that the files are what the
converter wrote, but minutes on a multi-GB store, too slow to repeat before every run. The record
lets `real read`, `real run` and `real mmap` skip it safely: after a full verify passes, each file's
identity as the filesystem reports it is written to `.verified.json` in the store (or, for a
read-only store, to the user's cache folder):

    size, st_mtime_ns, st_ctime_ns, st_ino, st_dev   of every file the manifest lists, and of the manifest

Any write to a file through the filesystem (a flipped byte, a truncation, a replaced file, a copy)
changes its ctime (the kernel sets it on every data or metadata change and no user call can set it
back) or its inode, so the next run finds the record stale, hashes everything again and refuses a
corrupted store with the file and the offset of the first changed 256 KiB extent (CRC32 of every
extent, zlib, kept in the record by the last verification). What the record cannot see is
a change below the filesystem (a failing device returning other bytes without an I/O error):
`real verify` remains the check for that.

The per-run cost is one `stat` per file and one small JSON read: `tests/benchmarks/
test_bench_store_integrity.py` measures it against the reads of a run.
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from pathlib import Path
from typing import Any

from devices.errors import FlashsimError
from traces.outputs import write_atomic

RECORD = ".verified.json"
RECORD_VERSION = 1


EXTENT_BYTES = 1 << 18     # 256 KiB: the granularity at which a change is located


def _identity(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def identities(store_path: Path, names: list[str]) -> dict[str, list[int]]:
    """The filesystem identity of the manifest and of every listed file."""
    return {name: _identity(store_path / name) for name in ["manifest.json", *sorted(names)]}


def _cache_record(store_path: Path) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flashsim" / "verified"
    key = hashlib.sha256(str(store_path.resolve()).encode()).hexdigest()[:32]
    return base / f"{key}.json"


def _record_paths(store_path: Path) -> list[Path]:
    return [store_path / RECORD, _cache_record(store_path)]


def read_record(store_path: Path) -> dict[str, Any] | None:
    """The newest readable record of this store (in the store, else the cache folder), or None."""
    for p in _record_paths(store_path):
        try:
            rec = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and rec.get("version") == RECORD_VERSION \
                and rec.get("store") == str(store_path.resolve()):
            return rec
    return None


def record_matches(store_path: Path, names: list[str]) -> bool:
    """True when a verified-once record exists and every file is still the one it describes."""
    rec = read_record(store_path)
    return rec is not None and rec.get("files") == identities(store_path, names)


def hash_file(path: Path) -> tuple[str, list[int]]:
    """(SHA-256, CRC32 of every EXTENT_BYTES extent) of a file, streamed."""
    h, crcs = hashlib.sha256(), []
    try:
        with open(path, "rb") as f:
            while chunk := f.read(EXTENT_BYTES):
                h.update(chunk)
                crcs.append(zlib.crc32(chunk))
    except OSError as e:
        raise FlashsimError(f"{path}: I/O error while reading ({e.strerror or e}); the file or disk is damaged") from None
    return h.hexdigest(), crcs


def verify_store(store_path: Path, sha256: dict[str, str]) -> Path | None:
    """Hash every file of the store against the manifest's SHA-256; on success write the record
    (identities and extent CRCs) and return its path (None when nowhere is writable). A file that
    differs raises FlashsimError naming it and, when an earlier record holds its extents, the
    offset of the first changed extent."""
    old = read_record(store_path) or {}
    extents: dict[str, list[int]] = {}
    for name in sorted(sha256):
        path = store_path / name
        got, crcs = hash_file(path)
        if got != sha256[name]:
            before = (old.get("extents") or {}).get(name)
            where = ""
            if before:
                diff = [i for i, (a, b) in enumerate(zip(crcs, before)) if a != b]
                i = diff[0] if diff else min(len(crcs), len(before))
                where = f" at offset {i * EXTENT_BYTES} (the {EXTENT_BYTES // 1024} KiB extent there changed)"
            raise FlashsimError(f"{path}: checksum mismatch{where}: its bytes differ from the store's manifest (sha256 "
                                f"{got[:16]}..., expected {sha256[name][:16]}...); re-create the store with "
                                "`flashsim real convert`")
        extents[name] = crcs
    rec: dict[str, Any] = {"version": RECORD_VERSION, "store": str(store_path.resolve()),
                           "files": identities(store_path, list(sha256)), "extent_bytes": EXTENT_BYTES,
                           "extents": extents}
    text = json.dumps(rec, separators=(",", ":"))
    for p in _record_paths(store_path):
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            return write_atomic(p, lambda tmp: tmp.write_text(text, encoding="utf-8"), "verification record")
        except (OSError, FlashsimError):
            continue
    return None
