"""Flash read curves: exact at table points, monotone between them, documented clamping."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devices.curves import ClosedFormReadCurve, TableReadCurve, read_time_s
from devices.schema import load_profile


def test_exact_at_table_points(tiny_curve: TableReadCurve) -> None:
    assert tiny_curve.bytes_per_s(4096, 1) == 1e8
    assert tiny_curve.bytes_per_s(4096, 4) == 4e8
    assert tiny_curve.bytes_per_s(65536, 1) == 1e9
    assert tiny_curve.bytes_per_s(65536, 4) == 2e9


def test_interpolates_time_linear_in_bytes_and_throughput_linear_in_flight(tiny_curve: TableReadCurve) -> None:
    # a 4 KiB read at 1e8 B/s takes 40.96 us, a 64 KiB read at 1e9 B/s 65.536 us; 16 KiB is a fifth
    # of the way in bytes ((16384 - 4096) / (65536 - 4096)): 40.96 + 0.2 * 24.576 = 45.8752 us
    assert tiny_curve.bytes_per_s(16384, 1) == pytest.approx(16384 / 45.8752e-6)
    # 2 in flight at 4 KiB: one third of the way from 1 to 4
    assert tiny_curve.bytes_per_s(4096, 2) == pytest.approx(1e8 + (4e8 - 1e8) / 3)


def test_clamping_outside_the_table(tiny_curve: TableReadCurve) -> None:
    # smaller than the smallest chunk: same time per read as a 4 KiB read
    assert tiny_curve.bytes_per_s(1024, 1) == pytest.approx(1e8 / 4)
    # larger than the largest chunk: saturated
    assert tiny_curve.bytes_per_s(1 << 20, 4) == 2e9
    # more in flight than measured: no further gain
    assert tiny_curve.bytes_per_s(65536, 64) == 2e9


@given(st.floats(12, 20), st.floats(12, 20), st.floats(1, 8))
def test_monotone_where_the_table_is(a: float, b: float, q: float) -> None:
    # this table increases with chunk size at every depth, so the interpolant must too
    curve = TableReadCurve((4096, 65536, 1 << 20), (1, 8), ((1e8, 3e8), (1e9, 2e9), (2e9, 2.5e9)))
    lo, hi = sorted((2.0**a, 2.0**b))
    assert curve.bytes_per_s(lo, q) <= curve.bytes_per_s(hi, q) + 1e-6


@functools.cache
def _this_host_flash():
    return load_profile("this-host").flash   # loaded once: a profile load is not what is tested


@settings(deadline=None)   # the first example loads the profile
@given(st.integers(1, 64), st.integers(1, 64))
def test_this_host_4k_monotone_in_depth_up_to_8(q1: int, q2: int) -> None:
    f = _this_host_flash()
    lo, hi = sorted((min(q1, 8), min(q2, 8)))
    assert f.bytes_per_s(4096, lo) <= f.bytes_per_s(4096, hi)


def test_count_bound_reads_cost_between_their_neighbours() -> None:
    # reads bound by their count (the same time per read at 8 and 16 KiB, as on this host at 64 in
    # flight): a 12 KiB read costs that same time, not less (log-chunk interpolation of the
    # throughput gave it 5% less than either neighbour)
    curve = TableReadCurve((8192, 16384), (64,), ((8192 / 19e-6,), (16384 / 19e-6,)))
    assert 12288 / curve.bytes_per_s(12288, 64) == pytest.approx(19e-6)


def test_vectorised_matches_scalar(tiny_curve: TableReadCurve) -> None:
    chunks = np.array([1024, 4096, 10000, 65536, 1 << 22])
    many = tiny_curve.bytes_per_s_many(chunks, 3)
    assert many == pytest.approx([tiny_curve.bytes_per_s(c, 3) for c in chunks])


def test_closed_form_regimes() -> None:
    c = ClosedFormReadCurve(sequential_bytes_per_s=1e9, latency_s=1e-4, iops_max=1e5)
    # one 4 KiB read in flight: latency-bound
    assert c.bytes_per_s(4096, 1) == pytest.approx(4096 / (1e-4 + 4096 / 1e9))
    # many in flight at 4 KiB: IOPS-bound
    assert c.bytes_per_s(4096, 1000) == pytest.approx(1e5 * 4096)
    # large chunks: sequential bandwidth
    assert c.bytes_per_s(1 << 24, 64) == pytest.approx(1e9)


def test_read_time_uses_only_the_reads_that_exist(tiny_curve: TableReadCurve) -> None:
    # 1 read with 4 slots runs at depth 1: 4096 B / 1e8 B/s
    assert read_time_s(tiny_curve, 4096, 1, 4) == pytest.approx(4096 / 1e8)
    assert read_time_s(tiny_curve, 4096, 8, 4) == pytest.approx(8 * 4096 / 4e8)
    assert read_time_s(tiny_curve, 4096, 0, 4) == 0.0


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(chunk_bytes=(8192, 4096), in_flight=(1,), table_bytes_per_s=((1.0,), (2.0,))), "chunk_bytes"),
        (dict(chunk_bytes=(4096,), in_flight=(2, 1), table_bytes_per_s=((1.0, 2.0),)), "in_flight"),
        (dict(chunk_bytes=(4096,), in_flight=(1,), table_bytes_per_s=((-1.0,),)), "bytes_per_s"),
        (dict(chunk_bytes=(4096,), in_flight=(1, 2), table_bytes_per_s=((1.0,),)), "rows"),
    ],
)
def test_invalid_tables_rejected(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        TableReadCurve(**kwargs)


def test_a_table_curve_built_from_lists_is_the_tuple_curve() -> None:
    """Lists (as YAML or code give them) become tuples: the curve equals and hashes like the one built
    from tuples, so the simulator's read-cost table is cached per curve (sim/components/flash.py)."""
    from sim.components.flash import ReadCost

    listed = TableReadCurve([4096, 65536], [1, 4], [[1e8, 4e8], [1e9, 2e9]])
    tupled = TableReadCurve((4096, 65536), (1, 4), ((1e8, 4e8), (1e9, 2e9)))
    assert listed == tupled and hash(listed) == hash(tupled)
    sizes = np.array([4096.0, 32768.0])
    np.testing.assert_array_equal(ReadCost(listed, sizes, 4).inv, ReadCost(tupled, sizes, 4).inv)
