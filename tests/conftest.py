"""Shared fixtures. Global RNGs are forbidden: flashsim owns its generators (sim/rng.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from devices.curves import TableReadCurve

PROFILES = Path(__file__).resolve().parent.parent / "devices" / "profiles"


def _profiles_digest() -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(PROFILES.glob("*.yaml"))}


@pytest.fixture(autouse=True)
def _repo_profiles_untouched():
    """No test may write the committed device profiles (`flashsim bench` writes this-host by
    default: tests pass --out or --no-write). Checked around every test, so the one that wrote
    fails and the file can be restored with git."""
    before = _profiles_digest()
    yield
    after = _profiles_digest()
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, f"this test wrote devices/profiles: {', '.join(changed)} (use --out or --no-write)"


@pytest.fixture(autouse=True, scope="session")
def _own_cache_dir(tmp_path_factory: pytest.TempPathFactory):
    """flashsim's cache (synthetic planning traces, analysis/plan_setup.py) in a folder of the test
    session's own, never the user's ~/.cache/flashsim."""
    import os

    old = os.environ.get("FLASHSIM_CACHE_DIR")
    os.environ["FLASHSIM_CACHE_DIR"] = str(tmp_path_factory.mktemp("flashsim-cache"))
    yield
    if old is None:
        os.environ.pop("FLASHSIM_CACHE_DIR", None)
    else:
        os.environ["FLASHSIM_CACHE_DIR"] = old


@pytest.fixture(autouse=True)
def _no_global_rng(monkeypatch: pytest.MonkeyPatch) -> None:
    """Code under test must use named np.random.Generator streams, never NumPy's global one.

    (Python's `random` is left alone: hypothesis seeds it itself.)"""

    def _forbidden(*_a, **_k):
        raise AssertionError("global RNG used: use a seeded np.random.Generator instead")

    for name in ("random", "rand", "randn", "randint", "choice", "shuffle", "permutation"):
        monkeypatch.setattr(np.random, name, _forbidden)


@pytest.fixture
def tiny_curve() -> TableReadCurve:
    """A round-number read table: 4 KiB and 64 KiB chunks at 1 and 4 reads in flight."""
    return TableReadCurve((4096, 65536), (1, 4), ((1e8, 4e8), (1e9, 2e9)))
