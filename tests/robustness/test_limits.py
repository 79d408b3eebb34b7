"""Issue 47, physical limits: every number of a device profile and a model spec has a stated range,
and a value outside it is refused by the CLI with the field, the value and the range."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from devices.errors import FlashsimError
from devices.limits import FINITE, limit_for
from devices.model_spec import ModelSpec
from devices.schema import BUNDLED_DIR, DeviceProfile, load_profile
from tests.robustness.conftest import assert_refused, cli, tiny_spec

BASE = yaml.safe_load((BUNDLED_DIR / "jetson-orin-nano-8gb.yaml").read_text())


def _numeric(tp: Any) -> bool:
    if tp in (int, float):
        return True
    return any(_numeric(a) for a in get_args(tp))


def _models(tp: Any) -> list[type[BaseModel]]:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    return [m for a in get_args(tp) for m in _models(a)]


def numeric_fields(model: type[BaseModel], seen: set | None = None) -> list[tuple[str, str]]:
    """(class name, field) of every numeric field reachable from `model`."""
    seen = set() if seen is None else seen
    out = []
    for name, f in model.model_fields.items():
        if _numeric(f.annotation):
            out.append((model.__name__, name))
        for sub in _models(f.annotation):
            if sub not in seen:
                seen.add(sub)
                out += numeric_fields(sub, seen)
    return out


def test_issue47_every_numeric_field_has_a_range():
    """A new profile or spec field gets a range by its unit suffix or by one line in FIELD_LIMITS."""
    fields = numeric_fields(DeviceProfile) + numeric_fields(ModelSpec)
    assert len(fields) > 40
    missing = [f"{c}.{n}" for c, n in fields if limit_for(c, n) is FINITE and n != "schema_version"]
    assert not missing, f"fields without a physical range in devices/limits.py: {missing}"


def test_issue47_bundled_profiles_and_specs_are_in_range():
    from devices import list_models, list_profiles, load_model

    for name in list_profiles():
        load_profile(name)
    for name in list_models():
        load_model(name)


def _profile(tmp_path: Path, path: str, value: Any) -> Path:
    d = copy.deepcopy(BASE)
    cur = d
    keys = path.split(".")
    for k in keys[:-1]:
        cur = cur[k]
    cur[keys[-1]] = value
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


PROFILE_CASES = [
    ("flash.sequential_read_bytes_per_s", math.inf), ("flash.sequential_read_bytes_per_s", 1e308),
    ("memory.bandwidth_bytes_per_s", math.inf), ("memory.bandwidth_bytes_per_s", 1e308),
    ("memory.capacity_bytes", 10**30), ("memory.capacity_bytes", 2**64), ("memory.reserved_bytes", 10**25),
    ("compute.gemv_flops_per_s.fp16", 1e308), ("compute.gemv_flops_per_s.fp16", math.inf),
    ("flash.read_latency_s", 1e308), ("compute.op_overhead_s", 1e308), ("compute.op_overhead_s", math.nan),
    ("flash.iops_max", 1e308), ("flash.max_in_flight", 10**12), ("compute.gather_bytes_per_s", 1e308),
    ("flash.sequential_read_bytes_per_s", -1.0), ("compute.op_overhead_s", -1e-6),
]


@pytest.mark.parametrize(("field", "value"), PROFILE_CASES)
@pytest.mark.parametrize("verb", ["devices", "replay"])
def test_issue47_profile_out_of_range_refused(tmp_path, capsys, trace_dir, field, value, verb):
    p = _profile(tmp_path, field, value)
    argv = (["devices", "show", p] if verb == "devices" else
            ["replay", "--trace", trace_dir, "--device", p, "--records", tmp_path / "r.parquet"])
    code, _, err = cli(capsys, *argv)
    assert_refused(code, err, tmp_path / "r.parquet", contains=field.split(".")[-1 if "gemv" not in field else -2])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from([f for f, _ in PROFILE_CASES]),
       value=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(10**30), 10**30)))
def test_issue47_profile_fields_fuzzed(field, value):
    """Any number in any field: a profile within every range, or a one-line FlashsimError."""
    d = copy.deepcopy(BASE)
    cur = d
    keys = field.split(".")
    for k in keys[:-1]:
        cur = cur[k]
    cur[keys[-1]] = value
    try:
        prof = DeviceProfile.model_validate(d)
    except ValidationError:
        return
    lim = limit_for({"flash": "FlashSpec", "memory": "MemorySpec", "compute": "ComputeSpec"}[keys[0]], keys[1])
    assert lim.violation(value) is None
    prof.summary()          # the numbers derived from it stay finite
    assert all(math.isfinite(v) for v in prof.summary().values() if isinstance(v, float))


SPEC_CASES = [("n_layers", 10**12), ("d_ff", 10**12), ("d_model", 10**9), ("vocab_size", 10**15),
              ("n_heads", 10**9), ("head_dim", 10**7)]


@pytest.mark.parametrize(("field", "value"), SPEC_CASES)
def test_issue47_spec_out_of_range_refused(tmp_path, capsys, field, value):
    hf = {"n_layers": "num_hidden_layers", "d_ff": "intermediate_size", "d_model": "hidden_size",
          "vocab_size": "vocab_size", "n_heads": "num_attention_heads", "head_dim": "head_dim"}[field]
    cfg = {"model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
           "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152, hf: value}
    if field == "n_heads":
        cfg["num_key_value_heads"] = value
    p = tmp_path / "spec.yaml"
    p.write_text(yaml.safe_dump({"name": "bad", "source": "test", "config": cfg}))
    code, _, err = cli(capsys, "models", "show", p)
    assert_refused(code, err, contains=field)
    out = tmp_path / "synth"
    code, _, err = cli(capsys, "trace", "synth", "--model", p, "--tokens", "4", "--active-fraction", "0.1",
                       "--overlap", "0.5", "--hot-skew", "0.3", "--out", out)
    assert_refused(code, err, out, contains=field)


@settings(max_examples=60, deadline=None)
@given(field=st.sampled_from(["n_layers", "d_model", "d_ff", "n_heads", "n_kv_heads", "head_dim", "vocab_size"]),
       value=st.integers(-(10**18), 10**18))
def test_issue47_spec_fields_fuzzed(field, value):
    kw = tiny_spec().model_dump()
    kw[field] = value
    try:
        spec = ModelSpec.model_validate(kw)
    except ValidationError:
        return
    assert limit_for("ModelSpec", field).violation(value) is None
    assert spec.total_weight_bytes < 2**63


def test_issue47_limit_message_names_field_value_and_range(tmp_path, capsys):
    p = _profile(tmp_path, "flash.sequential_read_bytes_per_s", 1e308)
    code, _, err = cli(capsys, "devices", "show", p)
    assert_refused(code, err)
    assert "sequential_read_bytes_per_s" in err and "1e+308" in err and "1e+12" in err and "TB/s" in err


def test_issue47_profile_by_absolute_and_relative_path(tmp_path, capsys, monkeypatch):
    p = tmp_path / "mine.yaml"
    p.write_text((BUNDLED_DIR / "jetson-orin-nano-8gb.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    assert load_profile(str(p)).name == load_profile("mine.yaml").name == "jetson-orin-nano-8gb"
    with pytest.raises(FlashsimError, match="unknown device"):
        load_profile("no-such-device")
