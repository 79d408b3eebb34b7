"""Closed forms the simulator must reproduce exactly (no tolerance beyond float rounding)."""

from __future__ import annotations

import numpy as np
import pytest

from devices import load_profile
from sim.engine import SetAlgebraCache, simulate
from sim.policies.presets import preset_config
from tests.sim.helpers import dense_trace, tiny_spec
from traces.build import write_dense_trace
from traces.format import PromptInfo, open_trace


@pytest.fixture(scope="module")
def wide_rows(traces_dir):  # type: ignore[no-untyped-def]
    """d_model 4096 fp16: one FFN row is 8 KiB, a matrix of 512 rows is 4 MiB (four 1 MiB reads)."""
    spec = tiny_spec(n_layers=2, d_model=4096, d_ff=512, name="wide-rows")
    return open_trace(dense_trace(traces_dir / "wide_rows", spec, n_prompt=0, n_gen=5))


@pytest.mark.parametrize("device", ["apple-m1-max", "this-host"])
def test_naive_io_is_streamed_bytes_over_the_curve_at_the_chunk_size(wide_rows, device) -> None:
    """Naive with dense compute reads each FFN matrix as one contiguous region, in max_chunk_bytes
    reads all issued together: I/O per token = streamed bytes / bw(1 MiB, q). We use the curve at
    the chunk size, not the sequential bandwidth, because that is what the device delivers for this
    read pattern; the two agree where the curve saturates (the M1's closed form: 8 reads of 1 MiB
    in flight reach its 6.1 GB/s sequential cap), and differ on the measured host table (1 MiB
    reads at depth 8: 1.87 GB/s, below its 2.0 GB/s sequential figure)."""
    prof = load_profile(device)
    cfg = preset_config("naive")
    r = simulate(wide_rows, None, prof, cfg, cache=SetAlgebraCache())
    spec = wide_rows.spec
    streamed = spec.n_layers * spec.d_ff * spec.ffn_neuron_bytes
    per_layer_reads = 2 * (512 * 8192 // (1 << 20))          # 2 matrices x 4 chunks of 1 MiB
    bw = prof.flash.curve.bytes_per_s(1 << 20, min(per_layer_reads, prof.flash.max_in_flight))
    # the default layout is packed (align_bytes 0): a direct-I/O reader stages each read, which a
    # profile that measured it (this-host) prices per read
    staged = prof.flash.staged_s_per_read
    # one batch per layer (both matrices' reads issued together), each paying the profile's
    # measured batch overhead at its depth (0 for a profile without one)
    per_batch = float(prof.flash.batch_overhead_at(np.array([min(per_layer_reads, prof.flash.max_in_flight)]))[0])
    assert (per_batch > 0) == (device == "this-host")
    for t in r.tokens:
        assert t.bytes_read == streamed and t.reads_issued == spec.n_layers * per_layer_reads
        assert t.io_s == pytest.approx(streamed / bw + t.reads_issued * staged + spec.n_layers * per_batch, rel=1e-12)
        assert t.stall_s == pytest.approx(t.io_s, rel=1e-12)      # every read is waited for
    if device == "apple-m1-max":
        assert r.summary()["io_ms_per_token"] == pytest.approx(1e3 * streamed / 6.1e9, rel=1e-12)
    else:   # the measured table's 1 MiB column at that depth (this-host: bench flash)
        t = prof.flash.read_table
        qs = t.in_flight
        q = min(per_layer_reads, prof.flash.max_in_flight)
        row = t.bytes_per_s[t.chunk_bytes.index(1 << 20)]
        assert bw == pytest.approx(float(np.interp(q, qs, row)))


def test_repeated_token_under_an_unbounded_window_reads_nothing(traces_dir, host) -> None:
    spec = tiny_spec(name="repeat")
    rng = np.random.default_rng(5)
    a = np.maximum(rng.normal(size=(spec.n_layers, 2, spec.d_ff)), 0).astype(np.float32)
    acts = a[:, [0, 1, 0, 1, 0, 1, 0, 1], :]                 # tokens A B A B ...
    T = acts.shape[1]
    p = write_dense_trace(traces_dir / "repeat", spec, acts, np.zeros(T, np.int32), np.ones(T, np.uint8),
                          np.zeros(T, np.int32), [PromptInfo(id="r", task="t", n_prompt_tokens=0, n_generated_tokens=T)],
                          rule="relu")
    trace = open_trace(p)
    oracle = preset_config("llm-in-a-flash").with_overrides(["predictor=oracle", "oracle.rank=128"])
    r = simulate(trace, None, host, oracle.with_overrides(["window.k=inf"]), cache=SetAlgebraCache())
    assert r.tokens[0].bytes_read > 0 and r.tokens[1].bytes_read > 0
    assert all(t.bytes_read == 0 and t.stall_s == 0 for t in r.tokens[2:])
    # a window of one step forgets A while B computes: every token reads again
    r1 = simulate(trace, None, host, oracle.with_overrides(["window.k=1"]), cache=SetAlgebraCache())
    assert all(t.bytes_read > 0 for t in r1.tokens)


def test_bundling_divides_the_reads_by_the_number_of_matrices(gated_trace, small_trace, host) -> None:
    for trace, m in ((gated_trace, 3), (small_trace, 2)):
        b = simulate(trace, None, host, preset_config("llm-in-a-flash").with_overrides(["bundling.coalesce=false"]),
                     cache=SetAlgebraCache())
        u = simulate(trace, None, host, preset_config("llm-in-a-flash").with_overrides(
            ["bundling.coalesce=false", "bundling.bundled=false"]), cache=SetAlgebraCache())
        assert sum(t.reads_issued for t in b.tokens) > 0
        for x, y in zip(b.tokens, u.tokens):
            assert y.reads_issued == m * x.reads_issued and y.bytes_read == x.bytes_read


def test_without_overlap_latency_is_the_sum_of_its_parts(small_trace, host) -> None:
    r = simulate(small_trace, None, host, preset_config("llm-in-a-flash"), fast=False, cache=SetAlgebraCache())
    for t in r.tokens:
        assert t.latency_s == pytest.approx(t.compute_s + t.mem_mgmt_s + t.stall_s, rel=1e-9)
        assert t.stall_s == pytest.approx(t.io_s, rel=1e-9)       # every read is waited for
