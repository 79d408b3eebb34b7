"""flashsim/allocator.py: glibc's thresholds are set in a flashsim process, and left alone where the
user set them. Checked in child processes (the setting is process-wide), through glibc's own report
of its parameters (malloc_info) where it can be read."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from flashsim.allocator import MMAP_THRESHOLD_BYTES, tune_allocator

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
_PROBE = """
import ctypes
from flashsim.allocator import tune_allocator
print(tune_allocator())
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
before = libc.mallinfo2().hblkhd
p = libc.malloc(SIZE)       # a block just under the threshold: from the heap (no bytes mapped) once tuned
print(libc.mallinfo2().hblkhd - before)
libc.free(p)
"""


def _probe(env: dict[str, str]) -> list[str]:
    code = _PROBE.replace("SIZE", str(MMAP_THRESHOLD_BYTES - (1 << 20)))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return out.stdout.split()


@pytest.mark.skipif(not GLIBC, reason="glibc only")
def test_large_blocks_come_from_the_heap_once_tuned() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                                                               "GLIBC_TUNABLES")}
    tuned, mapped = _probe(env)
    assert tuned == "True" and int(mapped) == 0


@pytest.mark.skipif(not GLIBC, reason="glibc only")
def test_the_user_s_own_threshold_is_kept() -> None:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
    tuned, mapped = _probe(env)
    assert tuned == "False" and int(mapped) >= MMAP_THRESHOLD_BYTES - (1 << 20)   # mapped, as the user asked


def test_not_glibc_is_left_alone(monkeypatch) -> None:
    monkeypatch.setattr(platform, "libc_ver", lambda: ("", ""))
    assert tune_allocator() is False
