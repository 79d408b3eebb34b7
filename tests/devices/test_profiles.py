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
    # 1.4-1.7 (nineteenth round), so a measured profile may have either larger
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


def _by_ratio(data: dict, ratios: list[float], rows: list[list[float]]) -> None:
    """The profile's batch overhead by reads per thread (whichever form the bundled profile has)."""
    assert len(data["flash"]["read_table"]["in_flight"]) == 7
    _no_batch_overhead(data)
    data["flash"].update(batch_overhead_reads_per_thread=ratios, batch_overhead_by_ratio_s=rows)


def _no_batch_overhead(data: dict) -> dict:
    for key in ("batch_overhead_s", "batch_overhead_reads_per_thread", "batch_overhead_by_ratio_s"):
        data["flash"].pop(key, None)
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
        (lambda d: (_by_ratio(d, [1.0, 4.0], [[0.0, 0.0]] * 7), d["flash"].pop("batch_overhead_by_ratio_s")),
         r"go together"),
        (lambda d: _by_ratio(d, [4.0, 1.0], [[0.0, 0.0]] * 7), r"increasing values >= 1"),
        (lambda d: _by_ratio(d, [1.0, 4.0], [[0.0]]),
         r"one row per read_table.in_flight entry, one value per batch_overhead_reads_per_thread entry"),
        (lambda d: _by_ratio(d, [1.0, 4.0], [[0.0, -1e-5]] * 7), r"batch_overhead_by_ratio_s(\[0\]\[1\] = -1e-05 is outside \[0| values must be >= 0)"),
        (lambda d: (_by_ratio(d, [1.0], [[0.0]] * 7), d["flash"].update(batch_overhead_s=[0.0] * 7)), r"not both"),
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


def test_batch_overhead_by_reads_per_thread_by_hand() -> None:
    """Rows per depth, columns per reads per thread (1, 4): linear in the depth, log2-linear in the
    ratio reads / depth, the end values beyond either; without `reads` one read per thread."""
    data = yaml.safe_load((BUNDLED_DIR / "this-host.yaml").read_text())
    table = data["flash"]["read_table"]
    table["bytes_per_s"] = [row[:2] for row in table["bytes_per_s"]]
    table["in_flight"] = [8, 64]
    _no_batch_overhead(data)
    data["flash"]["batch_overhead_reads_per_thread"] = [1.0, 4.0]
    data["flash"]["batch_overhead_by_ratio_s"] = [[1e-4, 1e-5], [5e-4, 2e-4]]
    f = DeviceProfile.model_validate(data).flash
    depth = np.array([64, 64, 64, 64, 36, 8, 4])
    reads = np.array([64, 128, 256, 1024, 72, 8, 1])
    # ratio 1, 2 (halfway in log2), 4, 16 (clamped to 4); depth 36 halfway between the rows at ratio 2
    # ((3e-4 + 1.05e-4) / 2 at ratio 1 and 4 -> halfway); depth 8 at ratio 1; depth 4 clamped to 8's row
    want = [5e-4, 3.5e-4, 2e-4, 2e-4, ((3e-4 + 1.05e-4) / 2), 1e-4, 1e-4]
    assert f.batch_overhead_at(depth, reads).tolist() == pytest.approx(want)
    assert f.batch_overhead_at(np.array([64])).tolist() == pytest.approx([5e-4])    # default: one read per thread


COLD_FIELDS = ("cold_wait_s", "cold_batch_reads", "cold_compute_s", "framework_cold_compute_s")


def _without_cold() -> dict:
    data = yaml.safe_load((BUNDLED_DIR / "this-host.yaml").read_text())
    for k in COLD_FIELDS:
        data["flash"].pop(k, None)
    return data


def test_cold_compute_interpolates_from_zero_wait_and_clamps() -> None:
    """flash.cold_compute_s: linear between the measured waits, from 0 s at no wait, the last value
    beyond the last point, whatever the batch's reads; the framework curve under framework=True, the
    kernels' without one."""
    data = _without_cold()
    data["flash"].update(cold_wait_s=[1e-3, 4e-3, 16e-3], cold_compute_s=[4e-5, 1e-4, 2e-4],
                         framework_cold_compute_s=[1e-4, 2e-4, 5e-4])
    f = DeviceProfile.model_validate(data).flash
    wait = np.array([0, 0.5e-3, 1e-3, 2.5e-3, 10e-3, 16e-3, 1.0])
    reads = np.full(len(wait), 7)
    assert f.cold_compute_at(wait, reads).tolist() == pytest.approx([0.0, 2e-5, 4e-5, 7e-5, 1.5e-4, 2e-4, 2e-4])
    assert f.cold_compute_at(wait, reads * 100).tolist() == f.cold_compute_at(wait, reads).tolist()
    assert f.cold_compute_at(wait, reads, framework=True).tolist() == pytest.approx(
        [0.0, 5e-5, 1e-4, 1.5e-4, 3.5e-4, 5e-4, 5e-4])
    data["flash"].pop("framework_cold_compute_s")
    g = DeviceProfile.model_validate(data).flash
    assert g.cold_compute_at(wait, reads, framework=True).tolist() == g.cold_compute_at(wait, reads).tolist()
    for k in ("cold_wait_s", "cold_compute_s"):
        data["flash"].pop(k)
    assert DeviceProfile.model_validate(data).flash.cold_compute_at(wait, reads).tolist() == [0.0] * len(wait)


def test_cold_compute_of_an_older_profile_by_the_batch_reads() -> None:
    """A profile written before the twentieth round gives the curve at reads per batch
    (flash.cold_batch_reads): looked up by the reads, whatever the wait."""
    data = _without_cold()
    data["flash"].update(cold_batch_reads=[4.0, 16.0, 64.0], cold_compute_s=[4e-5, 1e-4, 2e-4])
    f = DeviceProfile.model_validate(data).flash
    reads = np.array([0, 2, 4, 10, 40, 64, 1000])
    for wait in (np.zeros(len(reads)), np.full(len(reads), 0.05)):
        assert f.cold_compute_at(wait, reads).tolist() == pytest.approx([0.0, 2e-5, 4e-5, 7e-5, 1.5e-4, 2e-4, 2e-4])


@pytest.mark.parametrize("cold, expect", [
    ({"cold_compute_s": [1e-4]}, "need cold_wait_s"),
    ({"cold_wait_s": [4e-3, 4e-3], "cold_compute_s": [1e-4, 2e-4]}, "positive and increasing"),
    ({"cold_wait_s": [4e-3, 16e-3], "cold_compute_s": [1e-4]}, "one value >= 0 seconds per cold_wait_s"),
    ({"cold_wait_s": [4e-3, 16e-3], "framework_cold_compute_s": [1e-4, -1.0]}, r"framework_cold_compute_s(\[1\] = -1 is outside \[0| needs)"),
    ({"cold_batch_reads": [4.0, 4.0], "cold_compute_s": [1e-4, 2e-4]}, "cold_batch_reads must be positive"),
    ({"cold_wait_s": [4e-3], "cold_batch_reads": [4.0], "cold_compute_s": [1e-4]}, "not both"),
])
def test_malformed_cold_compute_curve_is_refused(cold, expect) -> None:
    data = _without_cold()
    data["flash"].update(cold)
    with pytest.raises(ValidationError, match=expect):
        DeviceProfile.model_validate(data)


def test_evict_curve_interpolates_from_zero_bytes_and_clamps() -> None:
    """compute.evict_layer_s: linear between the swept sizes, from 0 s at 0 bytes, the last value
    beyond the last point; the framework curve under framework=True, the kernels' without one."""
    data = yaml.safe_load((BUNDLED_DIR / "this-host.yaml").read_text())
    data["compute"].update(evict_bytes=[1e6, 4e6], evict_layer_s=[2e-5, 8e-5], framework_evict_layer_s=[1e-4, 1.3e-4])
    c = DeviceProfile.model_validate(data).compute
    nbytes = np.array([0, 5e5, 1e6, 2.5e6, 4e6, 1e9])
    assert c.evict_at(nbytes).tolist() == pytest.approx([0.0, 1e-5, 2e-5, 5e-5, 8e-5, 8e-5])
    assert c.evict_at(nbytes, framework=True).tolist() == pytest.approx([0.0, 5e-5, 1e-4, 1.15e-4, 1.3e-4, 1.3e-4])
    data["compute"].pop("framework_evict_layer_s")
    g = DeviceProfile.model_validate(data).compute
    assert g.evict_at(nbytes, framework=True).tolist() == g.evict_at(nbytes).tolist()
    for k in ("evict_bytes", "evict_layer_s"):
        data["compute"].pop(k)
    assert DeviceProfile.model_validate(data).compute.evict_at(nbytes).tolist() == [0.0] * len(nbytes)


@pytest.mark.parametrize("curve, expect", [
    ({"evict_layer_s": [1e-4]}, "need evict_bytes"),
    ({"evict_bytes": [4e6, 1e6], "evict_layer_s": [1e-4, 2e-4]}, "positive and increasing"),
    ({"evict_bytes": [1e6, 4e6], "evict_layer_s": [1e-4]}, "one value >= 0 seconds per evict_bytes"),
    ({"evict_bytes": [1e6, 4e6], "framework_evict_layer_s": [1e-4, -1.0]}, r"framework_evict_layer_s(\[1\] = -1 is outside \[0| needs)"),
])
def test_malformed_evict_curve_is_refused(curve, expect) -> None:
    data = yaml.safe_load((BUNDLED_DIR / "this-host.yaml").read_text())
    for k in ("evict_bytes", "evict_layer_s", "framework_evict_layer_s"):
        data["compute"].pop(k, None)
    data["compute"].update(curve)
    with pytest.raises(ValidationError, match=expect):
        DeviceProfile.model_validate(data)
