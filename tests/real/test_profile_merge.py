"""real/validation/profile_merge.py and `flashsim bench merge`: several calibrations of one host -> their mean
(rates harmonic, other floats arithmetic, integers and axes equal), hand-computed."""

from __future__ import annotations

import json

import pytest
import yaml

from devices.errors import FlashsimError
from devices.schema import load_profile
from flashsim.main import main
from real.validation.profile_merge import merge_profile_data, merge_profiles


def _doc(**changes):
    """this-host's mapping with `changes` ({"a.b.c": value}) applied."""
    d = load_profile("this-host").model_dump(mode="json", exclude_none=True)
    for path, value in changes.items():
        *head, last = path.split(".")
        node = d
        for k in head:
            node = node[k]
        node[last] = value
    return d


def _write(tmp_path, name, doc):
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_rates_harmonic_times_arithmetic_by_hand():
    a = _doc(**{"compute.gemv_flops_per_s.fp32": 10e9, "compute.op_overhead_s": 1e-6, "flash.plan_s_per_batch": 2e-4})
    b = _doc(**{"compute.gemv_flops_per_s.fp32": 30e9, "compute.op_overhead_s": 3e-6, "flash.plan_s_per_batch": 4e-4})
    a["flash"]["read_table"]["bytes_per_s"][0][0] = 100e6
    b["flash"]["read_table"]["bytes_per_s"][0][0] = 300e6
    m = merge_profile_data([a, b], "merged", ["a.yaml", "b.yaml"])
    assert m["compute"]["gemv_flops_per_s"]["fp32"] == 15e9        # 2 / (1/10 + 1/30) GFLOP/s: mean time per FLOP
    assert m["flash"]["read_table"]["bytes_per_s"][0][0] == 150e6   # a rate inside a table too
    assert m["compute"]["op_overhead_s"] == 2e-6                   # seconds: arithmetic
    assert m["flash"]["plan_s_per_batch"] == 3e-4
    assert m["flash"]["read_table"]["chunk_bytes"] == a["flash"]["read_table"]["chunk_bytes"]   # axes kept
    assert m["compute"]["threads"] == a["compute"]["threads"]
    assert m["name"] == "merged"
    assert "mean of 2 calibrations" in m["flash"]["source"] and "mean of 2 calibrations" in m["compute"]["source"]
    assert m["source"]["references"][0] == "flashsim bench merge of 2 profiles: a.yaml, b.yaml"
    assert "harmonic" in m["source"]["notes"]


def test_three_profiles_and_four_significant_digits():
    docs = [_doc(**{"compute.op_overhead_s": v}) for v in (1e-6, 2e-6, 2e-6)]
    m = merge_profile_data(docs, "m", ["a", "b", "c"])
    assert m["compute"]["op_overhead_s"] == 1.667e-06          # 5/3 us, kept to 4 significant digits


def test_identical_profiles_merge_to_themselves():
    d = _doc()
    m = merge_profile_data([d, _doc(), _doc()], "this-host", ["a", "b", "c"])
    assert m["flash"]["read_table"] == d["flash"]["read_table"]
    assert m["compute"]["gemv_flops_per_s"] == d["compute"]["gemv_flops_per_s"]
    assert m["memory"]["bandwidth_bytes_per_s"] == d["memory"]["bandwidth_bytes_per_s"]


@pytest.mark.parametrize("change, where", [
    ({"compute.threads": 2}, "compute.threads: the integers differ"),
    ({"flash.max_in_flight": 32}, "flash.max_in_flight"),
])
def test_different_settings_are_refused(change, where):
    with pytest.raises(FlashsimError, match=where):
        merge_profile_data([_doc(), _doc(**change)], "m", ["a", "b"])


def test_different_shapes_are_refused():
    b = _doc()
    del b["flash"]["plan_s_per_batch"]
    with pytest.raises(FlashsimError, match=r"flash: different keys \(\['plan_s_per_batch'\]\)"):
        merge_profile_data([_doc(), b], "m", ["a", "b"])
    c = _doc()
    c["flash"]["read_table"]["chunk_bytes"] = c["flash"]["read_table"]["chunk_bytes"][:-1]
    with pytest.raises(FlashsimError, match="flash.read_table.chunk_bytes: lists of different lengths"):
        merge_profile_data([_doc(), c], "m", ["a", "b"])
    with pytest.raises(FlashsimError, match="two or more"):
        merge_profile_data([_doc()], "m", ["a"])


def test_merge_profiles_validates(tmp_path):
    a = _write(tmp_path, "a", _doc(**{"compute.gemv_flops_per_s.fp32": 10e9}))
    b = _write(tmp_path, "b", _doc(**{"compute.gemv_flops_per_s.fp32": 30e9}))
    p = merge_profiles([a, b], "both")
    assert p.name == "both" and p.compute.flops_per_s("fp32") == 15e9


def test_cli_bench_merge(tmp_path, capsys):
    a = _write(tmp_path, "a", _doc(**{"compute.op_overhead_s": 1e-6}))
    b = _write(tmp_path, "b", _doc(**{"compute.op_overhead_s": 3e-6}))
    out = tmp_path / "out" / "m.yaml"
    assert main(["bench", "merge", str(a), str(b), "--name", "m", "--out", str(out), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["profile"] == {"name": "m", "path": str(out)}
    assert load_profile(out).compute.op_overhead_s == 2e-6
    assert [p.name for p in out.parent.iterdir()] == ["m.yaml"]      # no temporary file left


def test_cli_bench_merge_bad_input_exits_2(tmp_path, capsys):
    a = _write(tmp_path, "a", _doc())
    b = _write(tmp_path, "b", _doc(**{"compute.threads": 2}))
    out = tmp_path / "m.yaml"
    assert main(["bench", "merge", str(a), str(b), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "compute.threads" in err and not out.exists()
    assert main(["bench", "merge", str(a), "--out", str(out)]) == 2
    assert "two or more" in capsys.readouterr().err
