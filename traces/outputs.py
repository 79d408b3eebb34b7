"""Output paths of every writer: checked before any work, written under a temporary name and renamed,
and the temporaries of an interrupted writer removed by the next writer to the same output.

A writer's temporary is a hidden sibling of its target, `.NAME.tmp-PID-XXXXXXXX` (the writing
process's id and a random tag), so a later writer can tell a live temporary (its process still
runs on this host) from one left by a process that was killed (kill -9, power loss). Temporaries
of older flashsim versions (`.NAME.tmp`, `.NAME.tmp-XXXXXXXX`, `.NAME.old-XXXXXXXX`) carry no process
id and are removed as stale.

What may be replaced: a rename replaces whatever the target path is, so a file output goes only onto
a regular file or a new path (a device node, FIFO or socket is refused: `--records /dev/null` would
otherwise turn the node into a file), and a folder output only onto an absent or empty folder, or,
with the writer's overwrite flag, a folder that carries flashsim's own marker of the same kind (a
trace's or a store's manifest). `/`, the home folder and a repository root are refused outright.
Temporaries are registered while they exist, so a SIGTERM handler can remove them (`live_temporaries`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import uuid
from collections.abc import Callable
from pathlib import Path

from devices.errors import FlashsimError
from devices.safe_load import special_kind

_PID = re.compile(r"\.(?:tmp|old)-(\d+)-[0-9a-f]{8}$")


_LIVE: set[Path] = set()          # this process's temporaries that may still exist


def temp_name(out: Path) -> Path:
    """A fresh temporary sibling of `out` tagged with this process's id (registered until removed)."""
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    _LIVE.add(tmp)
    return tmp


def live_temporaries() -> list[Path]:
    """Temporaries this process created that still exist (what a SIGTERM handler removes)."""
    return [p for p in list(_LIVE) if p.exists() or p.is_symlink()]


def remove_path(p: Path) -> None:
    """Remove a temporary file or folder this process wrote (never follows a symlink)."""
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            p.unlink(missing_ok=True)
    _LIVE.discard(p)


MARKERS = {"trace": ("manifest.json", "n_neurons"), "store": ("manifest.json", "flashsim-store"),
           "sweep": ("manifest.json", "points"), "keep": ("grid.json", "flashsim-validate-keep"),
           "routing trace": ("manifest.json", "flashsim-routing-trace"),
           "expert store": ("manifest.json", "flashsim-expert-store")}


def carries_marker(folder: Path, kind: str) -> bool:
    """Whether `folder` is a flashsim output of `kind` (its marker file names it)."""
    name, needle = MARKERS[kind]
    f = folder / name
    try:
        if not f.is_file() or f.stat().st_size > (64 << 20):
            return False
        doc = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and (doc.get("format") == needle or needle in doc)


def protected_folders() -> set[Path]:
    """Folders never written over or removed: /, the home folder, this repository's root."""
    out = {Path("/"), Path(__file__).resolve().parents[1]}
    with contextlib.suppress(RuntimeError, KeyError, OSError):
        out.add(Path.home().resolve())
    return out


def _refuse_protected(out: Path, option: str) -> None:
    try:
        real = out.resolve()
    except (OSError, RuntimeError):
        return
    if real in protected_folders() or (real / ".git").exists():
        raise FlashsimError(f"{option} {out}: is the root, home or a repository folder; give a new folder for the output")


def _refuse_special(out: Path, option: str) -> None:
    """A device node, FIFO or socket (or a symlink to one) is never an output."""
    try:
        st = os.stat(out)
    except OSError:
        return
    if not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):
        raise FlashsimError(f"{option} {out}: is {special_kind(st.st_mode)}; outputs go to regular files or new paths")


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
    is writable, an existing file is writable and regular (not a device node, FIFO or socket).
    FlashsimError names the option and the path."""
    out = Path(path)
    _check_encodable(out, option)
    if out.is_dir():
        raise FlashsimError(f"{option} {out}: is a directory; give a {kind}")
    _refuse_special(out, option)
    folder = out.parent
    if not folder.is_dir():
        raise FlashsimError(f"{option} {out}: folder {folder} does not exist" if not folder.exists()
                            else f"{option} {out}: {folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise FlashsimError(f"{option} {out}: not writable (permission denied); choose another path")
    return out


def check_output_dir(path: str | Path, option: str, overwrite: bool = False, kind: str = "trace",
                     flag: str = "--overwrite") -> Path:
    """`path` as a directory to create, checked before any work: not an existing file, not /, home or
    a repository root, its folder writable (created if missing); an existing folder must be empty,
    or carry the marker of a flashsim `kind` (MARKERS) and `overwrite` be set."""
    out = Path(path)
    _check_encodable(out, option)
    _refuse_protected(out, option)
    if out.exists() and not out.is_dir():
        raise FlashsimError(f"{option} {out}: exists and is not a directory; choose another path")
    if out.is_dir() and not _is_empty(out):
        if not carries_marker(out, kind):
            raise FlashsimError(f"{option} {out}: a folder that is not empty and not a flashsim {kind}; "
                                "choose a new or empty folder (it is never replaced)")
        if not overwrite:
            raise FlashsimError(f"{option} {out}: already exists; choose another path or pass {flag}")
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
    _check_encodable(path, "output")
    _refuse_special(path, "output")
    if path.is_dir() and not path.is_symlink():
        raise FlashsimError(f"{path}: is a directory; cannot write the {what} there")
    remove_stale_temporaries(path)
    tmp = temp_name(path)
    try:
        write(tmp)
        _refuse_special(path, "output")     # a node that appeared while writing is not replaced either
        os.replace(tmp, path)
    except OSError as e:
        raise FlashsimError(f"{path}: cannot write the {what} ({os_error_text(e)})") from None
    except MemoryError:
        raise FlashsimError(f"{path}: out of memory while writing the {what}; free memory or write less") from None
    finally:
        if tmp.exists() or tmp.is_symlink():
            remove_path(tmp)
        _LIVE.discard(tmp)
    return path


def replace_output(tmp: Path, path: Path) -> None:
    """Rename a finished temporary onto `path`, the last step of every file writer: refused (tmp
    removed) when `path` is a device node, FIFO, socket or folder, which a rename would replace."""
    try:
        _check_encodable(Path(path), "output")
        _refuse_special(Path(path), "output")
        if Path(path).is_dir() and not Path(path).is_symlink():
            raise FlashsimError(f"{path}: is a directory; give a file")
    except FlashsimError:
        remove_path(Path(tmp))
        raise
    os.replace(tmp, path)


def os_error_text(e: OSError) -> str:
    """An OSError as a short cause and what to do (full disk, permission, file-size limit)."""
    import errno

    hint = {errno.ENOSPC: "the disk is full; free space or write elsewhere",
            errno.EDQUOT: "the disk quota is exhausted; free space or write elsewhere",
            errno.EACCES: "permission denied; choose a writable folder",
            errno.EPERM: "operation not permitted (read-only or immutable); choose another folder",
            errno.EROFS: "read-only file system; choose another folder",
            errno.EFBIG: "file too large for this file system or the process's file-size limit (ulimit -f)",
            errno.ENAMETOOLONG: "file name too long"}.get(e.errno or 0)
    return hint or (e.strerror or str(e))


def _check_encodable(out: Path, option: str) -> None:
    """A path whose bytes are not valid UTF-8 (surrogate escapes) cannot be named in messages,
    manifests or Parquet metadata; refuse it up front."""
    try:
        str(out).encode("utf-8")
    except UnicodeEncodeError:
        raise FlashsimError(f"{option} {ascii(str(out))}: the path is not valid UTF-8; rename it") from None


def _is_empty(folder: Path) -> bool:
    try:
        return next(os.scandir(folder), None) is None
    except OSError:
        return False


def publish_dir(tmp: Path, out: Path, overwrite: bool, kind: str) -> None:
    """Rename a completed temporary directory to `out` (atomic on one filesystem). An existing
    empty `out` is replaced; one that carries the marker of `kind` only with `overwrite`; anything
    else is refused (`tmp` removed, FlashsimError raised). Used by every writer of a directory."""
    if out.exists() or out.is_symlink():
        if out.is_dir() and not out.is_symlink() and _is_empty(out):
            out.rmdir()
        elif not (overwrite and out.is_dir() and not out.is_symlink() and carries_marker(out, kind)):
            remove_path(tmp)
            raise FlashsimError(f"{out}: exists and is not a flashsim {kind} to replace; not overwritten")
        else:
            old = out.parent / f".{out.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
            _LIVE.discard(tmp)
            return
    os.replace(tmp, out)
    _LIVE.discard(tmp)
