"""Neuron cache: insert at the end, delete by moving the last rows into the holes, exact bytes moved."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devices.errors import FlashsimError
from real.io.buffers import HUGE_PAGE_MIN_BYTES, AlignedBuffer
from real.runtime.cache_matrices import LayerCache, NeuronCache, layer_caches

ROW = 24          # bytes of one neuron's bundle in these tests
N = 40


def row_of(neuron: int, version: int) -> np.ndarray:
    return ((np.arange(ROW) + 31 * neuron + 7 * version) % 251).astype(np.uint8)


def test_hand_example():
    c = LayerCache(capacity=6, n_neurons=N, row_bytes=ROW)
    c.insert(np.array([10, 11, 12, 13, 14]), np.stack([row_of(n, 0) for n in (10, 11, 12, 13, 14)]))
    s = c.delete(np.array([11]))                     # hole at slot 1; the last row (14) moves in
    assert (s.rows_moved, s.bytes_moved) == (1, ROW)
    assert c.resident_ids().tolist() == [10, 14, 12, 13]
    s = c.delete(np.array([10, 13]))                 # slot 3 is in the tail: only 12 moves (to slot 0)
    assert (s.rows_moved, s.bytes_moved) == (1, ROW)
    assert c.resident_ids().tolist() == [12, 14]
    np.testing.assert_array_equal(c.occupied()[:, :ROW], [row_of(12, 0), row_of(14, 0)])
    assert c.slot_of[[10, 11, 12, 13, 14]].tolist() == [-1, -1, 0, -1, 1]
    s = c.delete(np.array([14]))                     # deleting the last row moves nothing
    assert (s.rows_moved, c.bytes_moved, c.rows_moved) == (0, 2 * ROW, 2)


def test_append_then_fill_in_place_and_errors():
    c = LayerCache(capacity=3, n_neurons=N, row_bytes=ROW, row_stride_bytes=4096)
    assert c.rows.ctypes.data % 4096 == 0 and c.rows.shape == (3, 4096)
    start, stop = c.append(np.array([5, 6]))
    c.rows[start:stop, :ROW] = [row_of(5, 0), row_of(6, 0)]
    assert (start, stop, c.bytes_inserted, c.resident_bytes) == (0, 2, 0, 2 * 4096)
    with pytest.raises(FlashsimError, match="cache full"):
        c.append(np.array([1, 2]))
    with pytest.raises(ValueError, match="already resident"):
        c.append(np.array([5]))
    with pytest.raises(ValueError, match="not resident"):
        c.delete(np.array([7]))
    assert c.delete(np.array([7, 5]), missing_ok=True).rows_moved == 1
    np.testing.assert_array_equal(c.rows[0, :ROW], row_of(6, 0))
    assert c.missing(np.array([6, 7, 5])).tolist() == [7, 5]


def test_typed_segment_views_share_memory():
    c = LayerCache(capacity=4, n_neurons=N, row_bytes=3 * 16, row_stride_bytes=64)
    vals = np.arange(4 * 12, dtype=np.float32).reshape(4, 12)     # 3 segments of 4 floats
    c.insert(np.array([0, 1, 2, 3]), vals.view(np.uint8))
    np.testing.assert_array_equal(c.segment(1, 16, np.float32), vals[:, 4:8])
    torch = pytest.importorskip("torch")
    t = c.torch_segment(2, 16, torch.float32)
    np.testing.assert_array_equal(t.numpy(), vals[:, 8:12])
    c.delete(np.array([0]))
    np.testing.assert_array_equal(c.segment(0, 16, np.float32)[0], vals[3, :4])


ops = st.lists(st.tuples(st.sampled_from(["insert", "delete"]), st.sets(st.integers(0, N - 1), max_size=12)),
               max_size=25)


@settings(max_examples=150, deadline=None)
@given(ops=ops, capacity=st.integers(0, 30), stride_pad=st.sampled_from([0, 8]))
def test_property_cache_holds_exactly_the_expected_rows(ops, capacity, stride_pad):
    c = LayerCache(capacity=capacity, n_neurons=N, row_bytes=ROW, row_stride_bytes=ROW + stride_pad)
    address = c.rows.ctypes.data
    model: dict[int, np.ndarray] = {}
    expected_moved = 0
    for version, (op, ids) in enumerate(ops, start=1):
        if op == "insert":
            new = [n for n in sorted(ids) if n not in model][: capacity - len(model)]
            c.insert(np.array(new, np.int64), np.stack([row_of(n, version) for n in new]) if new else
                     np.zeros((0, ROW), np.uint8))
            model.update({n: row_of(n, version) for n in new})
        else:
            gone = [n for n in sorted(ids) if n in model]
            before = {n: int(c.slot_of[n]) for n in model if n not in gone}
            stats = c.delete(np.array(gone, np.int64))
            moved = sum(1 for n, s in before.items() if c.slot_of[n] != s)
            assert stats.rows_moved == moved and stats.bytes_moved == moved * ROW
            expected_moved += moved * ROW
            for n in gone:
                del model[n]
        # exactly the expected set, dense in rows [0, n), each with its own bytes
        assert c.n == len(model) <= capacity
        assert sorted(c.resident_ids().tolist()) == sorted(model)
        assert np.all(c.slot_of[c.resident_ids()] == np.arange(c.n))
        assert np.count_nonzero(c.slot_of >= 0) == len(model)
        for n, row in model.items():
            np.testing.assert_array_equal(c.rows[c.slot_of[n], :ROW], row)
    assert c.bytes_moved == expected_moved
    assert c.rows.ctypes.data == address                      # never reallocated


def test_neuron_cache_totals():
    nc = NeuronCache([2, 3], n_neurons=N, row_bytes=ROW, row_stride_bytes=32)
    nc[0].insert(np.array([1, 2]), np.zeros((2, ROW), np.uint8))
    nc[1].insert(np.array([3]), np.zeros((1, ROW), np.uint8))
    nc[0].delete(np.array([1]))
    assert (len(nc), nc.resident_bytes, nc.allocated_bytes, nc.bytes_moved) == (2, 64, 160, ROW)


def test_layer_caches_share_one_huge_page_arena_without_overlap():
    stride = 8192
    caches = layer_caches([3, 0, 5], n_neurons=N, row_bytes=ROW, row_stride_bytes=stride)
    arena = caches[0]._buf
    assert all(c._buf is arena for c in caches)
    assert arena.huge and arena.address % HUGE_PAGE_MIN_BYTES == 0   # huge pages can back every row
    starts = [c.rows.ctypes.data - arena.address for c in caches if c.capacity]
    assert starts == [0, 3 * stride]                                  # back to back, stride-aligned
    caches[0].insert(np.array([1, 2, 3]), np.stack([row_of(n, 0) for n in (1, 2, 3)]))
    caches[2].insert(np.array([4]), row_of(4, 0)[None])
    assert np.array_equal(caches[0].rows[2, :ROW], row_of(3, 0))     # layer 2's rows did not overwrite layer 0's
    assert np.array_equal(caches[2].rows[0, :ROW], row_of(4, 0))


def test_aligned_buffer_huge_starts_on_a_huge_page_boundary():
    for nbytes in (4096, 3 << 20, (2 << 20) + 12288):
        buf = AlignedBuffer(nbytes, huge=True)
        assert buf.address % HUGE_PAGE_MIN_BYTES == 0 and buf.nbytes >= nbytes and len(buf.array) == buf.nbytes
    small = AlignedBuffer(12288)                    # under 2 MiB: 4 KiB pages, page aligned
    assert not small.huge and small.address % 4096 == 0 and small.nbytes == 12288


def test_layer_cache_rejects_memory_of_the_wrong_kind():
    with pytest.raises(ValueError, match="memory must be uint8"):
        LayerCache(4, N, ROW, 32, memory=np.zeros(64, np.uint8))


def test_rows_moved_matches_the_real_cache_on_average() -> None:
    """real.runtime.cache_matrices.LayerCache moves exactly the deleted rows below the new end; with uniformly placed
    deletions their mean count is the simulator's d (n - d) / n."""
    from sim.step_plans import rows_moved

    rng = np.random.default_rng(0)
    n, d, trials = 60, 25, 400
    moved = []
    for _ in range(trials):
        c = LayerCache(n, 200, 8)
        ids = rng.choice(200, n, replace=False)
        c.insert(ids, np.zeros((n, 8), np.uint8))
        moved.append(c.delete(rng.choice(ids, d, replace=False)).rows_moved)
    assert np.mean(moved) == pytest.approx(float(rows_moved(np.array([d]), np.array([n]))[0]), rel=0.05)


def test_keep_only_evicts_the_resident_neurons_outside_the_mask():
    c = LayerCache(capacity=6, n_neurons=N, row_bytes=ROW)
    c.insert(np.array([10, 11, 12, 13, 14]), np.stack([row_of(n, 0) for n in (10, 11, 12, 13, 14)]))
    keep = np.zeros(N, bool)
    keep[[10, 13, 14, 20]] = True                    # 20 is not resident: keeping it changes nothing
    s = c.keep_only(keep)                            # drop 11 (slot 1) and 12 (slot 2): 14 and 13 move in
    assert (s.rows_moved, s.bytes_moved) == (2, 2 * ROW)
    assert sorted(c.resident_ids().tolist()) == [10, 13, 14]
    for n in (10, 13, 14):
        np.testing.assert_array_equal(c.occupied()[c.slot_of[n], :ROW], row_of(n, 0))
    assert c.keep_only(keep).rows_moved == 0 and c.n == 3
    assert c.keep_only(np.zeros(N, bool)).rows_moved == 0 and c.n == 0      # dropping all moves nothing


def test_transpose_scratch_is_the_contiguous_copy_in_reused_memory(monkeypatch):
    torch = pytest.importorskip("torch")
    import real.runtime.cache_matrices as rc

    g = torch.Generator().manual_seed(0)
    rows = torch.randn(40, 3 * 24 + 16, generator=g)        # gathered rows, padded: strided segments
    ts = rc.TransposeScratch(torch)
    small = ts.transposed(rows[:, 48:72], 40, 24, 4)          # below the threshold: contiguous()
    assert ts.flat is None and small.is_contiguous() and torch.equal(small, rows[:, 48:72].T.contiguous())
    monkeypatch.setattr(rc, "TRANSPOSE_SCRATCH_MIN_BYTES", 64)     # every copy below is "large"
    a = ts.transposed(rows[:, 48:72], 40, 24, 4)
    assert a.is_contiguous() and a.shape == (24, 40) and torch.equal(a, rows[:, 48:72].T.contiguous())
    ptr = ts.flat.data_ptr()
    b = ts.transposed(rows[:30, 24:48], 30, 24, 4)            # smaller: the same memory
    assert ts.flat.data_ptr() == ptr and b.is_contiguous() and torch.equal(b, rows[:30, 24:48].T.contiguous())
    h = torch.randn(50, 30, generator=g).to(torch.float16)
    c = ts.transposed(h, 50, 30, 2)                           # larger, another dtype: grown
    assert c.dtype == torch.float16 and ts.flat.numel() == 1500 and torch.equal(c, h.T.contiguous())
