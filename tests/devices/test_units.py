"""Unit parsing at the edges."""

import pytest

from devices import FlashsimError
from devices.units import format_bytes, parse_bytes, parse_seconds


@pytest.mark.parametrize("text, expect", [("4GiB", 4 * 2**30), ("4 GB", 4 * 10**9), ("512MiB", 512 * 2**20),
                                          ("4096", 4096), (4096, 4096), ("1.5KiB", 1536), ("0", 0)])
def test_parse_bytes(text, expect) -> None:
    assert parse_bytes(text) == expect


@pytest.mark.parametrize("bad", ["-1GiB", "4 GiBs", "lots", "", True])
def test_parse_bytes_rejects(bad) -> None:
    with pytest.raises(FlashsimError, match="dram-budget"):
        parse_bytes(bad, what="dram-budget")


def test_parse_seconds_and_format() -> None:
    assert parse_seconds("50 us") == pytest.approx(50e-6)
    assert parse_seconds("2ms") == pytest.approx(2e-3)
    assert format_bytes(1536) == "1.50 KiB"
    with pytest.raises(FlashsimError):
        parse_seconds("fast")
