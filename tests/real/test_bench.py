"""`flashsim bench flash|compute` -> a valid DeviceProfile (written to tmp_path), fio import."""

from __future__ import annotations

import configparser
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from devices.schema import load_profile
from flashsim.main import main
from real.bench.fio_import import fio_jobfile, import_fio

FIO = Path(__file__).parent / "data" / "fio_psync_2x2.json"


def _quick_flash(tmp_path: Path, *extra: str) -> list[str]:
    return ["bench", "flash", "--quick", "--duration-s", "0.02", "--size", "8MiB", "--path",
            str(tmp_path / "bench.dat"), *extra]


@pytest.fixture(scope="module")
def full_quick_flash(tmp_path_factory) -> tuple[str, Path]:
    """One quick bench flash with every probe on (the host-CPU probe, the per-request CPU cost: tens
    of seconds), its JSON and profile shared by the tests that read them:
    (stdout, the folder it ran in, holding prof.yaml). The host-CPU probe takes 4 slices per batch
    size instead of PROBE_SLICES: the tests check what it writes, not how precise its medians are."""
    import contextlib
    import io

    import real.bench.bench_flash as bfm

    folder = tmp_path_factory.mktemp("bench")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), pytest.MonkeyPatch.context() as mp:
        mp.setattr(bfm, "PROBE_SLICES", 4)
        assert main(_quick_flash(folder, "--out", str(folder / "prof.yaml"), "--json")) == 0
    return buf.getvalue(), folder


def test_bench_flash_writes_a_valid_profile(full_quick_flash):
    text, folder = full_quick_flash
    out = folder / "prof.yaml"
    res = json.loads(text)
    g = res["grid"]
    assert g["chunk_bytes"] == [4096, 65536, 1 << 20] and g["in_flight"] == [1, 4]
    assert all(v > 0 for row in g["bytes_per_s"] for v in row) and res["direct_io"]
    assert list(folder.iterdir()) == [out]        # the bench file and the reader's store it created are removed
    prof = load_profile(out)
    assert prof.name == "this-host" and prof.flash.read_table.chunk_bytes == [4096, 65536, 1 << 20]
    assert prof.flash.max_in_flight == 4 and prof.flash.source.startswith("measured by flashsim bench flash")
    # compute comes from the seed profile: `measured` only if bench compute wrote that one too
    seed_measured = load_profile("this-host").compute.source.startswith("measured by flashsim bench")
    assert prof.source.kind == ("measured" if seed_measured else "mixed")
    assert prof.flash.bytes_per_s(65536, 4) == pytest.approx(g["bytes_per_s"][1][1], rel=1e-3)
    assert prof.flash.sequential_read_bytes_per_s == pytest.approx(res["sequential"]["bytes_per_s"], rel=1e-3)
    assert prof.memory == load_profile("this-host").memory   # untouched sections kept


def test_bench_compute_then_flash_merge(tmp_path, capsys):
    out = tmp_path / "mine.yaml"
    assert main(["bench", "compute", "--quick", "--out", str(out), "--name", "my-box"]) == 0
    text = capsys.readouterr().out
    assert "fp32" in text and "DRAM copy" in text
    prof = load_profile(out)
    assert prof.name == "my-box" and set(prof.compute.gemv_flops_per_s) == {"fp32", "fp16", "bf16"}
    assert prof.compute.source.startswith("measured by flashsim bench compute")
    # the flash section comes from the base profile (this-host): "measured" only when bench wrote it too
    base_flash_measured = load_profile("this-host").flash.source.startswith("measured by flashsim bench")
    assert prof.memory.source.startswith("measured by flashsim bench compute")
    assert prof.source.kind == ("measured" if base_flash_measured else "mixed")
    assert main(_quick_flash(tmp_path, "--out", str(out), "--name", "my-box", "--no-host-cpu")) == 0
    merged = load_profile(out)
    assert merged.compute == prof.compute and merged.source.kind == "measured"
    refs = merged.source.references
    assert sum(r.startswith("flashsim bench compute") for r in refs) == 1
    assert sum(r.startswith("flashsim bench flash") for r in refs) == 1
    assert yaml.safe_load(out.read_text())["flash"]["read_table"]["in_flight"] == [1, 4]


def test_existing_file_is_read_not_removed_and_no_write(tmp_path, capsys):
    f = tmp_path / "mine.dat"
    f.write_bytes(b"\1" * (2 << 20))
    assert main(["bench", "flash", "--path", str(f), "--chunks", "4KiB,16KiB", "--in-flight", "1,2",
                 "--duration-s", "0.01", "--no-write", "--no-host-cpu"]) == 0
    assert "q=2" in capsys.readouterr().out
    assert f.read_bytes() == b"\1" * (2 << 20) and list(tmp_path.iterdir()) == [f]


@pytest.mark.parametrize("argv, message", [
    (["--chunks", "5000B"], "multiple of 4096"),
    (["--in-flight", "4,2"], "strictly increasing"),
    (["--in-flight", "x"], "not an integer"),
    (["--duration-s", "0"], "must be > 0"),
])
def test_bench_flash_bad_input(tmp_path, capsys, argv, message):
    assert main(["bench", "flash", "--no-write", "--path", str(tmp_path / "b.dat"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_fio_import(tmp_path, capsys):
    res = import_fio(FIO)
    g = res["grid"]
    assert g["chunk_bytes"] == [4096, 65536] and g["in_flight"] == [1, 4]
    assert g["bytes_per_s"][0][0] == 70530126 and g["bytes_per_s"][1][1] == 1440703362
    assert res["sequential"]["bytes_per_s"] == 2626596931
    assert res["latency_4k_qd1"]["mean_s"] == pytest.approx(57630.661779e-9)
    out = tmp_path / "fio.yaml"
    assert main(["bench", "flash", "--import-fio", str(FIO), "--out", str(out)]) == 0
    prof = load_profile(out)
    assert prof.flash.bytes_per_s(4096, 4) == pytest.approx(167329684, rel=1e-3) and "fio" in prof.flash.source


def test_fio_import_refuses_incomplete_or_buffered(tmp_path, capsys):
    data = json.loads(FIO.read_text())
    data["jobs"] = [j for j in data["jobs"] if j["jobname"] != "rand-64k-4"]
    (tmp_path / "a.json").write_text(json.dumps(data))
    assert main(["bench", "flash", "--import-fio", str(tmp_path / "a.json"), "--no-write"]) == 2
    assert "no randread job with bs=65536 at 4 reads in flight" in capsys.readouterr().err
    data = json.loads(FIO.read_text())
    data["global options"]["direct"] = "0"
    (tmp_path / "b.json").write_text(json.dumps(data))
    assert main(["bench", "flash", "--import-fio", str(tmp_path / "b.json"), "--no-write"]) == 2
    assert "without direct=1" in capsys.readouterr().err
    assert main(["bench", "flash", "--import-fio", str(FIO), "--chunks", "4KiB", "--no-write"]) == 2
    assert "drop --chunks" in capsys.readouterr().err
    (tmp_path / "c.json").write_text("fio: no such file\n")
    assert main(["bench", "flash", "--import-fio", str(tmp_path / "c.json"), "--no-write"]) == 2
    assert "not fio JSON output" in capsys.readouterr().err


def test_fio_jobfile_has_the_grid():
    cp = configparser.ConfigParser(allow_no_value=True)
    cp.read_string(fio_jobfile("/data/f", [4096, 65536], [1, 4], runtime_s=0.3))
    assert cp["global"]["direct"] == "1" and cp["global"]["runtime"] == "300ms"
    assert [s for s in cp.sections() if s.startswith("rand-")] == ["rand-4096-1", "rand-4096-4", "rand-65536-1",
                                                                  "rand-65536-4"]
    assert cp["rand-65536-4"]["numjobs"] == "4" and cp["seq"]["rw"] == "read"


def test_bench_flash_refuses_ram_filesystems(tmp_path, capsys, monkeypatch):
    import real.bench.bench_io as bio

    monkeypatch.setattr(bio, "filesystem_type", lambda p: "tmpfs")
    assert main(_quick_flash(tmp_path, "--no-write")) == 2
    assert "on tmpfs, which is RAM, not flash" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_bench_flash_measures_host_cpu_per_read(full_quick_flash):
    """Every grid point records CPU time per read; the probe writes the host CPU fields on a CPU-only host."""
    from real.bench.bench_flash import compute_runs_on_cpu, flash_section

    text, folder = full_quick_flash
    out = folder / "prof.yaml"
    res = json.loads(text)
    cpu = res["grid"]["cpu_s_per_read"]
    assert len(cpu) == 3 and all(len(r) == 2 and all(0 < v < 0.1 for v in r) for r in cpu)
    h = res["host_cpu"]
    assert h["in_flight"] == 4 and h["chunk_bytes"] == 4096 and h["compute_threads"] == 1   # 16 KiB not in the grid
    # a quarter of the reads in flight, one per thread, 2x and 8x (the line goes through the last two)
    assert 0 < h["cpu_s_per_read"] < 0.1 and h["batch_reads"] == [1, 4, 8, 32]
    for k in ("compute_lost_s_per_read", "compute_lost_s_per_batch", "read_delay_s_per_read", "read_delay_s_per_batch"):
        assert h[k] >= 0
    for d in h["per_batch_size"].values():
        assert d["batch_s"] > 0 and d["batch_with_compute_s"] > 0 and d["cpu_s_per_read"] > 0
    prof = load_profile(out)
    if compute_runs_on_cpu():
        f = prof.flash
        assert f.host_cpu_s_per_read == pytest.approx(h["cpu_s_per_read"], rel=1e-3)
        assert f.compute_lost_s_per_read == pytest.approx(h["compute_lost_s_per_read"], rel=1e-3, abs=1e-12)
        assert f.read_delay_s_per_batch == pytest.approx(h["read_delay_s_per_batch"], rel=1e-3, abs=1e-12)
        assert "compute probe" in f.source
    off = flash_section(res, "measured", shares_cpu=False)
    assert "host_cpu_s_per_read" not in off and "compute_lost_s_per_read" not in off
    # the CPU cost of one read request (real/bench/bench_request_cpu.py) is written on any host
    req = res["request_cpu"]
    assert res["grid"]["reads"] and all(v > 0 for row in res["grid"]["reads"] for v in row)
    assert 0 < req["request_cpu_s"] < 0.01 and off["request_cpu_s"] == pytest.approx(req["request_cpu_s"], rel=1e-3)
    assert prof.flash.request_cpu_s == pytest.approx(req["request_cpu_s"], rel=1e-3)
    assert "request_cpu_s measured by flashsim bench flash" in prof.flash.source


def test_bench_compute_records_threads(tmp_path, capsys):
    pytest.importorskip("torch")
    import torch

    from devices.errors import FlashsimError
    from real.bench.bench_compute import compute_sections, run_compute_bench

    before = torch.get_num_threads()
    res = run_compute_bench(quick=True, threads=1)
    assert res["threads"] == 1 and torch.get_num_threads() == before        # restored afterwards
    compute, _ = compute_sections(res, "2026-01-01", "flashsim bench compute --threads 1", "x")
    assert compute["threads"] == 1 and "1 threads" in compute["source"]
    # the sparse FFN's kernel table, per dtype, on the quick grid; every time measured (> 0)
    tables = compute["sparse_ffn"]["tables"]
    assert set(tables) == {"fp32", "fp16", "bf16"} and "bench_sparse_ffn" in compute["sparse_ffn"]["source"]
    from real.bench.bench_sparse_ffn import KERNELS, QUICK_D_MODEL, QUICK_NEURONS

    for t in tables.values():
        assert t["d_model"] == list(QUICK_D_MODEL) and t["neurons"] == list(QUICK_NEURONS)
        assert all(x > 0 for k in KERNELS for row in t[k] for x in row)
    from devices.schema import ComputeSpec

    assert ComputeSpec.model_validate(compute).sparse_ffn is not None
    # the dense GEMV table likewise
    from real.bench.bench_dense_gemv import QUICK_IN_FEATURES, QUICK_OUT_FEATURES

    dense = compute["dense_gemv"]
    assert set(dense["tables"]) == {"fp32", "fp16", "bf16"} and "bench_dense_gemv" in dense["source"]
    for t in dense["tables"].values():
        assert t["in_features"] == list(QUICK_IN_FEATURES) and t["out_features"] == list(QUICK_OUT_FEATURES)
        assert all(x > 0 for row in t["gemv_s"] for x in row)
    assert ComputeSpec.model_validate(compute).dense_gemv is not None
    # terms the simulator no longer has: neither measured nor written
    from devices.schema import RETIRED_COMPUTE_KEYS

    assert "row_move" not in res and "framework_overhead" not in res
    assert not any(k in compute for k in RETIRED_COMPUTE_KEYS)
    assert "row moves" not in compute["source"] and "framework overhead" not in compute["source"]
    with pytest.raises(FlashsimError, match="must be >= 1"):
        run_compute_bench(quick=True, threads=0)
    with pytest.raises(FlashsimError, match="needs torch"):
        run_compute_bench(quick=True, framework="numpy", threads=2)


def test_cli_bench_compute_threads_recorded(tmp_path, capsys):
    pytest.importorskip("torch")
    out = tmp_path / "c.yaml"
    assert main(["bench", "compute", "--quick", "--threads", "1", "--out", str(out), "--name", "one"]) == 0
    text = capsys.readouterr().out
    assert "1 threads" in text and "framework (tiny transformers llama)" not in text   # a retired term
    prof = load_profile(out)
    assert prof.compute.threads == 1 and prof.compute.sparse_ffn is not None and prof.compute.dense_gemv is not None
    assert any(r.endswith("--quick --threads 1") for r in prof.source.references)
    assert main(["bench", "compute", "--quick", "--threads", "0", "--no-write"]) == 2
    err = capsys.readouterr().err
    assert "--threads 0: must be >= 1" in err and "Traceback" not in err


def test_cli_bench_flash_compute_threads_and_no_host_cpu(tmp_path, capsys, monkeypatch):
    """--compute-threads reaches the probe and the profile's command; --no-host-cpu skips the probe.
    Only the kernel probe runs, at 4 slices per batch size: every probe kind and the profile's
    terms are checked on full_quick_flash's run."""
    import real.bench.bench_flash as bfm

    pytest.importorskip("torch")
    monkeypatch.setattr(bfm, "PROBE_KINDS", ("host",))
    monkeypatch.setattr(bfm, "PROBE_SLICES", 4)
    out = tmp_path / "f.yaml"
    assert main(_quick_flash(tmp_path, "--compute-threads", "2", "--out", str(out))) == 0
    text = capsys.readouterr().out
    line = next(t for t in text.splitlines() if t.startswith("host CPU probe"))
    assert "2-thread compute" in line and "us/read" in line and "4 in flight" in line
    assert "compute after a read wait" not in text and "cache index work" not in text   # retired terms
    assert "CPU per read request" in text
    assert any("--compute-threads 2" in r for r in load_profile(out).source.references)
    assert main(_quick_flash(tmp_path, "--no-host-cpu", "--out", str(out), "--json")) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["host_cpu"] is None and res["command"].endswith("--no-host-cpu")
    assert load_profile(out).flash.host_cpu_s_per_read == 0      # no probe: no host-CPU terms
    assert main(_quick_flash(tmp_path, "--no-host-cpu", "--no-write")) == 0
    assert "host CPU probe: not run" in capsys.readouterr().out
    assert main(_quick_flash(tmp_path, "--compute-threads", "0", "--no-write")) == 2
    assert main(["bench", "flash", "--import-fio", str(FIO), "--no-host-cpu", "--no-write"]) == 2
    err = capsys.readouterr().err
    assert "--compute-threads 0" in err and "drop --no-host-cpu" in err and "Traceback" not in err


def test_bench_flash_measures_the_batch_overhead_per_depth(tmp_path, capsys):
    """real.io.reader's batches of 1, 2, 4 and 8 reads per thread at each depth q of the grid, less the
    table's time: one row per depth, one value per reads per thread."""
    out = tmp_path / "prof.yaml"
    assert main(_quick_flash(tmp_path, "--out", str(out), "--json", "--no-host-cpu")) == 0
    res = json.loads(capsys.readouterr().out)
    b = res["batches"]
    assert b["in_flight"] == [1, 4] and b["bundle_bytes"] == 3072 and b["reads_per_thread"] == [1, 2, 4, 8]
    assert b["batch_neurons"] == [[1, 2, 4, 8], [4, 8, 16, 32]]
    # measured times: positive (their order is the disk's and the host's, not the code's: on a
    # loaded host one preempted small batch outlasts a larger one)
    assert all(len(t) == 4 and all(x > 0 for x in t) for t in b["batch_s"])
    assert all(len(t) == 4 and 0 < t[0] < t[1] < t[2] < t[3] for t in b["table_s"])
    assert all(len(row) == 4 and all(x >= 0 for x in row) for row in b["overhead_s"])
    prof = load_profile(out)
    # one value per depth: the median over the reads-per-thread columns
    assert prof.flash.batch_overhead_s == pytest.approx([float(np.median(row)) for row in b["overhead_s"]],
                                                         rel=1e-3, abs=1e-12)
    assert "batch overhead" in prof.flash.source and "batches of q, 2q, 4q and 8q" in prof.flash.source


def test_bench_flash_read_table_is_the_mean_time_per_byte_over_the_sweeps(tmp_path, capsys):
    """Three passes: each point of the read table is the harmonic mean of the sweeps' rates."""
    out = tmp_path / "prof.yaml"
    assert main(_quick_flash(tmp_path, "--out", str(out), "--json", "--no-host-cpu", "--passes", "3")) == 0
    res = json.loads(capsys.readouterr().out)
    assert "read_plan" not in res
    # the read table: each point's mean time per byte over the sweeps (the harmonic mean of their rates)
    g = res["grid"]
    for i, row in enumerate(g["bytes_per_s"]):
        for j, v in enumerate(row):
            rates = [sweep[i][j] for sweep in g["bytes_per_s_per_pass"]]
            assert len(rates) == 3 and v == pytest.approx(3 / sum(1 / r for r in rates), rel=1e-9)
            assert min(rates) <= v <= max(rates)
    assert not any(x.name.startswith("flashsim-reader-") for x in tmp_path.iterdir())   # its store is removed


def test_bench_flash_without_room_for_its_store_keeps_the_grid(tmp_path, capsys, monkeypatch):
    """A folder the reader's store cannot be written to: the grid is measured, the batch terms are
    not, and the results say why."""
    import real.bench.bench_flash as bench

    def refuse(folder, seed):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(bench, "bench_store", refuse)
    out = tmp_path / "prof.yaml"
    assert main(_quick_flash(tmp_path, "--out", str(out), "--json", "--no-host-cpu")) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["batches"] is None
    assert "batch overhead not measured" in res["note"] and "Permission denied" in res["note"]
    f = load_profile(out).flash
    assert f.batch_overhead_s is None and f.read_table is not None


def test_bench_flash_writes_no_retired_terms(full_quick_flash):
    """With the host CPU probe on: no compute after a read wait and no cache index work is measured
    or written (terms the simulator no longer has)."""
    from devices.schema import RETIRED_FLASH_KEYS

    text, folder = full_quick_flash
    res = json.loads(text)
    assert "cold_compute" not in res and "cache_index" not in res and "read_plan" not in res
    written = yaml.safe_load((folder / "prof.yaml").read_text())["flash"]
    assert not any(k in written for k in RETIRED_FLASH_KEYS)
    assert "compute after a read wait" not in written["source"] and "cache index work" not in written["source"]
    assert "reader planning" not in written["source"]


def test_batch_overhead_scales_the_table_by_the_disk_state_around_each_slice(monkeypatch):
    """By hand: batches that take the table's time x the disk's state + 0.2 ms. The steady reads
    around the first slice find the disk at 1.5x the table's time per byte, around the second at
    0.8x (states 1.5, 1.5, 0.8: the slices' means are 1.5 and 1.15). The overhead is 0.2 ms in
    either state; unscaled it would be the state's difference from the table."""
    from types import SimpleNamespace

    import real.bench.bench_reader as BR
    from devices.curves import TableReadCurve

    curve = TableReadCurve((4096, 65536), (1, 4), ((4.0e7, 8.0e7), (2.0e8, 4.0e8)))
    steady = iter([1 / 1.5, 1 / 1.5, 1 / 0.8])          # x the table's throughput, at each call

    def fake_batches(store, q, sizes, duration_s, rng, pause=None, pause_every_s=0.0, spaced=False):
        assert spaced                                    # one read per neuron: no two adjacent
        for slice_state in (1.5, 1.15):
            for n in sizes:
                chunks = np.full(n, 4096, np.int64)
                t_tab = BR.table_time_s(curve, chunks, q)
                yield n, SimpleNamespace(seconds=slice_state * t_tab + 2e-4, chunk_bytes=chunks), 0.0
            if slice_state == 1.5:
                pause()

    monkeypatch.setattr(BR, "reader_batches", fake_batches)
    calls = []

    def steady_bytes_per_s(chunk, q, seconds):
        calls.append((chunk, q))
        return next(steady) * curve.bytes_per_s_many(np.array([4096.0]), q)[0]

    store = SimpleNamespace(bundle_bytes=3072)               # padded to 4 KiB reads
    out = BR.batch_overhead(store, curve, [4], 1.0, np.random.default_rng(0), steady_bytes_per_s, slices=2,
                            ratios=(1, 4))
    assert calls == [(4096, 4)] * 3                          # before the first slice, after each
    assert out["overhead_s"] == [[pytest.approx(2e-4), pytest.approx(2e-4)]]     # at each reads per thread
    assert out["disk_state"] == [pytest.approx(1.5)]         # the median of the three
    t4 = BR.table_time_s(curve, np.full(4, 4096, np.int64), 4)
    assert out["batch_s"][0][0] == pytest.approx(np.median([1.5 * t4, 1.15 * t4]) + 2e-4)


def test_bench_flash_times_segmented_reads(tmp_path, capsys):
    """64 KiB reads into one buffer and into 16 discontiguous 4 KiB buffers, alternated: the
    difference per extra segment is the profile's flash.segment_s, with its source."""
    out = tmp_path / "prof.yaml"
    assert main(_quick_flash(tmp_path, "--out", str(out), "--json", "--no-host-cpu")) == 0
    sg = json.loads(capsys.readouterr().out)["segments"]
    assert sg["chunk_bytes"] == 65536 and sg["segments"] == 16 and sg["in_flight"] == 4
    assert sg["one_s_per_read"] > 0 and sg["segmented_s_per_read"] > 0 and sg["segment_s"] >= 0
    f = load_profile(out).flash
    assert f.segment_s == pytest.approx(sg["segment_s"], rel=1e-3, abs=1e-15)
    assert "segment cost" in f.source
    assert main(_quick_flash(tmp_path, "--no-host-cpu", "--out", str(tmp_path / "text.yaml"))) == 0
    assert "per extra segment" in capsys.readouterr().out


def test_random_reads_land_across_the_destination_region(tmp_path):
    """Each thread takes its own next slot of one huge-page region (as reads land in cache rows),
    not one reused buffer: after a short point, slot k of thread k and later slots hold file bytes."""

    from real.bench.bench_io import DEST_BYTES, BenchFile, random_read_bytes_per_s

    bf = BenchFile(tmp_path / "b.dat", 1 << 20, seed=0, direct=None, keep=False)
    try:
        dest = bf.destination(0)
        assert dest.nbytes == DEST_BYTES and dest.huge == hasattr(__import__("mmap"), "MADV_HUGEPAGE")
        stats: dict[str, float] = {}
        assert random_read_bytes_per_s(bf, 4096, 2, 0.02, np.random.default_rng(0), stats=stats) > 0
        slots = dest.array.reshape(-1, 4096).any(axis=1)    # the file is random bytes, the region zeros
        n = int(stats["reads"])
        assert n >= 4 and slots[:4].all()                   # both threads moved past their first slot
        assert slots.sum() == min(n, slots.size)            # every read its own slot until they wrap
        assert bf.destination(4096) is dest                 # made once per file
    finally:
        bf.close()


def test_host_cpu_probe_reads_land_across_the_destination_region(tmp_path):
    """The host CPU probe's batches land where the grid's reads land (each thread's next slot of the
    region), not in one reused buffer per thread: its terms are then measured on the same transfers."""
    from real.bench.bench_host_cpu import probe_samples
    from real.bench.bench_io import BenchFile

    bf = BenchFile(tmp_path / "b.dat", 1 << 20, seed=0, direct=None, keep=False)
    try:
        raw = probe_samples(bf, 4096, 2, slices=1, slice_s=0.02, batch_reads=(2, 4))
        assert raw is not None and raw["batch_reads"] == [2, 4]
        slots = bf.destination(0).array.reshape(-1, 4096).any(axis=1)
        assert slots[:4].all()          # both threads past their first slot
        assert slots.sum() > 4          # and on through the region
    finally:
        bf.close()


def test_cpu_rounds_run_after_each_sweep_of_the_grid(tmp_path, monkeypatch):
    """The host CPU probe's rounds sample the host across the whole calibration: one round right
    after each sweep, then their medians (not all after the grid)."""
    import real.bench.bench_flash as bfm

    events: list[str] = []
    real_read, real_round = bfm.random_read_bytes_per_s, bfm._cpu_round

    def read(*a, **k):
        events.append("read")
        return real_read(*a, **k)

    def round_(bf, cfg, r, rounds):
        events.append(f"round{r}")
        real_round(bf, cfg, r, rounds)

    monkeypatch.setattr(bfm, "random_read_bytes_per_s", read)
    monkeypatch.setattr(bfm, "_cpu_round", round_)
    cfg = bfm.FlashBenchConfig(chunks=(4096, 65536), in_flight=(1, 2), duration_s=0.04, passes=3, host_cpu=False)
    res = bfm.run_flash_bench(tmp_path / "b.dat", 8 << 20, cfg)
    sweep = ["read"] * 4
    assert events[:15] == [*sweep, "round0", *sweep, "round1", *sweep, "round2"]
    assert res["batches"] is not None


def test_probe_summary_pools_the_rounds_slices_by_hand():
    """The host CPU probe's rounds (one after each sweep) are pooled slice by slice: medians over
    all slices of all rounds, then the line through the two batch sizes (64 and 256 reads)."""
    from real.bench.bench_host_cpu import probe_summary

    def rnd(alone, both, lost, cpu, it):
        return {"chunk_bytes": 16384, "in_flight": 32, "compute_threads": 1, "slices": 2, "slice_s": 0.1,
                "batch_reads": [64, 256], "it_alone": it, "load_average_1min": 1.0,
                "per": {64: {"alone": alone[0], "both": both[0], "lost": lost[0], "cpu": cpu[0]},
                        256: {"alone": alone[1], "both": both[1], "lost": lost[1], "cpu": cpu[1]}}}

    r1 = rnd(([1e-3, 1e-3], [4e-3, 4e-3]), ([1.2e-3, 1.2e-3], [4.5e-3, 4.5e-3]), ([2e-4, 2e-4], [5e-4, 5e-4]),
             ([1e-5, 1e-5], [1e-5, 1e-5]), [2e-4, 2e-4])
    r2 = rnd(([1e-3, 9e-3], [4e-3, 8e-3]), ([1.2e-3, 9e-3], [4.5e-3, 9e-3]), ([2e-4, 9e-4], [5e-4, 9e-4]),
             ([1e-5, 3e-5], [1e-5, 3e-5]), [2e-4, 9e-4])
    out = probe_summary([r1, r2])
    # medians over the four slices: alone 1 / 4 ms, both 1.2 / 4.5 ms (delay 0.2 / 0.5), lost 0.2 / 0.5 ms
    assert out["rounds"] == 2 and out["slices"] == 4
    assert out["compute_lost_s_per_read"] == pytest.approx(0.3e-3 / 192)
    assert out["compute_lost_s_per_batch"] == pytest.approx(0.1e-3)
    assert out["read_delay_s_per_read"] == pytest.approx(0.3e-3 / 192)
    assert out["read_delay_s_per_batch"] == pytest.approx(0.1e-3)
    assert out["cpu_s_per_read"] == pytest.approx(1e-5) and out["probe_iteration_s"] == pytest.approx(2e-4)


def test_the_dense_gemv_pool_is_four_times_the_last_level_cache(tmp_path, monkeypatch):
    """sysfs's highest cache level sets the pool (4x it, at least 256 MiB; 32 MiB assumed where
    sysfs says nothing), and the pool hands out consecutive, line-aligned slices, wrapping at its end."""
    torch = pytest.importorskip("torch")
    import real.bench.bench_dense_gemv as bdg

    for i, (level, size) in enumerate(((1, "48K"), (2, "2048K"), (3, "491520K"), (1, "32K"))):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "size").write_text(f"{size}\n")
    assert bdg.last_level_cache_bytes(tmp_path) == 480 << 20
    assert bdg.last_level_cache_bytes(tmp_path / "none") == bdg.LLC_FALLBACK_BYTES
    monkeypatch.setattr(bdg, "last_level_cache_bytes", lambda: 480 << 20)
    assert bdg.pool_bytes() == 1920 << 20            # a 480 MiB L3: 4x
    monkeypatch.setattr(bdg, "last_level_cache_bytes", lambda: 32 << 20)
    assert bdg.pool_bytes() == 256 << 20             # a 32 MiB victim L3: the floor, 8x
    pool = bdg.WeightPool(torch, torch.float32, 4 * 100 * 4)   # 400 elements
    a, b = pool.next(10, 10), pool.next(10, 10)                  # 100 elements, the next at 128
    assert a.shape == (10, 10) and b.data_ptr() - a.data_ptr() == 128 * 4
    c = pool.next(10, 20)                                        # 256 + 200 > 400: back to the start
    assert c.data_ptr() == a.data_ptr() and float(c.sum()) == pytest.approx(200 * 0.02)
    assert pool.next(30, 30).shape == (30, 30)                   # larger than the pool: its own


def test_the_cpu_check_warms_its_pool_before_timing(monkeypatch):
    """The drift check reads its whole pool, untimed, before its timed GEMVs: a table cell cycles
    through the pool every few tens of milliseconds, and a pool last touched seconds ago made the
    first GEMVs 1.2-1.5x slower (real/validation/drift.py), which the checks then reported as host drift."""
    torch = pytest.importorskip("torch")
    from devices import load_profile
    from real.bench.bench_dense_gemv import WeightPool
    from real.validation import drift

    events: list[str] = []

    class Pool(WeightPool):
        def warm(self) -> None:
            events.append("warm")
            super().warm()

        def next(self, m: int, k: int):
            events.append("next")
            return super().next(m, k)

    monkeypatch.setattr(drift, "DRIFT_GEMV_SHAPE", (64, 64))
    monkeypatch.setattr(drift, "_gemv_pool", lambda: Pool(torch, torch.float32, 64 * 64 * 4 * 3))
    ratio = drift.cpu_ratio(load_profile("this-host"), seed=0, repeats=3)
    assert events == ["warm", "next", "next", "next"] and ratio > 0


def test_the_width_checks_time_table_cells_and_skip_a_profile_without_them(monkeypatch):
    """The width checks: [2048, 512] and [2048, 1024] fp32 GEMVs over the profile's own dense-table
    cells there (measured points, no interpolation); {} for a profile without a dense table."""
    torch = pytest.importorskip("torch")
    from devices import load_profile
    from real.bench.bench_dense_gemv import WeightPool
    from real.validation import drift

    shapes: list[tuple[int, int]] = []

    class Pool(WeightPool):
        def next(self, m: int, k: int):
            shapes.append((m, k))
            return super().next(m, k)

    monkeypatch.setattr(drift, "_gemv_pool", lambda: Pool(torch, torch.float32, 2048 * 1024 * 4 * 2))
    p = load_profile("this-host")
    got = drift.width_ratios(p, seed=0, repeats=2)
    assert set(got) == {"cpu_512", "cpu_1024"} and all(r > 0 for r in got.values())
    assert shapes == [(2048, 512)] * 2 + [(2048, 1024)] * 2
    # the ratio is the measured median over the table's cell: a cell twice as long halves it
    t = p.compute.dense_gemv.tables["fp32"]
    doubled = [[2 * v for v in row] for row in t.gemv_s]
    slow = p.model_copy(update={"compute": p.compute.model_copy(update={"dense_gemv": p.compute.dense_gemv.model_copy(
        update={"tables": {"fp32": t.model_copy(update={"gemv_s": doubled})}})})})
    monkeypatch.setattr(drift, "_cold_gemv_s", lambda prof, rows, cols, seed, repeats, warm=True: 1e-3)
    fast, half = drift.width_ratios(p, 0), drift.width_ratios(slow, 0)
    assert all(half[k] == pytest.approx(fast[k] / 2) for k in fast)
    assert drift.width_ratios(load_profile("apple-m1-max"), 0) == {}
