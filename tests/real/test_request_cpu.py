"""The CPU cost of one read request (real/bench/bench_request_cpu.py): the weighted fit of per-read CPU time
over the read grid, on synthetic timings with hand-computed answers, and its way into the profile."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devices.errors import FlashsimError
from devices.schema import FlashSpec
from real.bench.bench_request_cpu import request_cpu_fit, request_cpu_source

CHUNKS = [4096, 65536, 1 << 20]
DEPTHS = [1, 4]


def test_exact_line_is_recovered():
    # 20 us per request + 0.5 ns per byte: 22.048 us at 4 KiB, 52.768 us at 64 KiB, 544.288 us at 1 MiB
    cpu = [[20e-6 + 0.5e-9 * c] * 2 for c in CHUNKS]
    fit = request_cpu_fit(CHUNKS, DEPTHS, cpu, [[1000, 4000], [500, 2000], [50, 100]])
    assert fit["request_cpu_s"] == pytest.approx(20e-6, rel=1e-9)
    assert fit["cpu_s_per_byte"] == pytest.approx(0.5e-9, rel=1e-9)
    assert fit["reads"] == 7650
    assert [p["in_flight"] for p in fit["per_in_flight"]] == [1, 4]
    assert all(p["request_cpu_s"] == pytest.approx(20e-6, rel=1e-9) for p in fit["per_in_flight"])


def test_points_are_weighted_by_their_reads():
    # two chunk sizes, one depth: y = 10 us at 4 KiB (3 reads), 30 us at 8 KiB (1 read), 40 us at
    # 12 KiB (0 reads: left out). Two points: the line passes through both whatever the weights:
    # slope 20 us / 4096 B, intercept 10 - 20 = -10 us < 0 -> boundary: the better of a alone
    # (weighted mean 15 us, SSE 3*25 + 225 = 300) and b alone (b = sum w c y / sum w c^2 =
    # (3*4096*10 + 8192*30) / (3*4096^2 + 8192^2) = 10/4096 * 9/7 us/B, SSE = 3*(10 - 90/7)^2 +
    # (30 - 180/7)^2 = 3*(20/7)^2 + (30/7)^2 = 2100/49 ~ 42.9) -> b alone.
    fit = request_cpu_fit([4096, 8192, 12288], [1], [[10e-6], [30e-6], [40e-6]], [[3], [1], [0]])
    assert fit["request_cpu_s"] == 0.0
    assert fit["cpu_s_per_byte"] == pytest.approx(10e-6 / 4096 * 9 / 7, rel=1e-9)
    # three points with weights: weighted least squares by hand. c = 0, 1, 2 (scaled), y = 1, 3, 2,
    # w = 2, 1, 1: cm = 0.75, ym = 1.75, var = 2*0.5625 + 0.0625 + 1.5625 = 2.75,
    # cov = 2*(-0.75)(-0.75) + 0.25*1.25 + 1.25*0.25 = 1.75 -> b = 7/11, a = 1.75 - 0.75*7/11 = 14/11
    fit = request_cpu_fit([0, 1, 2], [1], [[1.0], [3.0], [2.0]], [[2], [1], [1]])
    assert fit["request_cpu_s"] == pytest.approx(14 / 11) and fit["cpu_s_per_byte"] == pytest.approx(7 / 11)


def test_a_falling_line_keeps_the_per_request_term_alone():
    # CPU per read falling with size (noise at large chunks): the per-byte term would be negative;
    # the fit keeps a = the reads-weighted mean
    fit = request_cpu_fit(CHUNKS, [1], [[30e-6], [28e-6], [20e-6]], [[100], [100], [0]])
    assert fit["cpu_s_per_byte"] == 0.0 and fit["request_cpu_s"] == pytest.approx(29e-6)


def test_depth_columns_are_fitted_separately():
    cpu = [[10e-6, 40e-6], [10e-6, 40e-6], [10e-6, 40e-6]]   # q=1 cheaper than q=4 (hand-off)
    fit = request_cpu_fit(CHUNKS, DEPTHS, cpu, [[100, 300]] * 3)
    per = {p["in_flight"]: p["request_cpu_s"] for p in fit["per_in_flight"]}
    assert per[1] == pytest.approx(10e-6) and per[4] == pytest.approx(40e-6)
    assert fit["request_cpu_s"] == pytest.approx(32.5e-6)       # (100*10 + 300*40) / 400
    # a column without reads is left out of per_in_flight
    fit = request_cpu_fit(CHUNKS, DEPTHS, cpu, [[100, 0]] * 3)
    assert [p["in_flight"] for p in fit["per_in_flight"]] == [1] and fit["request_cpu_s"] == pytest.approx(10e-6)


@pytest.mark.parametrize("cpu, reads, message", [
    ([[1e-6, 1e-6]] * 2, [[1, 1]] * 3, "expected"),
    ([[1e-6, float("nan")]] * 3, [[1, 1]] * 3, "finite"),
    ([[1e-6, -1e-6]] * 3, [[1, 1]] * 3, "finite"),
    ([[1e-6, 1e-6]] * 3, [[0, 0]] * 3, "no reads"),
])
def test_bad_grids_are_refused(cpu, reads, message):
    with pytest.raises(FlashsimError, match=message):
        request_cpu_fit(CHUNKS, DEPTHS, cpu, reads)


@settings(max_examples=60, deadline=None)
@given(a=st.floats(0, 1e-3), b=st.floats(0, 1e-8), noise=st.lists(st.floats(-0.3, 0.3), min_size=6, max_size=6),
       reads=st.lists(st.integers(1, 10_000), min_size=6, max_size=6))
def test_fit_is_the_best_nonnegative_line(a, b, noise, reads):
    c = np.asarray(CHUNKS, float)[:, None]
    w = np.asarray(reads, float).reshape(3, 2)
    clean = np.broadcast_to(a + b * c, (3, 2))
    # without noise the line itself comes back
    exact = request_cpu_fit(CHUNKS, DEPTHS, clean.tolist(), w.tolist())
    assert exact["request_cpu_s"] == pytest.approx(a, abs=1e-12 + 1e-6 * a)
    assert exact["cpu_s_per_byte"] == pytest.approx(b, abs=1e-18 + 1e-6 * b)
    # with noise: both terms >= 0, and no worse (weighted squared error) than the true line, which
    # is one of the lines the fit chooses from
    y = clean * (1 + np.asarray(noise).reshape(3, 2))
    fit = request_cpu_fit(CHUNKS, DEPTHS, y.tolist(), w.tolist())
    assert fit["request_cpu_s"] >= 0 and fit["cpu_s_per_byte"] >= 0

    def sse(a_: float, b_: float) -> float:
        return float((w * (y - a_ - b_ * c) ** 2).sum())

    assert sse(fit["request_cpu_s"], fit["cpu_s_per_byte"]) <= sse(a, b) * (1 + 1e-9) + 1e-30


def test_flash_section_writes_request_cpu_s_with_its_source():
    from real.bench.bench_flash import flash_section

    cpu = [[20e-6 + 0.5e-9 * c] * 2 for c in CHUNKS]
    fit = request_cpu_fit(CHUNKS, DEPTHS, cpu, [[1000, 4000], [500, 2000], [50, 100]])
    result = {"grid": {"chunk_bytes": CHUNKS, "in_flight": DEPTHS, "bytes_per_s": [[1e8, 2e8], [5e8, 8e8], [1e9, 2e9]]},
              "sequential": {"bytes_per_s": 2e9}, "latency_4k_qd1": {"mean_s": 60e-6}, "direct_io": True,
              "request_cpu": {**fit, "date": "2026-12-04", "host": "box: cpu", "tool": "flashsim 0.1.0"}}
    sec = flash_section(result, "measured by flashsim bench flash (2026-12-04)", shares_cpu=False)
    assert sec["request_cpu_s"] == 2e-05
    assert "request_cpu_s measured by flashsim bench flash (2026-12-04, box: cpu, flashsim 0.1.0)" in sec["source"]
    assert "q=1 20.0" in sec["source"] and "q=4 20.0" in sec["source"]
    assert FlashSpec.model_validate(sec).request_cpu_s == 2e-05
    # without the grid's CPU times (an fio import) nothing is written
    assert "request_cpu_s" not in flash_section({**result, "request_cpu": None}, "x", shares_cpu=False)
    assert "request_cpu_s measured" not in request_cpu_source.__doc__   # the docstring is no source line
