"""BundleReader: exact bytes for every layout/alignment/destination, coalescing, errors, fallback."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from devices.errors import FlashsimError
from real.io.buffers import AlignedBuffer
from real.io.reader import BundleReader
from tests.real.conftest import tiny_spec


def _dest(k: int, width: int, aligned: bool = True) -> tuple[object, np.ndarray]:
    if aligned:
        buf = AlignedBuffer(k * width)
        return buf, buf.view2d(k, width)
    raw = np.zeros(k * width + 16, np.uint8)
    return raw, raw[8: 8 + k * width].reshape(k, width)  # deliberately off a page boundary


@pytest.mark.parametrize("alignment", ["padded", "packed"])
@pytest.mark.parametrize("layout", ["bundled", "unbundled"])
@pytest.mark.parametrize("direct", [None, False])
@pytest.mark.parametrize("in_flight", [1, 3])
def test_reads_equal_reference(make_store, alignment, layout, direct, in_flight):
    st = make_store(layout="both", alignment=alignment)
    rng = np.random.default_rng(5)
    ids = rng.choice(st.n_neurons, 90, replace=False)          # unsorted, some adjacent
    ref = st.read_bundles(1, ids)
    with BundleReader(st, layout=layout, in_flight=in_flight, max_chunk_bytes=3 * 4096, direct=direct) as r:
        for width, aligned in [(r.dest_row_bytes, True), (st.bundle_bytes, True), (st.bundle_bytes + 8, False)]:
            keep, dest = _dest(len(ids), width, aligned)
            stats = r.read(1, ids, dest)
            np.testing.assert_array_equal(dest[:, : st.bundle_bytes], ref)
            assert stats.direct_io == (direct is None)
            assert stats.bytes_useful == len(ids) * st.bundle_bytes
            assert stats.bytes_read == int(stats.chunk_bytes.sum()) >= stats.bytes_useful


def test_zero_copy_into_aligned_padded_rows(make_store):
    st = make_store(alignment="padded")
    ids = np.array([3, 4, 5, 9, 20, 21])
    with BundleReader(st, in_flight=2) as r:
        keep, dest = _dest(len(ids), r.dest_row_bytes)
        assert r.read(0, ids, dest).bytes_copied == 0           # landed in place
        keep2, dest2 = _dest(len(ids), st.bundle_bytes)
        assert r.read(0, ids, dest2).bytes_copied == len(ids) * st.bundle_bytes   # staged, then copied
        np.testing.assert_array_equal(dest[:, : st.bundle_bytes], dest2)


def test_unbundled_aligned_rows_read_in_place(make_store):
    st = make_store(spec=tiny_spec(d_model=1024, d_ff=64), layout="unbundled")   # rows of 4096 B
    ids = np.array([0, 1, 2, 40])
    with BundleReader(st, layout="unbundled", in_flight=2) as r:
        keep, dest = _dest(len(ids), r.dest_row_bytes)
        stats = r.read(1, ids, dest)
        assert stats.bytes_copied == 0 and stats.reads_issued == 3 * 2    # (0,1,2) and (40), per matrix
        np.testing.assert_array_equal(dest[:, : st.bundle_bytes], st.read_bundles(1, ids))


def test_coalescing_hand_computed(make_store):
    st = make_store()        # padded fp32: bundle 1536 B, stride 4096 B
    with BundleReader(st, max_chunk_bytes=2 * 4096, in_flight=1) as r:
        plan = r.plan(0, np.array([8, 0, 1, 2, 5, 7]))
        assert plan.offsets.tolist() == [0, 2 * 4096, 5 * 4096, 7 * 4096]      # runs [0,1] [2] [5] [7,8]
        assert plan.lengths.tolist() == [8192, 4096, 4096, 8192]
        assert plan.rows.tolist() == [1, 2, 3, 4, 5, 0]  # dest rows in disk order
        big = BundleReader(st, max_chunk_bytes=1 << 20, in_flight=1)
        assert big.plan(0, np.arange(256)).lengths.tolist() == [256 * 4096]    # one read
        big.close()
    ub = make_store("u", layout="unbundled")
    with BundleReader(ub, layout="unbundled", max_chunk_bytes=1 << 20) as r:
        plan = r.plan(1, np.array([4, 5, 9]))
        region = 256 * 4096
        base = ub.entry(1, "unbundled").offset_bytes
        assert plan.offsets.tolist() == [base + o for o in (4 * 4096, 9 * 4096, region + 4 * 4096,
                                                            region + 9 * 4096, 2 * region + 4 * 4096, 2 * region + 9 * 4096)]


def test_packed_reads_widen_to_4k(make_store):
    st = make_store(alignment="packed")            # bundle 1536 B, back to back
    with BundleReader(st, in_flight=1) as r:
        plan = r.plan(0, np.array([2]))            # bytes [3072, 4608) -> pages [0, 8192)
        assert (plan.offsets.tolist(), plan.lengths.tolist(), plan.delta.tolist()) == ([0], [8192], [3072])
    with BundleReader(st, in_flight=1, direct=False) as r:  # buffered: exact bytes
        plan = r.plan(0, np.array([2]))
        assert (plan.offsets.tolist(), plan.lengths.tolist()) == ([3072], [1536])


def test_hot_first_order_is_honoured(tmp_path, make_store):
    from traces.profiler import NeuronProfile, save_profile

    scores = np.random.default_rng(2).random((2, 256)).astype(np.float32)
    prof = save_profile(NeuronProfile(scores, {}, {"schema_version": 1, "tasks": []}), tmp_path / "p.npz")
    st = make_store(order="hot-first", profile=prof)
    top = np.argsort(-scores[0], kind="stable")[:10]
    with BundleReader(st, in_flight=2) as r:
        keep, dest = _dest(10, r.dest_row_bytes)
        stats = r.read(0, top, dest)
        assert stats.reads_issued == 1                     # the 10 hottest sit in slots 0..9
        np.testing.assert_array_equal(dest[:, : st.bundle_bytes], st.read_bundles(0, top))


def test_eio_and_short_reads_name_file_and_offset(make_store, monkeypatch):
    st = make_store()
    ids = np.array([1, 2, 100])
    with BundleReader(st, in_flight=2) as r:
        keep, dest = _dest(3, r.dest_row_bytes)

        def eio(fd, bufs, off):
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(os, "preadv", eio)
        with pytest.raises(FlashsimError, match=r"layer_000\.bundled\.bin: I/O error reading \d+ bytes at offset \d+ "
                                                r"\(Input/output error\)"):
            r.read(0, ids, dest)
        monkeypatch.setattr(os, "preadv", lambda fd, bufs, off: 512)
        with pytest.raises(FlashsimError, match=r"short read at offset \d+: 512 of \d+ bytes"):
            r.read(0, ids, dest)


def test_truncated_file_is_a_short_read(make_store):
    st = make_store()
    with open(st.file_path(1, "bundled"), "r+b") as f:
        f.truncate(100 * 4096)
    with BundleReader(st, in_flight=1) as r:
        keep, dest = _dest(1, r.dest_row_bytes)
        with pytest.raises(FlashsimError, match=r"layer_001\.bundled\.bin: short read at offset 819200: 0 of 4096"):
            r.read(1, np.array([200]), dest)


def test_falls_back_to_buffered_when_o_direct_is_refused(make_store, monkeypatch):
    st = make_store()
    real_open = os.open

    def no_direct(path, flags, *a):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *a)

    monkeypatch.setattr(os, "open", no_direct)
    ids = np.arange(0, 256, 3)
    with BundleReader(st, in_flight=2) as r:
        keep, dest = _dest(len(ids), st.bundle_bytes)
        stats = r.read(1, ids, dest)
        assert not stats.direct_io and "O_DIRECT refused" in r.describe()["fallback_reason"]
        np.testing.assert_array_equal(dest, st.read_bundles(1, ids))
    with BundleReader(st, direct=True) as r, pytest.raises(FlashsimError, match="cannot open for direct I/O"):
        r.read(0, ids, dest)


def test_bad_arguments(make_store):
    st = make_store()
    with BundleReader(st) as r:
        keep, dest = _dest(2, r.dest_row_bytes)
        with pytest.raises(FlashsimError, match="duplicate"):
            r.read(0, np.array([3, 3]), dest)
        with pytest.raises(FlashsimError, match=r"in \[0, 256\)"):
            r.read(0, np.array([3, 256]), dest)
        with pytest.raises(ValueError, match="dest must be"):
            r.read(0, np.array([1, 2, 3]), dest)
        stats = r.read(0, np.array([], np.int64), dest[:0])
        assert stats.reads_issued == 0 and stats.bytes_read == 0
    with pytest.raises(ValueError):
        BundleReader(st, in_flight=0)
