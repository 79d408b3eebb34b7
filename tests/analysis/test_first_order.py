"""First-order fit estimate: hand-computed cases."""

import pytest

from analysis.first_order import estimate_fit
from devices import load_model, load_profile


def test_small_model_fits_and_is_memory_bound() -> None:
    m, d = load_model("smollm2-135m"), load_profile("jetson-orin-nano-8gb")
    e = estimate_fit(m, d, context_tokens=0)
    assert e.verdict == "fits"
    assert e.ms_per_token == pytest.approx(1e3 * m.total_weight_bytes / d.memory.bandwidth_bytes_per_s)


def test_7b_on_orin_nano_streams_its_ffn() -> None:
    m, d = load_model("llama-2-7b"), load_profile("jetson-orin-nano-8gb")
    e = estimate_fit(m, d, context_tokens=0)
    assert e.verdict == "streams-ffn"
    resident_ffn = d.available_bytes - m.non_ffn_bytes
    assert e.streamed_bytes_per_token == m.ffn_bytes_total - resident_ffn
    expect_s = d.available_bytes / d.memory.bandwidth_bytes_per_s + e.streamed_bytes_per_token / 3.5e9
    assert e.ms_per_token == pytest.approx(1e3 * expect_s)


def test_does_not_fit_when_kv_cache_is_huge() -> None:
    e = estimate_fit(load_model("llama-2-7b"), load_profile("phone-ufs4"), context_tokens=100_000)
    assert e.verdict == "does-not-fit" and e.ms_per_token is None and e.tokens_per_s is None
