"""Sweep specs: validation with key and line, expansion order and counts, stable ids, duplicates."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysis.sweep_spec import expand, load_spec
from devices.errors import FlashsimError

BASE = "devices: [apple-m1-max, jetson-orin-nano-8gb]\n"


def test_expand_counts_order_and_fields(write_spec, tiny_trace_dir: Path) -> None:
    path = write_spec(BASE + """seed: 7
dram_budgets: [null, 2GiB]
presets:
  - naive
  - {name: llm-in-a-flash, set: {window.k: [1, 2, 4]}}
set: {tokens: 16}
""")
    points = expand(load_spec(path))
    # 2 devices x 2 budgets x (1 + 3) preset grid points
    assert len(points) == 2 * 2 * 4
    assert [p.index for p in points] == list(range(16))
    first, second = points[0], points[1]
    assert (first.device, first.dram_budget_bytes, first.preset) == ("apple-m1-max", None, "naive")
    assert first.overrides == {"tokens": 16} and first.seed == 7
    assert (second.preset, second.overrides) == ("llm-in-a-flash", {"tokens": 16, "window.k": 1})
    assert points[4].dram_budget_bytes == 2 * 2**30
    assert first.trace == str(tiny_trace_dir.resolve()) and first.model is None
    assert len({p.point_id for p in points}) == 16


def test_point_ids_are_stable_and_content_addressed(write_spec, tiny_trace_dir: Path, tmp_path: Path) -> None:
    body = BASE + "presets: [naive, hybrid]\n"
    ids = [p.point_id for p in expand(load_spec(write_spec(body)))]
    assert ids == [p.point_id for p in expand(load_spec(write_spec(body, "again.yaml")))]
    moved = shutil.copytree(tiny_trace_dir, tmp_path / "elsewhere")  # same content, other place
    moved_ids = [p.point_id for p in expand(load_spec(write_spec(f"traces: [{moved}]\n" + body, "m.yaml")))]
    assert moved_ids == ids
    changed = [p.point_id for p in expand(load_spec(write_spec(body + "seed: 1\n", "seed.yaml")))]
    assert not set(changed) & set(ids)


def test_toml_spec_gives_the_same_points(write_spec, tiny_trace_dir: Path, tmp_path: Path) -> None:
    yaml_ids = [p.point_id for p in expand(load_spec(write_spec(
        BASE + "dram_budgets: [null, 4GiB]\npresets: [naive, {name: x, set: {window.k: [1, 2]}}]\n")))]
    toml = tmp_path / "s.toml"
    toml.write_text(f"""traces = ["{tiny_trace_dir}"]
devices = ["apple-m1-max", "jetson-orin-nano-8gb"]
dram_budgets = ["device", "4GiB"]
presets = ["naive"]
""")
    # TOML cannot mix strings and tables in one array: the preset with a grid goes in another form
    toml.write_text(toml.read_text().replace('presets = ["naive"]\n', "") +
                    'presets = ["naive", {name = "x", set = {"window.k" = [1, 2]}}]\n')
    assert [p.point_id for p in expand(load_spec(toml))] == yaml_ids


@pytest.mark.parametrize(("body", "expect"), [
    ("presets: [naive]\ncolour: red\n", "key 'colour' (line 4): unknown key"),
    ("presets: [naive, {name: x, sett: {}}]\n", "key 'presets.1.sett' (line 3): unknown key; did you mean 'set'? a preset entry"),
    ("presets: [naive]\ndram_budgets: [4 GiBB]\n", "key 'dram_budgets' (line 4): dram_budgets[0]: cannot parse"),
    ("presets: [naive]\nset: {k: []}\n", "key 'set' (line 4): k: give at least one value"),
    ("presets: [naive]\nset: {k: [1, 1]}\n", "k: a value is listed twice"),
    ("presets: [naive]\nset: {k: {a: 1}}\n", "k: expected a value"),
    ("presets: [3]\n", "presets[0]: expected a preset name or a mapping"),
    ("presets: []\n", "key 'presets' (line 3): List should have at least 1 item"),
    ("seed: -1\npresets: [naive]\n", "key 'seed' (line 3): Input should be greater than or equal to 0"),
    ("presets: [naive]\npresets: [x]\n", "key 'presets' (line 4): given twice (first at line 3)"),
    ("presets: [naive\n", "invalid YAML at line 4"),
    ("devices: [a]\n", "key 'presets': required key is missing"),
    ("presets: [{name: x, set: {k: [1]}}]\nset: {k: [2]}\n", "key 'presets.0.set.k' (line 3): also given"),
])
def test_bad_specs_name_key_and_line(write_spec, body: str, expect: str) -> None:
    with pytest.raises(FlashsimError) as e:
        load_spec(write_spec(BASE + body if "devices" not in body else body))
    msg = str(e.value)
    assert expect in msg and "\n" not in msg


def test_bad_toml_names_key_and_line(tmp_path: Path, tiny_trace_dir: Path) -> None:
    p = tmp_path / "s.toml"
    p.write_text(f'traces = ["{tiny_trace_dir}"]\ndevices = ["apple-m1-max"]\npresets = ["naive"]\n'
                 '[set]\nk = [1]\nwindow = {k = 2}\n')
    with pytest.raises(FlashsimError, match=r"key 'set' \(line 4\): window: expected a value"):
        load_spec(p)
    p.write_text('traces = ["x"]\ndevices = ["d"]\npresets = ["naive"]\nbogus = 1\n')
    with pytest.raises(FlashsimError, match=r"key 'bogus' \(line 4\): unknown key"):
        load_spec(p)


def test_duplicate_points_are_rejected(write_spec) -> None:
    with pytest.raises(FlashsimError, match="same point.*remove the duplicate"):
        expand(load_spec(write_spec(BASE + "dram_budgets: [4GiB, 4096MiB]\npresets: [naive]\n")))
    with pytest.raises(FlashsimError, match="same point"):
        expand(load_spec(write_spec(BASE + "presets: [naive, naive]\n")))


def test_missing_trace_and_wrong_suffix(write_spec, tmp_path: Path) -> None:
    with pytest.raises(FlashsimError, match=r"traces\[0\]: .*not a trace directory"):
        expand(load_spec(write_spec("traces: [nowhere]\n" + BASE + "presets: [naive]\n")))
    (tmp_path / "s.json").write_text("{}")
    with pytest.raises(FlashsimError, match="must end in .yaml, .yml or .toml"):
        load_spec(tmp_path / "s.json")
    with pytest.raises(FlashsimError, match="sweep file not found"):
        load_spec(tmp_path / "absent.yaml")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(grid=st.dictionaries(st.sampled_from(["a", "b.c", "d"]),
                            st.lists(st.integers(0, 50), min_size=1, max_size=4, unique=True),
                            max_size=3),
       n_budgets=st.integers(1, 3))
def test_grid_size_is_the_product_and_ids_unique(write_spec, grid: dict, n_budgets: int) -> None:
    budgets = ", ".join(f"{i + 1}GiB" for i in range(n_budgets))
    sets = ", ".join(f"{k}: {v}" for k, v in grid.items())
    points = expand(load_spec(write_spec(BASE + f"dram_budgets: [{budgets}]\npresets: [p, q]\n"
                                         f"set: {{{sets}}}\n")))
    expected = 2 * n_budgets * 2
    for v in grid.values():
        expected *= len(v)
    assert len(points) == expected == len({p.point_id for p in points})
    assert all(set(p.overrides) == set(grid) for p in points)
