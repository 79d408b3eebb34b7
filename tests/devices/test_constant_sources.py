"""Every constant of every profile has a source, and docs/devices.md's "Where each number comes from"
lists each bundled profile's constants with their sources and the date they last changed (issue 51
item 4). The date column comes from git; this test compares everything else."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from devices import FlashsimError, list_profiles
from devices.constant_sources import constant_sources
from devices.schema import BUNDLED_DIR, profile_path

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("profile_sources", ROOT / "scripts" / "profile_sources.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name", list_profiles())
def test_every_constant_has_a_source(name: str) -> None:
    consts = constant_sources(profile_path(name))
    assert len(consts) >= 20
    assert all(c["source"].strip() and c["kind"] for c in consts)
    paths = {c["path"] for c in consts}
    assert {"memory.bandwidth_bytes_per_s", "flash.sequential_read_bytes_per_s"} <= paths


def test_the_achievable_numbers_take_their_own_source() -> None:
    by = {c["path"]: c for c in constant_sources(profile_path("jetson-orin-nano-8gb"))}
    assert by["compute.gemv_efficiency.fp16"]["kind"] == "published"
    assert by["compute.gemv_efficiency.fp16"]["source"].startswith("for the class (NVIDIA GPUs, cuBLAS")
    assert by["flash.request_cpu_s"]["kind"] == by["flash.io_cores"]["kind"] == "estimate"
    assert by["energy.flash_read_active_w"]["kind"] == "datasheet"
    assert by["power_modes.modes.7w.set.memory.bandwidth_bytes_per_s"]["source"].startswith("NVIDIA nvpmodel")
    table = by["flash.read_table_achievable"]
    assert table["first_line"] < table["last_line"]          # a table is one constant over its lines


def test_a_constant_without_any_source_is_named(tmp_path: Path) -> None:
    data = yaml.safe_load((BUNDLED_DIR / "jetson-orin-nano-8gb.yaml").read_text())
    del data["flash"]["source"]
    p = tmp_path / "x.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(FlashsimError, match=r"flash\.read_latency_s, flash\.sequential_read_bytes_per_s: no source"):
        constant_sources(p)


def test_docs_block_lists_every_constant_with_its_source() -> None:
    """Regenerate with `python scripts/profile_sources.py` when this fails."""
    mod = _script()
    text = (ROOT / "docs" / "devices.md").read_text(encoding="utf-8")
    assert mod.BEGIN in text and mod.END in text
    block = text.split(mod.BEGIN, 1)[1].split(mod.END, 1)[0]

    def strip_dates(lines: list[str]) -> list[str]:
        out = []
        for line in lines:
            cells = line.split(" | ")
            if line.startswith("| `") and len(cells) == 5:
                assert cells[3] == "uncommitted" or len(cells[3]) == 10, cells[3]     # YYYY-MM-DD
                cells[3] = "-"
            out.append(" | ".join(cells))
        return out

    expected = mod.render(lambda path: lambda first, last: "-").split(mod.BEGIN, 1)[1].split(mod.END, 1)[0]
    assert strip_dates(block.splitlines()) == expected.splitlines(), \
        "docs/devices.md is out of date: run python scripts/profile_sources.py"
