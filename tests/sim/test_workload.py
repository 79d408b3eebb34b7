"""Workload resolution: prefill union, decode stream, batch offsets, KV growth, rescale."""

from __future__ import annotations

import numpy as np
import pytest

from devices.errors import FlashsimError
from sim import bitsets
from sim.workload import TraceView, build_steps
from tests.sim.helpers import tiny_spec


def test_single_sequence_replays_prompt_then_every_generated_token(small_trace) -> None:
    st = build_steps(small_trace, None, None, 1)
    # prefill of prompt 0 (4 tokens), then the 32 generated tokens of both prompts in trace order
    assert st.n == 33 and st.phase[0] == 0 and np.all(st.phase[1:] == 1)
    assert st.token_positions(0, 1)[0].tolist() == [0, 1, 2, 3]
    assert st.positions[4:].tolist() == list(range(4, 20)) + list(range(24, 40))
    assert st.kv_tokens.tolist() == [4] + [4 + j + 1 for j in range(32)]
    assert st.attn_ctx_sum[0] == 4 * 5 // 2 and st.attn_ctx_sum[1] == 5
    view = TraceView(small_trace, st, 2, 256)
    prefill = view.needed(1, 0, 1)[0]
    union = np.bitwise_or.reduce(bitsets.from_packed_bytes(np.asarray(small_trace.packed_masks(1)[:4]), 256), axis=0)
    assert np.array_equal(prefill, union)


def test_batch_unions_sequences_with_distinct_prompts(small_trace) -> None:
    st = build_steps(small_trace, 2, 5, 3)
    assert st.sequence_prompts == (0, 1, 0) and st.prompt_lengths == (2, 2, 2)
    assert st.n_tokens.tolist() == [6, 3, 3, 3, 3, 3]
    assert st.token_positions(0, 1)[0].tolist() == [0, 1, 20, 21, 0, 1]
    first = st.token_positions(1, 2)[0].tolist()
    assert first[0] == 4 and first[1] == 24 and first[2] not in (4, 24)   # third sequence shifted
    assert st.kv_tokens[1] == 3 * (2 + 1)


def test_workload_errors(small_trace) -> None:
    with pytest.raises(FlashsimError, match=r"workload.tokens must be in \[1, 32\]"):
        build_steps(small_trace, None, 33, 1)
    with pytest.raises(FlashsimError, match="only 4 prompt tokens"):
        build_steps(small_trace, 9, None, 1)
    with pytest.raises(FlashsimError, match="batch"):
        build_steps(small_trace, None, None, 0)
    st = build_steps(small_trace, 0, 3, 1)
    assert st.n == 3 and np.all(st.phase == 1)


def test_shape_mismatch_needs_rescale(small_trace) -> None:
    st = build_steps(small_trace, None, 4, 1)
    with pytest.raises(FlashsimError, match="--rescale"):
        TraceView(small_trace, st, 4, 512)
    v = TraceView(small_trace, st, 4, 512, rescale=True)
    assert v.rescaled and v.trace_layer(3) == 1
    a = bitsets.unpack(v.needed(2, 1, 2), 512)[0]
    src = bitsets.unpack(TraceView(small_trace, st, 2, 256).needed(1, 1, 2), 256)[0]
    assert np.array_equal(a, np.tile(src, 2))                  # neurons tiled
    idx, mag, tot = v.token_top(0, np.array([5]))
    ok = idx >= 0
    assert idx.shape[1] == 2 * small_trace.top_k and np.all(idx[ok] < 512)
    assert tot[0] == pytest.approx(2 * float(small_trace.abs_sum(0)[5]))


def test_trace_without_prompt(gated_trace) -> None:
    st = build_steps(gated_trace, None, None, 1)
    assert st.n == 24 and np.all(st.phase == 1) and st.prompt_lengths == (0,)
    assert tiny_spec().d_ff == 256
