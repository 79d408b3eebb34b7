"""The shared manifest reader: one-line errors for every way a manifest can be wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devices import FlashsimError
from devices.loading import read_versioned_json


def _read(p: Path) -> dict:
    return read_versioned_json(p, "flashsim-x", 1, kind="x", remedy="re-create it")


def test_valid_manifest_is_returned(tmp_path: Path) -> None:
    p = tmp_path / "manifest.json"
    p.write_text(json.dumps({"format": "flashsim-x", "schema_version": 1, "a": 2}))
    assert _read(p)["a"] == 2


@pytest.mark.parametrize("content, expect", [
    (b"\xff\xfe\x00binary", "invalid JSON (not UTF-8 text)"),        # used to escape as a traceback
    (b"{not json", "invalid JSON at line 1"),
    (b'{"format": "other", "schema_version": 1}', "field 'format': expected 'flashsim-x'; not a flashsim x"),
    (b'{"format": "flashsim-x", "schema_version": 7}', "field 'schema_version': 7 is not supported"),
])
def test_bad_manifests_are_one_line_errors(tmp_path: Path, content: bytes, expect: str) -> None:
    p = tmp_path / "manifest.json"
    p.write_bytes(content)
    with pytest.raises(FlashsimError) as e:
        _read(p)
    assert expect in str(e.value) and str(p) in str(e.value) and "\n" not in str(e.value)
