"""Which filesystem a path lives on (from /proc/self/mounts), to refuse measuring RAM as flash."""

from __future__ import annotations

import os
from pathlib import Path

RAM_FILESYSTEMS = {"tmpfs", "ramfs", "devtmpfs", "hugetlbfs"}


def filesystem_type(path: str | Path) -> str | None:
    """The fstype of the mount holding `path` (longest mount-point prefix), or None if unknown."""
    p = os.path.realpath(path if Path(path).exists() else Path(path).parent)
    best, fstype = "", None
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        mnt = parts[1].replace("\\040", " ")
        if (p == mnt or p.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
            best, fstype = mnt, parts[2]
    return fstype


def is_ram_backed(path: str | Path) -> bool:
    return filesystem_type(path) in RAM_FILESYSTEMS
