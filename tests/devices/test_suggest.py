"""'Did you mean' for unknown names (devices/suggest.py), and an unknown profile key named as unknown."""

from __future__ import annotations

import pytest
import yaml

from devices import load_profile
from devices.errors import FlashsimError, unknown_name
from devices.schema import BUNDLED_DIR
from devices.suggest import close_matches, did_you_mean, hint, looks_like_path, sibling_hint


@pytest.mark.parametrize("name, valid, expected", [
    ("llama-3.2-3B", ["llama-3.2-1b", "llama-3.2-3b", "llama-3-8b"], ["llama-3.2-3b"]),   # case only
    ("windw", ["residency", "window", "workload", "naive"], ["window"]),
    ("Windw", ["window"], ["window"]),                         # case and a typo together
    ("cache", ["window", "naive"], []),                        # nothing close
    ("kk", ["k", "insert_copy"], ["k"]),
    ("eager", ["eager-pytorch", "llama.cpp"], ["eager-pytorch"]),          # a shortening
    ("l", ["llama.cpp", "llama-2-7b"], []),                                 # too short to be one
])
def test_close_matches(name, valid, expected) -> None:
    assert close_matches(name, valid) == expected


def test_hint_keeps_the_given_order_and_lists_every_name() -> None:
    assert hint("kk", ["k", "insert_copy"], "valid parameters") == \
        "did you mean 'k'? valid parameters: k, insert_copy"
    assert hint("zzz", ["b", "a"]) == "valid: b, a"
    assert did_you_mean("zzz", ["a"]) == ""


def test_unknown_name_suggests_and_lists() -> None:
    msg = str(unknown_name("model", "llama-3.2-3B", ["smollm2-135m", "llama-3.2-3b"]))
    assert msg == "unknown model 'llama-3.2-3B'; did you mean 'llama-3.2-3b'? known: llama-3.2-3b, smollm2-135m"


@pytest.mark.parametrize("text, is_path", [
    ("llama-3.2-3B", False), ("opt-6.7b", False), ("models/x", True), ("spec.yaml", True), ("m.GGUF", True),
])
def test_a_dot_in_a_name_is_not_a_path(text, is_path) -> None:
    assert looks_like_path(text) is is_path


def test_sibling_hint_prefers_a_folder_that_extends_the_name() -> None:
    assert sibling_hint("traces/data/smollm2-135m", ["smollm2-135m-builtin", "other"]) == \
        "did you mean 'traces/data/smollm2-135m-builtin'?"
    assert sibling_hint("x/zzz", ["abc"]) == ""


def _profile_with(tmp_path, edit) -> str:
    data = yaml.safe_load((BUNDLED_DIR / "jetson-orin-nano-8gb.yaml").read_text())
    data["name"] = "typo"
    edit(data)
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize("edit, expected", [
    # a misspelt required key: named as unknown, not reported as the required key missing
    (lambda d: d["memory"].__setitem__("capacity_byte", d["memory"].pop("capacity_bytes")),
     "field 'memory.capacity_byte': unknown key; did you mean 'capacity_bytes'?"),
    # a misspelt optional key (nothing else is wrong)
    (lambda d: d["memory"].__setitem__("sustained_bandwith_bytes_per_s",
                                       d["memory"].pop("sustained_bandwidth_bytes_per_s")),
     "field 'memory.sustained_bandwith_bytes_per_s': unknown key; did you mean 'sustained_bandwidth_bytes_per_s'"),
    # a misspelt section
    (lambda d: d.__setitem__("memmory", d.pop("memory")), "field 'memmory': unknown key; did you mean 'memory'?"),
])
def test_issue55_unknown_profile_key_is_named_with_a_suggestion(tmp_path, edit, expected) -> None:
    with pytest.raises(FlashsimError) as e:
        load_profile(_profile_with(tmp_path, edit))
    assert expected in str(e.value) and "required field is missing" not in str(e.value)
