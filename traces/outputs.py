"""Output paths of every writer: checked before any work, written under a temporary name and renamed,
and the temporaries of an interrupted writer removed by the next writer to the same output.

A writer's temporary is a hidden sibling of its target, `.NAME.tmp-PID-XXXXXXXX` (the writing
process's id and a random tag), so a later writer can tell a live temporary (its process still
runs on this host) from one left by a process that was killed (kill -9, power loss). Temporaries
of older flashsim versions (`.NAME.tmp`, `.NAME.tmp-XXXXXXXX`, `.NAME.old-XXXXXXXX`) carry no process
id and are removed as stale.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

from devices.errors import FlashsimError

_PID = re.compile(r"\.(?:tmp|old)-(\d+)-[0-9a-f]{8}$")


def temp_name(out: Path) -> Path:
    """A fresh temporary sibling of `out` tagged with this process's id."""
    return out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:        # another user's live process
        return True
    return True


def remove_stale_temporaries(out: Path) -> list[Path]:
    """Remove temporaries of `out` left by writers that no longer run; returns what was removed."""
    removed = []
    if not out.parent.is_dir():
        return removed
    for p in out.parent.glob(f".{out.name}.*"):
        rest = p.name[len(out.name) + 1:]
        if not rest.startswith((".tmp", ".old-")):
            continue
        m = _PID.search(p.name)
        if m and int(m.group(1)) != os.getpid() and _alive(int(m.group(1))):
            continue
        if m and int(m.group(1)) == os.getpid():
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        removed.append(p)
    return removed


def check_output_file(path: str | Path, option: str, kind: str = "file") -> Path:
    """`path` as a file to write, checked before any work: not a directory, its folder exists and
    is writable, an existing file is writable. FlashsimError names the option and the path."""
    out = Path(path)
    if out.is_dir():
        raise FlashsimError(f"{option} {out}: is a directory; give a {kind}")
    folder = out.parent
    if not folder.is_dir():
        raise FlashsimError(f"{option} {out}: folder {folder} does not exist" if not folder.exists()
                            else f"{option} {out}: {folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise FlashsimError(f"{option} {out}: not writable (permission denied); choose another path")
    return out


def check_output_dir(path: str | Path, option: str, overwrite: bool = False) -> Path:
    """`path` as a directory to create, checked before any work: not an existing file, its folder
    writable (created if missing), and absent unless `overwrite`."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise FlashsimError(f"{option} {out}: exists and is not a directory; choose another path")
    if out.exists() and not overwrite:
        raise FlashsimError(f"{option} {out}: already exists; choose another path or remove it")
    folder = out.parent
    if folder.exists() and not folder.is_dir():
        raise FlashsimError(f"{option} {out}: {folder} is not a folder")
    probe = folder
    while not probe.exists():
        probe = probe.parent
    if not os.access(probe, os.W_OK | os.X_OK):
        raise FlashsimError(f"{option} {out}: {probe} is not writable (permission denied); choose another path")
    return out


def write_atomic(path: str | Path, write: Callable[[Path], object], what: str = "output") -> Path:
    """Call `write(tmp)` on a temporary sibling, then rename it to `path`; on any failure the
    temporary is removed and an OSError becomes a FlashsimError naming the path."""
    path = Path(path)
    remove_stale_temporaries(path)
    tmp = temp_name(path)
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as e:
        raise FlashsimError(f"{path}: cannot write the {what} ({e.strerror or e})") from None
    finally:
        if tmp.exists() or tmp.is_symlink():
            if tmp.is_dir():
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                tmp.unlink(missing_ok=True)
    return path
