"""The sparse FFN's kernel table: exact at grid points, log-log between them, documented edges."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from devices.errors import FlashsimError
from devices.kernel_table import KernelTable
from devices.schema import DeviceProfile, load_profile

TABLE = KernelTable((512, 2048), (100, 400), ((1e-4, 9e-4), (4e-4, 1.6e-3)))


def test_exact_at_grid_points() -> None:
    for i, d in enumerate(TABLE.d_model):
        got = TABLE.seconds_at(d, np.array(TABLE.neurons, float))
        assert got == pytest.approx(TABLE.seconds[i], rel=1e-12)


def test_log_log_between_points() -> None:
    # halfway in log k between 100 and 400 (k = 200): the geometric mean of the two times
    assert TABLE.seconds_at(512, np.array([200.0]))[0] == pytest.approx(math.sqrt(1e-4 * 9e-4))
    # halfway in log d (d = 1024), then in log k
    t100, t400 = math.sqrt(1e-4 * 4e-4), math.sqrt(9e-4 * 1.6e-3)
    assert TABLE.seconds_at(1024, np.array([100.0, 200.0]))[0] == pytest.approx(t100)
    assert TABLE.seconds_at(1024, np.array([200.0]))[0] == pytest.approx(math.sqrt(t100 * t400))


def test_edges() -> None:
    # above the grid: the edge's rate per neuron and per width
    assert TABLE.seconds_at(512, np.array([800.0]))[0] == pytest.approx(9e-4 * 2)
    assert TABLE.seconds_at(4096, np.array([100.0]))[0] == pytest.approx(4e-4 * 2)
    assert TABLE.seconds_at(8192, np.array([1600.0]))[0] == pytest.approx(1.6e-3 * 4 * 4)
    # below it: the smallest measured call's time
    assert TABLE.seconds_at(512, np.array([10.0]))[0] == pytest.approx(1e-4)
    assert TABLE.seconds_at(64, np.array([100.0, 400.0])) == pytest.approx([1e-4, 9e-4])
    # nothing computed costs nothing, in any shape of array
    got = TABLE.seconds_at(512, np.array([[0.0, 100.0], [400.0, 0.0]]))
    assert got.shape == (2, 2) and got[0, 0] == 0.0 and got[1, 1] == 0.0


@given(st.floats(1, 20000), st.floats(1, 20000), st.floats(64, 16384))
def test_monotone_where_the_table_is(a: float, b: float, d: float) -> None:
    # this table grows with both width and neurons, so the interpolant must too
    lo, hi = sorted((a, b))
    t = TABLE.seconds_at(d, np.array([lo, hi]))
    assert t[0] <= t[1] * (1 + 1e-12)


@pytest.mark.parametrize("d, k, t, match", [
    ((512, 512), (100, 400), ((1, 1), (1, 1)), "d_model must be"),
    ((512,), (400, 100), ((1, 1),), "neurons must be"),
    ((512,), (100, 400), ((1, 1, 1),), "must have 1 rows"),
    ((512,), (100, 400), ((1, 0),), "finite and > 0"),
])
def test_bad_tables(d, k, t, match) -> None:
    with pytest.raises(ValueError, match=match):
        KernelTable(d, k, t)


def test_a_bad_table_in_a_profile_is_a_one_line_error(tmp_path) -> None:
    data = load_profile("this-host").model_dump(mode="json", exclude_none=True)
    data["name"] = "bad-table"
    data["compute"]["sparse_ffn"]["tables"]["fp32"]["transpose_s"][0] = [1e-4]
    with pytest.raises(Exception, match="transpose_s"):
        DeviceProfile.model_validate(data)
    import yaml

    path = tmp_path / "bad-table.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(FlashsimError) as e:
        load_profile(path)
    assert "transpose_s" in str(e.value) and "\n" not in str(e.value)


@given(st.floats(1, 1e5), st.floats(1, 1e5))
def test_transposed_answers_alike(d: float, k: float) -> None:
    # bilinear in logs inside the grid, per-axis rules outside it: the order of the two steps is moot
    a = TABLE.seconds_at(d, np.array([k]))[0]
    b = TABLE.transposed().seconds_at(k, np.array([d]))[0]
    assert a == pytest.approx(b, rel=1e-9)


def test_a_bad_dense_gemv_table_names_its_axis(tmp_path) -> None:
    data = load_profile("this-host").model_dump(mode="json", exclude_none=True)
    data["compute"]["dense_gemv"]["tables"]["fp16"]["out_features"] = [512, 128, 2048, 8192, 16384]
    with pytest.raises(Exception, match="gemv_s: out_features must be"):
        DeviceProfile.model_validate(data)
