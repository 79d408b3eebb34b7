"""sim.blocks: block names, the dropped-set syntax, and per-block bytes (hand-computed)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devices.errors import FlashsimError
from devices.model_spec import load_model
from sim.blocks import KINDS, BlockMemory, block_names, format_blocks, parse_blocks
from tests.sim.helpers import tiny_spec


def test_names_order():
    assert KINDS == ("mha", "ffn")
    assert block_names(2) == ("mha:0", "ffn:0", "mha:1", "ffn:1")


def test_parse_and_format():
    d = parse_blocks("mha:3,ffn:5", 6)
    assert d.dtype == bool and d.shape == (12,)
    assert np.flatnonzero(d).tolist() == [6, 11]
    assert format_blocks(d) == "mha:3,ffn:5"
    assert not parse_blocks("", 4).any() and not parse_blocks("  ", 4).any()
    assert format_blocks(np.zeros(8, bool)) == ""
    # spaces tolerated; output in block-index order
    assert format_blocks(parse_blocks(" ffn:1 , mha:0", 2)) == "mha:0,ffn:1"


@pytest.mark.parametrize("text, needle", [
    ("ffn:30", "layer 30 is out of range; the model has 30 layers (0..29)"),
    ("attn:1", "bad block 'attn:1'"),
    ("mha:1,", "bad block ''"),
    ("mha:-1", "bad block 'mha:-1'"),
    ("ffn", "bad block 'ffn'"),
    ("mha:2,mha:2", "listed twice"),
])
def test_parse_rejects_with_one_line(text, needle):
    with pytest.raises(FlashsimError) as e:
        parse_blocks(text, 30, where="prune.blocks")
    msg = str(e.value)
    assert needle in msg and msg.startswith("prune.blocks: ") and "\n" not in msg


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40).flatmap(lambda n: st.lists(st.booleans(), min_size=2 * n, max_size=2 * n)))
def test_round_trip(bits):
    d = np.array(bits, bool)
    L = d.size // 2
    assert np.array_equal(parse_blocks(format_blocks(d), L), d)


def test_smollm2_hand_computed():
    spec = load_model("smollm2-135m")          # d 576, d_ff 1536, 9 heads, 3 kv heads, head_dim 64, tied
    bm = BlockMemory.from_spec(spec)
    attn = 2 * (576 * (576 + 2 * 192) + 576 * 576)    # q,k,v,o at fp16 = 1,769,472
    ffn = 2 * 3 * 576 * 1536                           # gate, up, down = 5,308,416
    norm = 2 * 576                                     # one RMSNorm weight vector
    assert bm.weight_bytes[0] == attn + norm == 1_770_624
    assert bm.weight_bytes[1] == ffn + norm == 5_309_568
    assert bm.kv_bytes_per_token[0] == 2 * 192 * 2 == 768 and bm.kv_bytes_per_token[1] == 0
    assert bm.always_bytes == 49152 * 576 * 2 + norm   # tied embedding + final norm
    nothing = np.zeros(60, bool)
    assert bm.weights_bytes(nothing) == spec.non_ffn_bytes + spec.ffn_bytes_total == spec.total_weight_bytes
    assert bm.kv_bytes(nothing, 10) == 10 * spec.kv_bytes_per_token == 230_400
    assert bm.full_need_bytes(10) == spec.total_weight_bytes + 230_400
    d = parse_blocks("mha:3,ffn:5", 30)
    assert bm.weights_bytes(d) == spec.total_weight_bytes - 1_770_624 - 5_309_568
    assert bm.kv_bytes(d, 100) == 100 * 29 * 768
    assert bm.footprint_bytes(d, 100) == bm.weights_bytes(d) + bm.kv_bytes(d, 100)


def test_llama2_7b_hand_computed():
    spec = load_model("llama-2-7b")            # MHA (32 kv heads), untied lm_head
    bm = BlockMemory.from_spec(spec)
    assert bm.weight_bytes[0] == 2 * 4 * 4096 * 4096 + 2 * 4096
    assert bm.weight_bytes[1] == 2 * 3 * 4096 * 11008 + 2 * 4096
    assert bm.kv_bytes_per_token[0] == 2 * 4096 * 2 == spec.kv_bytes_per_token // 32
    assert bm.always_bytes == 2 * 2 * 32000 * 4096 + 2 * 4096
    assert bm.weights_bytes(np.zeros(64, bool)) == spec.total_weight_bytes
    every = np.ones(64, bool)
    assert bm.weights_bytes(every) == bm.always_bytes and bm.kv_bytes(every, 1000) == 0


@pytest.mark.parametrize("name", ["opt-6.7b", "falcon-7b", "qwen2.5-3b", "llama-3-8b"])
@pytest.mark.parametrize("dtype", ["fp16", "int4"])
def test_sums_equal_spec_totals(name, dtype):
    spec = load_model(name, dtype=dtype)
    bm = BlockMemory.from_spec(spec)
    assert int(bm.weight_bytes.sum()) + bm.always_bytes == spec.total_weight_bytes
    assert int(bm.kv_bytes_per_token.sum()) == spec.kv_bytes_per_token
    assert (bm.kv_bytes_per_token[1::2] == 0).all() and (bm.weight_bytes > 0).all()


def test_int8_kv_split_is_exact():
    # kv_dim 12 at 8.5 bits: per-layer bytes are fractional, the cumulative split keeps the sum exact
    spec = tiny_spec(n_layers=5, d_model=12).model_copy(update={"n_heads": 3, "n_kv_heads": 3, "head_dim": 4,
                                                               "kv_dtype": "int8"})
    bm = BlockMemory.from_spec(spec)
    assert int(bm.kv_bytes_per_token.sum()) == spec.kv_bytes_per_token == int(np.ceil(2 * 5 * 12 * 8.5 / 8))


def test_bad_mask_shape():
    bm = BlockMemory.from_spec(tiny_spec())
    with pytest.raises(ValueError):
        bm.weights_bytes(np.zeros(3, bool))
    with pytest.raises(ValueError):
        format_blocks(np.zeros(3, bool))
