"""Unit parsing at the edges."""

import pytest

from devices import FlashsimError
from devices.units import format_bytes, parse_bytes, parse_seconds


@pytest.mark.parametrize("text, expect", [("4GiB", 4 * 2**30), ("4 GB", 4 * 10**9), ("512MiB", 512 * 2**20),
                                          ("4096B", 4096), ("1.5KiB", 1536), ("0", 0), (0, 0)])
def test_parse_bytes(text, expect) -> None:
    assert parse_bytes(text) == expect


@pytest.mark.parametrize("bad", ["-1GiB", "4 GiBs", "lots", "", True])
def test_parse_bytes_rejects(bad) -> None:
    with pytest.raises(FlashsimError, match="dram-budget"):
        parse_bytes(bad, what="dram-budget")


@pytest.mark.parametrize("bare", ["3", "4096", 3, 2.5, " 12 "])
def test_size_without_unit_is_refused_with_the_fix(bare) -> None:
    """`--dram-free 3` once planned for 3 bytes: a size a person types must carry its unit."""
    with pytest.raises(FlashsimError, match=r"--dram-free: [0-9.]+: give a unit, e.g. [0-9.]+GiB"):
        parse_bytes(bare, what="--dram-free")


def test_key_that_names_its_unit_takes_bare_bytes() -> None:
    assert parse_bytes("4096", "memory.dram_budget_bytes", unit="bytes") == 4096
    assert parse_bytes(4096, "memory.dram_budget_bytes", unit="bytes") == 4096


def test_parse_seconds_and_format() -> None:
    assert parse_seconds("50 us") == pytest.approx(50e-6)
    assert parse_seconds("2ms") == pytest.approx(2e-3)
    assert format_bytes(1536) == "1.50 KiB"
    with pytest.raises(FlashsimError):
        parse_seconds("fast")


@pytest.mark.parametrize("argv", [
    ["plan", "--model", "llama-3.2-3b", "--device", "jetson-orin-nano-8gb", "--dram-free", "3"],
    ["replay", "--trace", "no-such-trace", "--device", "apple-m1-max", "--dram-budget", "3"],
])
def test_cli_size_without_unit_exits_2(capsys, argv) -> None:
    """Every command that parses a size refuses a bare number before any work, with the fix."""
    from flashsim.main import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "3: give a unit, e.g. 3GiB" in err and len(err.strip().splitlines()) == 1
