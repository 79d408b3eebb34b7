"""A profile's numbers agree with each other and have a plausible order of magnitude: an edit the
simulator would ignore (a copied profile with its flash numbers doubled, its achievable read table
untouched) or a unit slip (MB/s typed as bytes/s) is refused at load with a one-line error naming the
field(s), and the CLI exits 2 (issue 51 item 3)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from devices import FlashsimError, list_profiles, load_profile
from devices.schema import BUNDLED_DIR
from flashsim.main import main


def _copy(tmp_path: Path, name: str, mutate) -> Path:
    data = yaml.safe_load((BUNDLED_DIR / f"{name}.yaml").read_text())
    mutate(data)
    p = tmp_path / f"{name}-edited.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def _double_flash(d: dict) -> None:
    for key in ("sequential_read_bytes_per_s", "iops_max", "link_bytes_per_s"):
        d["flash"][key] *= 2


@pytest.mark.parametrize("name", ["jetson-orin-nano-8gb", "jetson-agx-orin-64gb", "apple-m1-max", "phone-ufs4",
                                  "rtx4090-nvme"])
def test_doubled_flash_numbers_are_refused_naming_both_fields(tmp_path: Path, name: str) -> None:
    """Before: the achievable table still capped every read and the expected figure did not move."""
    path = _copy(tmp_path, name, _double_flash)
    with pytest.raises(FlashsimError) as e:
        load_profile(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg
    assert "read_table_achievable" in msg and ("sequential_read_bytes_per_s" in msg or "link_bytes_per_s" in msg)


def test_doubled_iops_alone_is_refused(tmp_path: Path) -> None:
    path = _copy(tmp_path, "jetson-orin-nano-8gb", lambda d: d["flash"].update(iops_max=2 * d["flash"]["iops_max"]))
    with pytest.raises(FlashsimError, match=r"read_table_achievable serves at most 400,391 reads/s of 4096 B, 47% of iops_max 1,200,000"):
        load_profile(path)


def test_doubled_numbers_with_the_table_scaled_move_the_answer(tmp_path: Path) -> None:
    """The user's own numbers are respected: scaling the table with them doubles the large reads."""
    def double_all(d: dict) -> None:
        _double_flash(d)
        d["flash"]["read_table_achievable"]["bytes_per_s"] = [
            [2 * v for v in row] for row in d["flash"]["read_table_achievable"]["bytes_per_s"]]

    from devices.achievable import at_bound

    base = at_bound(load_profile("jetson-orin-nano-8gb")).flash.bytes_per_s(1 << 20, 64)
    edited = at_bound(load_profile(_copy(tmp_path, "jetson-orin-nano-8gb", double_all))).flash.bytes_per_s(1 << 20, 64)
    assert edited == pytest.approx(2 * base)


@pytest.mark.parametrize("mutate, field, unit_hint", [
    (lambda d: d["flash"].update(sequential_read_bytes_per_s=7.0e6), "flash.sequential_read_bytes_per_s", "MB/s"),
    (lambda d: d["memory"].update(bandwidth_bytes_per_s=102.0), "memory.bandwidth_bytes_per_s", "GB/s"),
    (lambda d: d["memory"].update(capacity_bytes=8), "memory.capacity_bytes", "GiB"),
    (lambda d: d["flash"].update(read_latency_s=52.6), "flash.read_latency_s", "us"),
    (lambda d: d["compute"]["gemv_flops_per_s"].update(fp16=3.76), "compute.gemv_flops_per_s", "GFLOP/s"),
])
def test_implausible_order_of_magnitude_is_refused(tmp_path: Path, mutate, field: str, unit_hint: str) -> None:
    path = _copy(tmp_path, "jetson-orin-nano-8gb", mutate)
    with pytest.raises(FlashsimError, match=rf"field '{field}'.*{unit_hint}") as e:
        load_profile(path)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("mutate, expect", [
    (lambda d: d["flash"]["read_table_achievable"]["bytes_per_s"][4].__setitem__(4, 3.6e9),
     r"read_table_achievable holds 3.60 GB/s at 1048576 B x 64 in flight, above sequential_read_bytes_per_s 3.50"),
    (lambda d: d["flash"].update(link_bytes_per_s=3.0e9),
     r"read_table_achievable holds 3.40 GB/s .* above link_bytes_per_s 3.00 GB/s"),
    (lambda d: d["flash"]["read_table_achievable"]["bytes_per_s"][0].__setitem__(4, 3.0e9),
     r"reads/s at 4096 B x 64 in flight, above iops_max 600,000"),
    (lambda d: d["memory"].update(sustained_bandwidth_bytes_per_s=2e11),
     r"sustained_bandwidth_bytes_per_s \(2e\+11\) exceeds the peak bandwidth_bytes_per_s"),
])
def test_achievable_above_its_peak_is_refused(tmp_path: Path, mutate, expect: str) -> None:
    with pytest.raises(FlashsimError, match=expect):
        load_profile(_copy(tmp_path, "jetson-orin-nano-8gb", mutate))


def test_cli_on_an_inconsistent_profile_exits_2(tmp_path: Path, capsys) -> None:
    path = _copy(tmp_path, "jetson-orin-nano-8gb", _double_flash)
    assert main(["devices", "show", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "read_table_achievable" in err and "sequential_read_bytes_per_s" in err


@pytest.mark.parametrize("name", list_profiles())
def test_every_profile_and_power_mode_passes_the_checks(name: str) -> None:
    p = load_profile(name)
    for mode in (p.power_modes.modes if p.power_modes else []):
        load_profile(f"{name}@{mode}")
