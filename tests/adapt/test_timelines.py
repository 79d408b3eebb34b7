"""Memory timelines (adapt/timelines.py): hand-computed levels, seeded bursts, one-line errors."""

from __future__ import annotations

import pytest

from adapt.timelines import (
    HORIZON_SPAN,
    TimelineContext,
    parse_budgets,
    parse_timeline,
    parse_timelines,
)
from devices.errors import FlashsimError

CTX = TimelineContext(full_need_bytes=1000, horizon_s=2.0)


def build(text: str):
    return parse_timeline(text).build(CTX)


def test_constants_fraction_percent_and_bytes():
    assert build("0.8").to_list() == [[0.0, 800]]
    assert build("const:level=60%").to_list() == [[0.0, 600]]
    assert build("const:level=1KiB").to_list() == [[0.0, 1024]]
    assert [s.build(CTX).available_bytes for s in parse_budgets("0.8, 60%")] == [(800,), (600,)]


def test_step_at_a_share_of_the_horizon_or_in_seconds():
    assert build("step:t=25%,from=1.0,to=0.6").to_list() == [[0.0, 1000], [0.5, 600]]
    assert build("step:t=300ms,from=500B,to=0.5").to_list() == [[0.0, 500], [0.3, 500]]
    assert build("step:t=0s,from=1.0,to=0.5").to_list() == [[0.0, 500]]


def test_sawtooth_levels():
    tl = build("sawtooth:period=50%,low=0.6,high=1.0,levels=3")
    # period 1 s, levels 1000, 800, 600 at 0, 1/3, 2/3 s; repeated for HORIZON_SPAN horizons (8 s)
    assert len(tl.t_s) == 3 * int(HORIZON_SPAN * 2.0 / 1.0)
    assert tl.available_bytes[:4] == (1000, 800, 600, 1000)
    assert tl.t_s[:4] == pytest.approx((0.0, 1 / 3, 2 / 3, 1.0))
    assert tl.at(1.5, 0) == 800


def test_bursts_are_seeded_and_bounded():
    a = build("bursts:seed=3,rate=6,depth=0.2,dur=10%")
    assert a == build("bursts:seed=3,rate=6,depth=0.2,dur=10%")
    assert a != build("bursts:seed=4,rate=6,depth=0.2,dur=10%")
    assert a.available_bytes[0] == 1000 and min(a.available_bytes) >= 0
    assert all(v in {1000 - 200 * k for k in range(6)} or v == 0 for v in a.available_bytes)
    assert len(a.t_s) > 2 and max(a.t_s) < 2 * HORIZON_SPAN * 2.0
    assert build("bursts:seed=1,rate=0").to_list() == [[0.0, 1000]]


def test_file_timeline(tmp_path):
    f = tmp_path / "b.csv"
    f.write_text("t_s,available_bytes\n0,300MiB\n0.5,200MiB\n")
    assert build(f"file:{f}").to_list() == [[0.0, 300 * 2**20], [0.5, 200 * 2**20]]


def test_several_timelines():
    assert [s.kind for s in parse_timelines("0.8; step:t=1s,from=1,to=0.5;")] == ["const", "step"]


@pytest.mark.parametrize("text, needle", [
    ("wave:a=1", "unknown timeline kind 'wave'"),
    ("step:t=1s,from=1.0", "missing parameter 'to'"),
    ("step:t=1s,from=1.0,to=0.5,x=1", "unknown parameter 'x' for step"),
    ("step:t=1s,from=1.0,from=1,to=0.5", "given twice"),
    ("step:t=2,from=1.0,to=0.5", "needs a unit"),
    ("step:t=1s,from=lots,to=0.5", "from"),
    ("sawtooth:period=0s,low=0.5,high=1", "period must be > 0"),
    ("sawtooth:period=1s,low=0.9,high=0.5", "must not exceed high"),
    ("sawtooth:period=1s,low=0.5,high=1,levels=1", "levels: must be >= 2"),
    ("bursts:seed=-1", "seed"),
    ("bursts:seed=1,rate=x", "rate"),
    ("file:/no/such.csv", "not found"),
    ("step:t=1s,from,to=1", "not key=value"),
    ("", "empty timeline"),
    ("-0.5", "out of range"),
])
def test_bad_timelines_are_one_line(text, needle):
    with pytest.raises(FlashsimError, match=needle) as e:
        parse_timeline(text)
    assert "\n" not in str(e.value)


def test_bad_budgets():
    with pytest.raises(FlashsimError, match="empty item"):
        parse_budgets("0.8,,0.6")
    with pytest.raises(FlashsimError, match="lots"):
        parse_budgets("lots")
