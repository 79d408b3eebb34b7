"""GSI file format (adapt/importance.py) and the importance vector, hand-computed."""

from __future__ import annotations

import json

import numpy as np
import pytest

from adapt.importance import (
    block_names,
    importance_vector,
    read_gsi_file,
    removal_order,
    validate_gsi,
    write_gsi_file,
)
from devices.errors import FlashsimError
from tests.adapt.conftest import tiny_doc


def test_round_trip_is_atomic_and_byte_identical(tmp_path, doc):
    path = tmp_path / "g.json"
    write_gsi_file(path, doc)
    first = path.read_bytes()
    assert read_gsi_file(path) == doc
    write_gsi_file(path, tiny_doc())
    assert path.read_bytes() == first
    assert [p.name for p in tmp_path.iterdir()] == ["g.json"]


def test_real_gsi_reexports_the_same_functions():
    pytest.importorskip("torch")
    import adapt.importance as imp
    import real.studies.gsi as rg

    assert rg.read_gsi_file is imp.read_gsi_file and rg.write_gsi_file is imp.write_gsi_file
    assert rg.SCHEMA_VERSION == imp.SCHEMA_VERSION == 1


def test_removal_order_gsi_then_one_shot(doc):
    # GSI: mha:1, ffn:0; the rest by one-shot ppl: mha:0 (12) < ffn:1 (900)
    names = block_names(2)  # mha:0 ffn:0 mha:1 ffn:1
    assert removal_order(doc, names).tolist() == [2, 1, 0, 3]
    imp = importance_vector(doc, names)
    assert imp.dtype == np.float64
    assert imp.tolist() == [3 / 4, 2 / 4, 1 / 4, 4 / 4]


def test_importance_with_no_gsi_steps_is_the_one_shot_order():
    doc = tiny_doc(steps=0)
    assert removal_order(doc, block_names(2)).tolist() == [2, 0, 1, 3]


def test_null_one_shot_ranks_last_and_ties_go_by_block_order():
    doc = tiny_doc(steps=0)
    for r in doc["one_shot"]:
        r["ppl_alone"] = {"mha:1": None, "mha:0": 12.0, "ffn:0": 12.0, "ffn:1": 13.0}[r["block"]]
    validate_gsi(doc)
    assert removal_order(doc, block_names(2)).tolist() == [0, 1, 3, 2]


def test_wrong_model_is_one_line(doc):
    with pytest.raises(FlashsimError, match="2 layers .* but the model has 6 blocks"):
        importance_vector(doc, block_names(3))


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d.update(schema_version=2), "schema_version must be 1"),
    (lambda d: d["gsi"][0].pop("ppl_after"), "ppl_after"),
    (lambda d: d["gsi"][0].update(block="mha:7"), r"gsi\[0\].block 'mha:7'"),
    (lambda d: d["gsi"].append(dict(d["gsi"][0])), "lists a block twice"),
    (lambda d: d["one_shot"].pop(), "each of the 4 blocks once"),
    (lambda d: d["one_shot"][1].update(ppl_alone="x"), r"one_shot\[1\].ppl_alone"),
    (lambda d: d["one_shot"][1].update(ppl_alone=-1.0), r"one_shot\[1\].ppl_alone"),
    (lambda d: d.update(dense_ppl=None), "dense_ppl"),
    (lambda d: d.update(model={"name": "x"}), "model"),
])
def test_bad_documents_name_the_field(tmp_path, doc, mutate, needle):
    mutate(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(FlashsimError, match=needle) as e:
        read_gsi_file(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)


def test_unreadable_files(tmp_path):
    with pytest.raises(FlashsimError, match="no such GSI file"):
        read_gsi_file(tmp_path / "missing.json")
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(FlashsimError, match="not a GSI JSON file"):
        read_gsi_file(tmp_path / "x.json")
