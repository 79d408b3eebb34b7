"""Device profiles: every bundled file validates and cites sources; malformed files fail clearly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from pydantic import ValidationError

from devices import FlashsimError, list_profiles, load_profile
from devices.schema import BUNDLED_DIR, DeviceProfile

ISSUE_DEVICES = {"jetson-orin-nano-8gb", "jetson-agx-orin-32gb", "jetson-agx-orin-64gb", "apple-m1-max",
                 "rtx4090-nvme", "phone-ufs4", "this-host"}


def test_every_issue_device_is_bundled() -> None:
    assert set(list_profiles()) >= ISSUE_DEVICES


@pytest.mark.parametrize("name", sorted(ISSUE_DEVICES))
def test_bundled_profile_loads_and_cites_sources(name: str) -> None:
    p = load_profile(name)
    assert p.name == name
    assert p.source.references, "a profile cites where its numbers come from"
    for section in (p.memory, p.compute, p.flash):
        assert section.source.strip()
    assert 0 < p.available_bytes < p.memory.capacity_bytes
    # sanity: 1 MiB reads and the sequential bandwidth are of one device. Not an order between them:
    # this host's virtio disk served random 1 MiB reads at 2.2-2.4 GB/s and sequential ones at
    # 1.4-1.7, so a measured profile may have either larger
    assert 0.5 <= p.flash.bytes_per_s(1 << 20) / p.flash.sequential_read_bytes_per_s <= 2.0


def test_m1_max_matches_llm_in_a_flash_figures() -> None:
    f = load_profile("apple-m1-max").flash
    assert f.sequential_read_bytes_per_s == pytest.approx(6.1e9)
    assert f.bytes_per_s(8192, 32) == pytest.approx(1.25e9, rel=0.06)
    assert f.bytes_per_s(16384, 32) == pytest.approx(2.25e9, rel=0.06)


def test_phone_ufs4_matches_issue_figures() -> None:
    f = load_profile("phone-ufs4").flash
    assert f.bytes_per_s(4096, 32) == pytest.approx(450e6, rel=0.02)
    assert f.bytes_per_s(512 * 1024, 32) == pytest.approx(3.5e9, rel=0.02)
    assert f.max_in_flight == 32


def test_this_host_is_the_measured_table() -> None:
    """this-host's flash section is bench flash's measurement, and the curve reads its table."""
    f = load_profile("this-host").flash
    assert f.read_table is not None and f.source.startswith("measured by flashsim bench flash")
    t = f.read_table
    assert f.bytes_per_s(4096, 1) == pytest.approx(t.bytes_per_s[0][0])
    assert f.bytes_per_s(1 << 20, t.in_flight[-1]) == pytest.approx(t.bytes_per_s[t.chunk_bytes.index(1 << 20)][-1])
    assert f.max_in_flight == t.in_flight[-1]


def _no_batch_overhead(data: dict) -> dict:
    data["flash"].pop("batch_overhead_s", None)
    return data["flash"]


def _write(tmp_path: Path, mutate) -> Path:
    data = yaml.safe_load((BUNDLED_DIR / "this-host.yaml").read_text())
    mutate(data)
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


@pytest.mark.parametrize(
    "mutate, expect",
    [
        (lambda d: d["memory"].pop("capacity_bytes"), r"field 'memory.capacity_bytes': required field is missing"),
        (lambda d: d["memory"].update(capacity_bytes=-1), r"memory.capacity_bytes"),
        (lambda d: d["flash"].update(speed=1), r"field 'flash.speed': unknown key"),
        (lambda d: d["flash"]["read_table"].update(chunk_bytes=[4096, 4096, 32768, 65536, 262144, 1048576]),
         r"chunk_bytes must be positive and strictly increasing"),
        (lambda d: d["memory"].update(reserved_bytes=d["memory"]["capacity_bytes"]), r"reserved_bytes"),
        (lambda d: d["compute"].update(gemv_flops_per_s={"fp64": 1.0}), r"compute.gemv_flops_per_s"),
        (lambda d: _no_batch_overhead(d).update(batch_overhead_s=[1e-5]), r"one value per read_table.in_flight entry"),
        (lambda d: _no_batch_overhead(d).update(batch_overhead_s=[-1e-5] * len(d["flash"]["read_table"]["in_flight"])),
         r"batch_overhead_s(\[0\] = -1e-05 is outside \[0| values must be >= 0)"),
    ],
)
def test_malformed_profile_names_file_and_field(tmp_path: Path, mutate, expect: str) -> None:
    path = _write(tmp_path, mutate)
    with pytest.raises(FlashsimError, match=expect) as e:
        load_profile(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_invalid_yaml_names_the_line(tmp_path: Path) -> None:
    p = tmp_path / "x.yaml"
    p.write_text("name: x\nmemory: [unclosed\n")
    with pytest.raises(FlashsimError, match=r"x.yaml: invalid YAML at line"):
        load_profile(p)


def test_unknown_device_suggests_close_names() -> None:
    with pytest.raises(FlashsimError, match=r"unknown device 'jetson-orin-nano'; did you mean 'jetson-orin-nano-8gb'"):
        load_profile("jetson-orin-nano")


def test_profile_path_env_adds_devices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = yaml.safe_load((BUNDLED_DIR / "this-host.yaml").read_text())
    data["name"] = "my-board"
    (tmp_path / "my-board.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setenv("FLASHSIM_PROFILE_PATH", str(tmp_path))
    assert "my-board" in list_profiles()
    assert load_profile("my-board").name == "my-board"


def test_batch_overhead_interpolates_between_depths_and_clamps() -> None:
    data = yaml.safe_load((BUNDLED_DIR / "this-host.yaml").read_text())
    table = data["flash"]["read_table"]
    table["bytes_per_s"] = [row[:6] for row in table["bytes_per_s"]]    # six depths, whatever was measured
    table["in_flight"] = [1, 2, 4, 8, 16, 32]
    _no_batch_overhead(data)["batch_overhead_s"] = [0.0, 1e-5, 2e-5, 4e-5, 8e-5, 1.6e-4]
    f = DeviceProfile.model_validate(data).flash
    got = f.batch_overhead_at(np.array([1, 3, 8, 24, 64]))
    assert got.tolist() == pytest.approx([0.0, 1.5e-5, 4e-5, 1.2e-4, 1.6e-4])
    data["flash"].pop("batch_overhead_s")
    assert DeviceProfile.model_validate(data).flash.batch_overhead_at(np.array([4])).tolist() == [0.0]


def test_retired_keys_of_removed_terms_still_load_and_are_dropped() -> None:
    """Profiles written with terms the simulator no longer has (RETIRED_*_KEYS) load;
    the keys are dropped, and an unknown key is still refused."""
    from devices.schema import RETIRED_COMPUTE_KEYS, RETIRED_FLASH_KEYS

    data = yaml.safe_load((BUNDLED_DIR / "this-host.yaml").read_text())
    data["flash"].update(cold_wait_s=[1e-3, 4e-3], cold_compute_s=[4e-5, 1e-4], framework_cold_compute_s=[1e-4, 2e-4])
    data["compute"].update(evict_bytes=[1e6, 4e6], evict_layer_s=[2e-5, 8e-5])
    # the fitted row moves and the framework overhead, as bench compute wrote them
    data["compute"].update(row_move_bytes_per_s=5.8e9, row_move_row_s=1.1e-6, framework_layer_s=2.8e-4,
                           framework_token_s=2.8e-4)
    # the interference curves over a batch's reads, nested per probe, as bench flash wrote them
    data["flash"].update(host_cpu_batch_reads=[16, 64], host_cpu_curves={
        "kernel": {"compute_lost_s": [3e-4, 1.2e-3], "read_delay_s": [1e-4, 5e-4]}})
    # the batch overhead by reads per thread, beside the one value per depth that stays
    data["flash"].update(batch_overhead_reads_per_thread=[1.0, 4.0], batch_overhead_by_ratio_s=[[1e-4, 1e-5]] * 7)
    # the reader's planning
    data["flash"].update(plan_s_per_batch=3.8e-4, plan_s_per_neuron=1.2e-7)
    p = DeviceProfile.model_validate(data)
    assert not any(hasattr(p.flash, k) for k in RETIRED_FLASH_KEYS)
    assert not any(hasattr(p.compute, k) for k in RETIRED_COMPUTE_KEYS)
    data["compute"]["evict_layer_sec"] = [1.0]
    with pytest.raises(ValidationError, match="evict_layer_sec"):
        DeviceProfile.model_validate(data)


def test_a_batch_overhead_by_reads_per_thread_loads_as_its_median_per_depth() -> None:
    """A profile that has only the retired by-ratio table keeps a batch overhead: per depth, the
    median over its reads-per-thread columns (what bench flash writes now)."""
    data = yaml.safe_load((BUNDLED_DIR / "this-host.yaml").read_text())
    depths = data["flash"]["read_table"]["in_flight"]
    data["flash"].pop("batch_overhead_s", None)
    data["flash"].update(batch_overhead_reads_per_thread=[1.0, 2.0, 4.0],
                         batch_overhead_by_ratio_s=[[3e-4, 2e-4, 1e-5]] * len(depths))
    p = DeviceProfile.model_validate(data)
    assert p.flash.batch_overhead_s == [2e-4] * len(depths)
