"""Components with hand-computable numbers: flash batches and the FIFO device, compute phases and
DMA contention, memory accounting and budget timelines. Curves have round numbers (tiny_curve:
4 KiB reads at 1e8 B/s with one in flight, 4e8 with four; 64 KiB at 1e9 / 2e9)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import simpy

from devices import load_model, load_profile
from devices.curves import ClosedFormReadCurve, read_time_s
from devices.errors import FlashsimError
from sim.components.compute import ComputeModel, Phase, stretch
from sim.components.flash import FlashDevice, ReadCost, region_time_s
from sim.components.memory import BudgetTimeline, MemoryModel, load_budget_timeline


def test_read_cost_single_group_equals_read_time_s(tiny_curve) -> None:
    rc = ReadCost(tiny_curve, np.array([4096, 65536]), in_flight=4)
    # 10 reads of 4 KiB at depth 4: 10 * 4096 / 4e8
    assert rc.time_s(np.array([10, 0])) == pytest.approx(10 * 4096 / 4e8)
    assert rc.time_s(np.array([10, 0])) == pytest.approx(read_time_s(tiny_curve, 4096, 10, 4))
    # one 64 KiB read runs at depth 1: 65536 / 1e9
    assert rc.time_s(np.array([0, 1])) == pytest.approx(65536 / 1e9)
    # mixed batch: 3 reads in flight (depth 3: interpolated 3e8 for 4 KiB, 1.6667e9 for 64 KiB)
    t = rc.time_s(np.array([2, 1]))
    assert t == pytest.approx(2 * 4096 / 3e8 + 65536 / (1e9 + 2 / 3 * 1e9))
    assert rc.bytes(np.array([[2, 1], [0, 0]])).tolist() == [2 * 4096 + 65536, 0]
    assert rc.time_s(np.zeros(2)) == 0


def test_read_cost_adds_the_batch_overhead_at_the_batch_depth(tiny_curve) -> None:
    over = {1: 1e-6, 2: 2e-6, 3: 3e-6, 4: 5e-6}
    rc = ReadCost(tiny_curve, np.array([4096, 65536]), in_flight=4,
                  batch_overhead_s=lambda q, n: np.array([over[int(x)] for x in q]))
    plain = ReadCost(tiny_curve, np.array([4096, 65536]), in_flight=4)
    counts = np.array([[10, 0], [2, 1], [0, 1], [0, 0]])      # depths 4 (capped), 3, 1 and no batch
    assert (rc.time_s(counts) - plain.time_s(counts)).tolist() == pytest.approx([5e-6, 3e-6, 1e-6, 0.0])


def test_read_cost_passes_each_batch_its_reads(tiny_curve) -> None:
    """The overhead also sees the batch's reads (how many each thread takes); past 16 reads per
    thread the table holds the value at 16."""
    seen = {}

    def over(q, n):
        seen.update({int(a): int(b) for a, b in zip(n, q)})
        return 1e-6 * n / q                                  # 1 us per read per thread
    rc = ReadCost(tiny_curve, np.array([4096]), in_flight=4, batch_overhead_s=over)
    plain = ReadCost(tiny_curve, np.array([4096]), in_flight=4)
    assert seen[3] == 3 and seen[4] == 4 and seen[10] == 4 and seen[64] == 4
    counts = np.array([[3], [4], [10], [64], [200]])
    assert (rc.time_s(counts) - plain.time_s(counts)).tolist() == pytest.approx([1e-6, 1e-6, 2.5e-6, 16e-6, 16e-6])


def test_region_time(tiny_curve) -> None:
    # 150 KiB in 64 KiB chunks: two full chunks and one 22 KiB chunk, 3 in flight
    t, n = region_time_s(tiny_curve, 150 * 1024, 65536, 4)
    bw64 = 1e9 + 2 / 3 * 1e9
    bw22 = float(tiny_curve.bytes_per_s(22 * 1024, 3))
    assert n == 3 and t == pytest.approx(2 * 65536 / bw64 + 22 * 1024 / bw22)
    assert region_time_s(tiny_curve, 0, 65536, 4) == (0.0, 0)


def test_flash_device_fifo_event_log() -> None:
    """Batches are served one after another in issue order: exact (issue, start, end) times."""
    env = simpy.Environment()
    flash = FlashDevice(log=True)
    done = []

    def reader(name: str, at: float, service: float):  # type: ignore[no-untyped-def]
        yield env.timeout(at)
        end = flash.submit(env.now, service, 1000, 1, name)
        yield env.timeout(end - env.now)
        done.append((name, env.now))

    env.process(reader("a", 0.0, 0.25))
    env.process(reader("b", 0.1, 0.5))      # queues behind a
    env.process(reader("c", 2.0, 0.125))    # device idle again
    env.run()
    log = [(b.tag, b.t_issue_s, b.t_start_s, b.t_end_s) for b in flash.log]
    assert log == [("a", 0.0, 0.0, 0.25), ("b", 0.1, 0.25, 0.75), ("c", 2.0, 2.0, 2.125)]
    assert done == [("a", 0.25), ("b", 0.75), ("c", 2.125)]
    assert flash.busy_s == pytest.approx(0.875)


def test_stretch_under_dma() -> None:
    # DMA of 100 B/s against 400 B/s DRAM leaves 3/4 of the bandwidth during [1, 3)
    flash = FlashDevice(dram_bytes_per_s=400.0)
    flash.submit(1.0, 2.0, 200, 1)
    seg = list(flash.segments_after(0.0))
    assert seg == [(1.0, 3.0, 0.75)]
    assert stretch(0.0, 0.5, seg) == pytest.approx(0.5)          # done before the transfer
    assert stretch(0.0, 2.0, seg) == pytest.approx(1.0 + 1.0 / 0.75)
    assert stretch(0.0, 3.0, seg) == pytest.approx(3.0 + 0.5)    # 1 + 1.5 during, 0.5 after
    assert stretch(1.0, 0.0, seg) == 0.0


def test_compute_phases_hand_computed() -> None:
    spec = load_model("llama-2-7b")
    prof = load_profile("apple-m1-max")
    cm = ComputeModel(spec, prof)
    bw, fl, op = 4.0e11, 1.04e13, 1e-5
    ffn = cm.ffn(np.array([1.0]), np.array([[1000.0, spec.d_ff]]), gathers=np.array([[True, False]]))
    nb = 1000 * spec.ffn_neuron_bytes
    assert ffn.mem_s[0, 0] == pytest.approx(nb / bw)
    assert ffn.flop_s[0, 0] == pytest.approx(2 * 1000 * 3 * 4096 / fl)
    assert ffn.gather_s[0, 0] == pytest.approx(nb / 2.0e11)           # sparse: gathered
    assert ffn.gather_s[0, 1] == 0.0                                  # dense: no gather
    assert ffn.ovh_s[0, 0] == pytest.approx((3 + 3 + 1) * op) and ffn.ovh_s[0, 1] == pytest.approx(6 * op)
    assert cm.ffn(np.array([1.0]), np.array([[1000.0]]), gathers=False).gather_s[0, 0] == 0.0
    # a gathering cache gathers every neuron too when it computes them all (real.runtime.backend does)
    full = cm.ffn(np.array([1.0]), np.array([[float(spec.d_ff)]]))
    assert full.gather_s[0, 0] == pytest.approx(spec.d_ff * spec.ffn_neuron_bytes / 2.0e11)
    att = cm.attention(np.array([1]), np.array([100]), np.array([100]), np.array([True]))
    kv = 100 * spec.kv_bytes_per_token / spec.n_layers
    assert att.mem_s[0] == pytest.approx((spec.attn_bytes_per_layer + spec.norm_bytes_per_layer + kv) / bw)
    assert att.flop_s[0] == pytest.approx((2 * spec.attn_params_per_layer + 4 * 4096 * 100) / fl)
    mg = cm.memory_management(np.array([10]))   # gather + scatter of 10 rows, at the gather rate
    assert mg.gather_s[0] == 0.0 and mg.mem_s[0] == pytest.approx(2 * 10 * spec.ffn_neuron_bytes / 2.0e11)
    ph = Phase(np.array([1.0]), np.array([2.0]), np.array([0.5]), np.array([0.1]))
    assert ph.total_s()[0] == pytest.approx(0.5 + 2.0 + 0.1)


def test_compute_row_transpose_and_padded_row_terms() -> None:
    """gemv_row_s per output row, the down rows' transposed copy and the gather of padded cache rows,
    hand-computed for SmolLM2 (d_model 576, d_ff 1536, 9 heads of 64, 3 KV heads, vocab 49152, fp32)."""
    spec = load_model("smollm2-135m").with_dtype("fp32")
    prof = load_profile("this-host")
    base = prof.model_copy(update={"compute": prof.compute.model_copy(
        update={"gemv_row_s": 0.0, "transpose_bytes_per_s": None, "sparse_ffn": None, "dense_gemv": None})})
    terms = prof.model_copy(update={"compute": prof.compute.model_copy(
        update={"gemv_row_s": 4e-8, "transpose_bytes_per_s": 1e10, "sparse_ffn": None, "dense_gemv": None})})
    a, b = ComputeModel(spec, base), ComputeModel(spec, terms, row_bytes=8192)
    n, c = np.array([1.0]), np.array([[384.0]])
    f0, f1 = a.ffn(n, c), b.ffn(n, c)
    g = prof.compute.gather_bytes_per_s
    assert f0.gather_s[0, 0] == pytest.approx(384 * spec.ffn_neuron_bytes / g)
    assert f1.gather_s[0, 0] == pytest.approx(384 * 8192 / g + 384 * 576 * spec.dtype_bytes / 1e10)
    assert f1.ovh_s[0, 0] - f0.ovh_s[0, 0] == pytest.approx((2 * 384 + 576) * 4e-8)   # gate + up rows, down rows
    att0 = a.attention(n, np.array([10]), np.array([10]), np.array([True]))
    att1 = b.attention(n, np.array([10]), np.array([10]), np.array([True]))
    assert att1.ovh_s[0] - att0.ovh_s[0] == pytest.approx((576 + 2 * 192 + 576) * 4e-8)
    assert b.head(1, n).ovh_s[0] - a.head(1, n).ovh_s[0] == pytest.approx(49152 * 4e-8)
    # a row move copies the bundle (6912 B), not the padded row: real.runtime.cache_matrices's deletion copies each
    # row's data part, where the gather copies whole padded rows; each move reads and writes it at the
    # gather's rate (scattered rows)
    assert spec.ffn_neuron_bytes == 3 * 576 * 4
    assert b.memory_management(np.array([3])).mem_s[0] == pytest.approx(2 * 3 * 6912 / g)


def test_memory_model_caps_and_shortfall_message() -> None:
    mem = MemoryModel({"non_ffn_weights": 1000, "predictor_weights": 0}, np.array([100, 200]), n_layers=2,
                      neuron_bytes=10)
    assert mem.fixed_bytes == 1000 and "predictor_weights" not in mem.parts
    assert mem.cap_neurons(1500, 0, 2).tolist() == [20, 15, 15]    # (1500-1000-kv) / (2 layers * 10 B); last repeated
    mem.check_fits(1200)
    with pytest.raises(FlashsimError, match=r"needs 1.17 KiB, 1 B \(1 bytes\) more"):
        mem.check_fits(1199)


def test_budget_timeline_files(tmp_path) -> None:
    j = tmp_path / "tl.json"
    j.write_text(json.dumps({"points": [{"t_s": 0, "available_bytes": "2GiB"}, {"t_s": 1.5, "available_bytes": 1000}]}))
    tl = load_budget_timeline(j)
    assert tl.at(0.0, 5) == 2 * 2**30 and tl.at(1.49, 5) == 2 * 2**30 and tl.at(2.0, 5) == 1000
    c = tmp_path / "tl.csv"
    c.write_text("t_s,available_bytes\n0.5,4GiB\n")
    tl = load_budget_timeline(c)
    assert tl.at(0.0, 7) == 7 and tl.at(0.6, 7) == 4 * 2**30 and tl.minimum(7) == 7
    bad = tmp_path / "bad.csv"
    bad.write_text("t_s,available_bytes\n1,zz\n")
    with pytest.raises(FlashsimError, match="line 2"):
        load_budget_timeline(bad)
    bad.write_text("time,bytes\n")
    with pytest.raises(FlashsimError, match="header"):
        load_budget_timeline(bad)
    j.write_text(json.dumps([[2, 10], [1, 10]]))
    with pytest.raises(FlashsimError, match="non-decreasing"):
        load_budget_timeline(j)
    with pytest.raises(FlashsimError, match="not found"):
        load_budget_timeline(tmp_path / "none.json")
    assert BudgetTimeline((0.0,), (3,)).to_list() == [[0.0, 3]]


def test_closed_form_curve_is_what_the_flash_model_uses() -> None:
    c = ClosedFormReadCurve(6.1e9, 2.08e-4, 1.445e5)
    rc = ReadCost(c, np.array([16384]), 32)
    assert rc.time_s(np.array([320])) == pytest.approx(320 * 16384 / c.bytes_per_s(16384, 32))


def test_rows_moved_is_the_expected_holes_below_the_new_end() -> None:
    from sim.step_plans import rows_moved

    # d (n - d) / n: nothing deleted, 4 of 10, all 10, 5 of 20, and an empty cache
    got = rows_moved(np.array([0, 4, 10, 5, 0]), np.array([10, 10, 10, 20, 0]))
    assert got.tolist() == pytest.approx([0.0, 2.4, 0.0, 3.75, 0.0])


def _with_table(prof, tables):
    from devices.schema import SparseFfnSpec, SparseFfnTable

    spec = None if tables is None else SparseFfnSpec(
        tables={k: SparseFfnTable(**v) for k, v in tables.items()}, source="a test table")
    return prof.model_copy(update={"compute": prof.compute.model_copy(update={"sparse_ffn": spec})})


def test_compute_sparse_ffn_from_the_measured_kernel_table() -> None:
    """Where the profile measured the run's dtype, a sparse FFN costs the table's kernels at the
    model's width (hand-computed for SmolLM2 fp32, d_model 576, on a table with a row at 576); dense
    entries, and dtypes without a table, keep the single rates."""
    spec = load_model("smollm2-135m").with_dtype("fp32")
    prof = load_profile("this-host")
    table = {"d_model": [576, 1152], "neurons": [100, 400],
             "gather_s": [[1e-4, 4e-4], [2e-4, 8e-4]], "input_gemv_s": [[2e-5, 5e-5], [4e-5, 1e-4]],
             "transpose_s": [[3e-5, 2.7e-4], [6e-5, 5e-4]], "down_gemv_s": [[1e-5, 4e-5], [2e-5, 8e-5]]}
    plain = ComputeModel(spec, _with_table(prof, None), row_bytes=8192)
    cm = ComputeModel(spec, _with_table(prof, {"fp32": table}), row_bytes=8192)
    n, c = np.array([1.0]), np.array([[100.0, 200.0, spec.d_ff, 0.0]])
    dense = np.array([[True, True, False, True]])      # the third: every neuron, contiguous (dense)
    f, f0 = cm.ffn(n, c, dense), plain.ffn(n, c, dense)
    row_scale = 8192 / 8192          # the table's rows: 3 x 576 x 4 B = 6912, 4 KiB-aligned: 8192
    assert f.gather_s[0, 0] == pytest.approx(1e-4 * row_scale + 3e-5)
    assert f.mem_s[0, 0] == pytest.approx(2 * 2e-5 + 1e-5)               # gate + up, down
    assert f.ovh_s[0, 0] == pytest.approx(3 * prof.compute.op_overhead_s)   # norm, activation, residual
    assert f.flop_s[0, 0] == pytest.approx(f0.flop_s[0, 0])
    # k = 200, halfway in log k: geometric means
    assert f.gather_s[0, 1] == pytest.approx(np.sqrt(1e-4 * 4e-4) + np.sqrt(3e-5 * 2.7e-4))
    assert f.mem_s[0, 1] == pytest.approx(2 * np.sqrt(2e-5 * 5e-5) + np.sqrt(1e-5 * 4e-5))
    for ph in ("flop_s", "mem_s", "gather_s", "ovh_s"):      # dense and empty: the single rates
        assert getattr(f, ph)[0, 2:] == pytest.approx(getattr(f0, ph)[0, 2:])
    # an unpadded cache row (6912 B) gathers its share of the table's 8192 B rows
    assert ComputeModel(spec, _with_table(prof, {"fp32": table})).ffn(n, c).gather_s[0, 0] == pytest.approx(
        1e-4 * 6912 / 8192 + 3e-5)
    # a model in a dtype the table lacks: the single rates
    fp16 = load_model("smollm2-135m").with_dtype("fp16")
    a = ComputeModel(fp16, _with_table(prof, {"fp32": table})).ffn(n, c)
    b = ComputeModel(fp16, _with_table(prof, None)).ffn(n, c)
    assert a.total_s() == pytest.approx(b.total_s())


def _with_dense(prof, tables):
    from devices.schema import DenseGemvSpec, DenseGemvTable

    spec = None if tables is None else DenseGemvSpec(
        tables={k: DenseGemvTable(**v) for k, v in tables.items()}, source="a test table")
    return prof.model_copy(update={"compute": prof.compute.model_copy(update={"dense_gemv": spec,
                                                                               "sparse_ffn": None})})


def test_compute_dense_gemvs_from_the_measured_table() -> None:
    """Where the profile measured the run's dtype, the attention's projections, the lm_head and a
    dense FFN's matrices cost the table's GEMVs at their shapes (hand-computed for SmolLM2 fp32:
    d_model 576, q 576, k/v 192, d_ff 1536, vocab 49152, tied; every shape on a grid point); the
    rest of each phase's bytes stream at the DRAM rate; the table's calls carry their own dispatch
    and rows, so only the other kernels pay op_overhead_s. Sparse FFNs keep their pricing."""
    spec = load_model("smollm2-135m").with_dtype("fp32")
    prof = load_profile("this-host")
    t = {(576, 192): 2e-5, (576, 576): 5e-5, (576, 1536): 1.2e-4, (576, 49152): 4e-3,
         (1536, 192): 5e-5, (1536, 576): 1.1e-4, (1536, 1536): 3e-4, (1536, 49152): 9e-3}
    ins, outs = [576, 1536], [192, 576, 1536, 49152]
    table = {"in_features": ins, "out_features": outs, "gemv_s": [[t[(i, o)] for o in outs] for i in ins]}
    plain = ComputeModel(spec, _with_dense(prof, None))
    cm = ComputeModel(spec, _with_dense(prof, {"fp32": table}))
    bw, op = prof.memory.bandwidth_bytes_per_s, prof.compute.op_overhead_s
    n = np.array([1.0])
    att, att0 = (m.attention(n, np.array([10]), np.array([10]), np.array([True])) for m in (cm, plain))
    weights = (2 * 576 * 576 + 2 * 192 * 576) * 4
    assert att.mem_s[0] == pytest.approx(2 * 5e-5 + 2 * 2e-5 + (att0.mem_s[0] * bw - weights) / bw)
    assert att.ovh_s[0] == pytest.approx(4 * op)   # 8 kernels less the 4 GEMVs
    assert att.flop_s[0] == pytest.approx(att0.flop_s[0])
    head, head0 = cm.head(1, n), plain.head(1, n)
    assert head.mem_s[0] == pytest.approx(4e-3 + (head0.mem_s[0] * bw - spec.embedding_bytes) / bw)
    assert head.ovh_s[0] == pytest.approx(2 * op)
    # a dense FFN: gate and up [1536, 576], down [576, 1536]; a sparse one keeps the single rates
    c = np.array([[float(spec.d_ff), 100.0, 0.0]])
    f, f0 = cm.ffn(n, c, np.array([[False, True, True]])), plain.ffn(n, c, np.array([[False, True, True]]))
    assert f.mem_s[0, 0] == pytest.approx(2 * 1.2e-4 + 1.1e-4) and f.ovh_s[0, 0] == pytest.approx(3 * op)
    for ph in ("flop_s", "mem_s", "gather_s", "ovh_s"):
        assert getattr(f, ph)[0, 1:] == pytest.approx(getattr(f0, ph)[0, 1:])
    # a contiguous FFN of 1000 rows (not gathered): halfway-ish in log rows, the table's interpolant
    g = cm.ffn(n, np.array([[1000.0]]), gathers=False)
    x = np.log(1000 / 576) / np.log(1536 / 576)
    inp = np.exp(np.log(5e-5) + x * np.log(1.2e-4 / 5e-5))
    down = np.exp(np.log(5e-5) + x * np.log(1.1e-4 / 5e-5))   # [576, c]: width c between 576 and 1536
    assert g.mem_s[0, 0] == pytest.approx(2 * inp + down)
    # a dtype the table lacks: the single rates
    fp16 = load_model("smollm2-135m").with_dtype("fp16")
    a = ComputeModel(fp16, _with_dense(prof, {"fp32": table}))
    b = ComputeModel(fp16, _with_dense(prof, None))
    assert a.attention(n, np.array([10]), np.array([10]), np.array([True])).total_s() == pytest.approx(
        b.attention(n, np.array([10]), np.array([10]), np.array([True])).total_s())
    assert a.head(1, n).total_s() == pytest.approx(b.head(1, n).total_s())
