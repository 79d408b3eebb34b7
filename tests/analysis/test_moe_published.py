"""Published MoE-from-flash results recomputed from component numbers (analysis/moe_published.py).

Every row: the measured figure may not exceed the device's peak-bound prediction (for hit rates, Belady
plus an oracle prefetch). Rows without a named model gap must land within their own stated band; rows
with one must err in the direction the missing term implies. Run with -s to see the table.
"""

from __future__ import annotations

import pytest

from analysis.moe_published import ROWS, recompute, table


def _print(rows: list[dict]) -> None:
    print()
    print(f"{'row':28s} {'metric':13s} {'measured':>13s} {'predicted':>9s} {'peak/ideal':>10s} {'error':>7s} "
          f"{'band':>5s}  status")
    for r in rows:
        lo, hi = r["measured"]
        meas = f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}"
        status = ("in band" if r["within_band"] else ("outside: model gap" if r["model_gap"] else "OUTSIDE"))
        status += "; circular" if r["circular"] else ""
        print(f"{r['key']:28s} {r['metric']:13s} {meas:>13s} {r['predicted']:9.3f} {r['peak_bound']:10.3f} "
              f"{r['error']:+7.0%} {r['band']:5.0%}  {status}")


def test_rows_are_sourced_and_banded() -> None:
    assert len({r.key for r in ROWS}) == len(ROWS) >= 6
    for r in ROWS:
        assert r.source and r.band_reason and r.band > 0
        assert r.measured[0] <= r.measured[1]
        assert not r.model_gap or r.gap_sign in (-1, 1)


def test_all_cached_mixtral_row() -> None:
    """The cheapest row in the default tier: every expert cached, a memory-bound decode."""
    r = recompute(next(x for x in ROWS if x.key == "rapid-mlx-mixtral"))
    _print([r])
    assert r["bound_holds"] and r["within_band"]


@pytest.mark.slow
def test_published_moe_table() -> None:
    rows = table()
    _print(rows)
    for r in rows:
        assert r["bound_holds"], f"{r['key']}: measured {r['measured']} above the bound {r['peak_bound']:.3f}"
        if r["model_gap"]:
            assert r["gap_sign_holds"], f"{r['key']}: error {r['error']:+.0%} against its model gap's sign"
        else:
            assert r["within_band"], f"{r['key']}: error {r['error']:+.0%} outside its band {r['band']:.0%}"
