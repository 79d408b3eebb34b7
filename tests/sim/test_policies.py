"""Every registered policy: an interface test (parametrized over the registry) and a behaviour test.

Interface: it builds with default parameters, binds, and its plans are well formed: computed sets
stay inside what the residency allows, every computed neuron is resident or read on demand, and
planning a whole range equals planning the same steps one at a time (the real backend's way)."""

from __future__ import annotations

import numpy as np
import pytest

from sim import bitsets
from sim.config import RunConfig
from sim.engine import SetAlgebraCache, build
from sim.policies.presets import preset_config
from sim.policies.registry import all_policies
from tests.sim.helpers import dense_trace, tiny_spec
from traces.format import open_trace


def config_for(slot: str, name: str, recorded_path) -> RunConfig:  # type: ignore[no-untyped-def]
    sets = [f"{slot}={name}"]
    if name == "mmap":
        sets.append("predictor=none")
    if name == "recorded":
        sets.append(f"recorded.path={recorded_path}")
    return preset_config("llm-in-a-flash").with_overrides(sets)


def fresh(trace, host, cfg):  # type: ignore[no-untyped-def]
    return build(trace, None, host, cfg, cache=SetAlgebraCache())


@pytest.mark.parametrize("slot, name", all_policies())
def test_interface(slot: str, name: str, small_trace, host, recorded_path) -> None:
    cfg = config_for(slot, name, recorded_path)
    sim = fresh(small_trace, host, cfg)
    pol = sim.stack.policies[slot]
    assert pol.name == name and pol.slot == slot and pol.ctx is not None
    assert set(pol.describe()) >= {"name"}
    n, S = small_trace.n_neurons, sim.steps.n
    cap = sim.memory.cap_neurons(sim.budget_bytes, 0, S)
    if sim.stack.residency.page_granular:
        whole = sim.stack.residency.advance_pages(0, S, sim.memory.cache_bytes(sim.budget_bytes, 0, S))
        other = fresh(small_trace, host, cfg)
        parts = [other.stack.residency.advance_pages(s, s + 1, other.memory.cache_bytes(other.budget_bytes, s, s + 1))
                 for s in range(S)]
        for k, v in whole.items():
            assert np.array_equal(v, np.concatenate([p[k] for p in parts])), k
        return
    other = fresh(small_trace, host, cfg)
    for layer in range(small_trace.n_layers):
        lp = sim.stack.plan(layer, 0, S, cap)
        steps = [other.stack.plan(layer, s, s + 1, cap[s:s + 2]) for s in range(S)]
        for f in ("computed", "demand", "prefetch_next", "needed"):
            assert np.array_equal(getattr(lp, f), np.concatenate([getattr(p, f) for p in steps])), f
        assert np.array_equal(lp.hits, np.concatenate([p.hits for p in steps]))
        # computed neurons are hits (static or cached) or demand reads; demand only computed ones
        assert np.array_equal(bitsets.count(lp.computed), lp.hits + bitsets.count(lp.demand))
        assert not np.any(bitsets.andnot(lp.demand, lp.computed))
        allowed = sim.stack.residency.allowed(layer, sim.steps.slice(0, S))
        if allowed is not None:
            assert not np.any(bitsets.andnot(lp.computed, allowed))
        assert lp.computed.shape == (S, bitsets.n_words(n))
        counts = sim.stack.layout.read_counts(layer, lp.demand)
        unit, per = sim.stack.layout.read_units()
        assert np.array_equal((counts * sim.stack.layout.chunk_sizes()).sum(axis=1),
                              bitsets.count(lp.demand) * unit * per)


# ---- behaviour, one per policy -------------------------------------------------------------------------
def run(trace, host, preset, *sets, fast="auto"):  # type: ignore[no-untyped-def]
    sim = fresh(trace, host, preset_config(preset).with_overrides(list(sets)))
    return sim, sim.run(fast=fast)


def decode(result):  # type: ignore[no-untyped-def]
    return [r for r in result.tokens if r.phase == "decode"]


def test_naive_streams_every_computed_neuron(small_trace, host) -> None:
    sim, r = run(small_trace, host, "naive", "bundling.coalesce=false")
    per_step = sim.spec.n_layers * sim.spec.d_ff * sim.spec.ffn_neuron_bytes
    assert all(t.bytes_read == per_step and t.hits == 0 for t in decode(r))
    assert all(t.reads_issued == sim.spec.n_layers * sim.spec.d_ff * sim.spec.ffn_matrices for t in decode(r))


def test_hybrid_reads_only_the_non_resident_part(host, traces_dir) -> None:
    spec = tiny_spec(d_model=64, d_ff=4096, name="tiny-wide")   # FFN-heavy so half the model covers some FFN
    trace = open_trace(dense_trace(traces_dir / "wide", spec, n_prompt=0, n_gen=4))
    sim, r = run(trace, host, "hybrid")
    n_res = sim.stack.residency.resident_neurons_per_layer()
    assert 0 < n_res < spec.d_ff
    expect = spec.n_layers * (spec.d_ff - n_res) * spec.ffn_neuron_bytes
    assert all(t.bytes_read == expect for t in decode(r))
    assert sim.memory.parts["static_ffn_neurons"] == spec.n_layers * n_res * spec.ffn_neuron_bytes
    _, hot = run(trace, host, "hybrid", "hybrid.select=hot")
    assert decode(hot)[0].bytes_read == expect and any("select=hot" in n for n in hot.notes)


def test_window_reads_less_with_a_longer_window(small_trace, host) -> None:
    totals = [sum(t.bytes_read for t in decode(run(small_trace, host, "llm-in-a-flash", f"window.k={k}")[1]))
              for k in (0, 1, 3, 8, "inf")]
    assert all(a >= b for a, b in zip(totals, totals[1:])) and totals[0] > totals[-1]


def test_dense_reads_nothing(small_trace, host) -> None:
    _, r = run(small_trace, host, "dense")
    assert all(t.bytes_read == 0 and t.stall_s == 0 for t in r.tokens)


def test_mmap_hits_when_the_model_fits_and_rereads_when_not(small_trace, host) -> None:
    sim, r = run(small_trace, host, "mmap")
    assert r.tokens[0].bytes_read > 0 and all(t.bytes_read == 0 for t in r.tokens[1:])
    model = sim.spec.total_weight_bytes
    kv = int(sim.memory.kv_bytes.max())
    _, small = run(small_trace, host, "mmap", f"memory.dram_budget_bytes={kv + model // 2}")
    assert all(t.bytes_read >= model * 0.9 for t in decode(small))    # LRU under a cyclic scan misses all


def test_selective_computes_static_plus_dynamic_and_never_reads(small_trace, host) -> None:
    sim, r = run(small_trace, host, "selectinfer")
    N = small_trace.n_neurons
    res = sim.stack.residency
    assert all(t.bytes_read == 0 for t in r.tokens)
    for layer in range(small_trace.n_layers):
        loaded, static = res._sets(layer)
        assert loaded.sum() == round(0.7 * N) and static.sum() == round(0.2 * N)
        assert (static | res.dynamic(layer)).sum() == round(0.4 * N)
        assert not (res.dynamic(layer) & ~loaded).any()
    assert decode(r)[0].computed == small_trace.n_layers * round(0.4 * N)
    assert r.tokens[0].computed == small_trace.n_layers * round(0.7 * N)     # prefill: all loaded
    assert any("profiled itself" in n for n in r.notes)
    assert 0 < r.summary()["activation_mass_kept"] < 1


def test_none_and_oracle_predictors(small_trace, host) -> None:
    _, dense = run(small_trace, host, "llm-in-a-flash", "predictor=none")
    assert all(t.computed == small_trace.n_layers * small_trace.n_neurons for t in dense.tokens)
    sim, orc = run(small_trace, host, "llm-in-a-flash", "predictor=oracle")
    assert orc.summary()["recall"] == 1.0
    for layer in range(small_trace.n_layers):
        needed = sim.view.needed(layer, 0, sim.steps.n)
        assert sim.stack.computed(layer, 0, sim.steps.n).tolist() == needed.tolist()


def test_noisy_predictor_hits_its_recall_and_precision(traces_dir, host) -> None:
    spec = tiny_spec(d_ff=2048, name="tiny-2k")
    trace = open_trace(dense_trace(traces_dir / "noisy", spec, n_prompt=0, n_gen=30, active_fraction=0.2))
    sim, r = run(trace, host, "llm-in-a-flash", "predictor=noisy", "noisy.recall=0.8", "noisy.precision=0.5")
    tp = pred = act = 0
    for layer in range(spec.n_layers):
        c = sim.stack.computed(layer, 0, sim.steps.n)
        n = sim.view.needed(layer, 0, sim.steps.n)
        tp += bitsets.count(c & n).sum()
        pred += bitsets.count(c).sum()
        act += bitsets.count(n).sum()
    assert tp / act == pytest.approx(0.8, abs=0.02) and tp / pred == pytest.approx(0.5, abs=0.03)
    assert r.summary()["recall"] == pytest.approx(tp / act)


def test_recorded_predictor_uses_the_recording(small_trace, host, recorded_path) -> None:
    sim, _ = run(small_trace, host, "llm-in-a-flash", "predictor=recorded", f"recorded.path={recorded_path}")
    rec = open_trace(recorded_path)
    got = sim.stack.computed(0, 1, 2)
    assert np.array_equal(got[0], bitsets.from_packed_bytes(np.asarray(rec.packed_masks(0)[4:5]), 256)[0])


def test_bundling_divides_reads_and_coalescing_merges_neighbours(gated_trace, host) -> None:
    _, b = run(gated_trace, host, "llm-in-a-flash", "bundling.coalesce=false")
    _, u = run(gated_trace, host, "llm-in-a-flash", "bundling.coalesce=false", "bundling.bundled=false")
    assert all(x.reads_issued * 3 == y.reads_issued and x.bytes_read == y.bytes_read for x, y in zip(b.tokens, u.tokens))
    _, c = run(gated_trace, host, "llm-in-a-flash", "predictor=none", "window.k=0")
    assert all(t.reads_issued == gated_trace.n_layers for t in decode(c))     # each dense layer: one read
    _, h = run(gated_trace, host, "llm-in-a-flash", "bundling.order=hot-first")
    _, o = run(gated_trace, host, "llm-in-a-flash", "bundling.order=coactivation")
    assert sum(t.bytes_read for t in h.tokens) == sum(t.bytes_read for t in o.tokens) == sum(
        t.bytes_read for t in run(gated_trace, host, "llm-in-a-flash")[1].tokens)


def test_prefetch_hides_reads_behind_compute(small_trace, host) -> None:
    _, none = run(small_trace, host, "llm-in-a-flash", "predictor.rank=0", fast=False)
    _, delta = run(small_trace, host, "llm-in-a-flash", "prefetch=delta", "predictor.rank=0")
    _, look = run(small_trace, host, "llm-in-a-flash", "prefetch=lookahead", "predictor.rank=0")
    s_none, s_delta, s_look = (x.summary() for x in (none, delta, look))
    assert s_delta["stall_ms_per_token"] < s_none["stall_ms_per_token"]
    assert s_look["stall_ms_per_token"] < s_none["stall_ms_per_token"]
    assert sum(t.prefetch_bytes for t in delta.tokens) > 0 and sum(t.prefetch_bytes for t in none.tokens) == 0
    # perfect prediction reads no more: the same neurons earlier, minus those the window would have
    # evicted at the end of a step although the next step needs them
    assert sum(t.bytes_read for t in delta.tokens) <= sum(t.bytes_read for t in none.tokens)


def test_quantized_precision_scales_every_byte(small_trace, host) -> None:
    sim16, r16 = run(small_trace, host, "naive")
    sim4, r4 = run(small_trace, host, "naive", "precision=quantized")
    assert sim4.spec.dtype == "int4" and sim16.spec.dtype == "fp16"
    assert decode(r4)[0].bytes_read == pytest.approx(decode(r16)[0].bytes_read * 4.5 / 16, rel=0.02)
    _, r8 = run(small_trace, host, "naive", "precision=quantized", "quantized.bits=8")
    assert decode(r8)[0].bytes_read == pytest.approx(decode(r16)[0].bytes_read * 8.5 / 16, rel=0.02)


def test_bundling_alignment_pads_every_unit_by_hand(gated_trace, host) -> None:
    """align_bytes: every unit occupies its size rounded up on flash (a padded store). gated_trace: d_model 64
    fp16, so a row is 128 B and a bundle (gate | up | down) 384 B; at 4 KiB alignment both take 4096 B."""
    spec_row, spec_bundle = 64 * 2, 3 * 64 * 2
    mask = np.zeros((1, gated_trace.n_neurons), bool)
    mask[0, [0, 1, 2, 5, 10, 11]] = True                 # runs of 3, 1 and 2 adjacent neurons
    words = bitsets.pack(mask)

    def layout(*sets):  # type: ignore[no-untyped-def]
        cfg = preset_config("llm-in-a-flash").with_overrides(["bundling.max_chunk_bytes=8KiB", *sets])
        return fresh(gated_trace, host, cfg).stack.layout

    # packed (default): 384 B units, up to 8192 // 384 = 21 per chunk: three reads of 3, 1 and 2 bundles
    packed = layout()
    assert packed.read_units() == (spec_bundle, 1)
    c = packed.read_counts(0, words)
    assert c[0, 0] == 1 and c[0, 1] == 1 and c[0, 2] == 1 and c.sum() == 3
    assert int((c * packed.chunk_sizes()).sum()) == 6 * spec_bundle
    # aligned to 4 KiB: 4096 B strides, 8192 // 4096 = 2 per chunk: runs 3 -> 2 + 1, 1 -> 1, 2 -> 2
    bun = layout("bundling.align_bytes=4KiB")
    assert bun.read_units() == (4096, 1)
    assert bun.chunk_sizes().tolist() == [4096, 8192]
    assert bun.read_counts(0, words).tolist() == [[2, 2]]
    assert int((bun.read_counts(0, words) * bun.chunk_sizes()).sum()) == 2 * 4096 + 2 * 8192 == 6 * 4096
    # unbundled: one 128 B row per matrix, each in a 4096 B stride: the same runs in each of 3 regions
    unb = layout("bundling.align_bytes=4KiB", "bundling.bundled=false")
    assert unb.read_units() == (4096, 3)
    assert unb.read_counts(0, words).tolist() == [[6, 6]]
    assert int((unb.read_counts(0, words) * unb.chunk_sizes()).sum()) == 3 * 6 * 4096
    # alignment that is not a power of the unit: 384 -> 512, 128 -> 512
    assert layout("bundling.align_bytes=512").read_units() == (512, 1)
    assert layout("bundling.align_bytes=512", "bundling.bundled=false").read_units() == (512, 3)
    assert layout("bundling.align_bytes=128", "bundling.bundled=false").read_units() == (spec_row, 3)


def test_bundling_alignment_scales_bytes_read_exactly(gated_trace, host) -> None:
    """Without coalescing every read is one unit, so padding scales each token's bytes by stride / unit
    and leaves reads and hits unchanged; a cached neuron's DRAM is its bundle padded (384 -> 4096 B) in
    both layouts, as in the real cache, so cache_bytes scale by 4096 / 384 (the budget here is large
    enough that nothing changes what is cached); 0 is the packed default (golden numbers unchanged)."""
    for bundled, unit in (("true", 3 * 64 * 2), ("false", 64 * 2)):
        base = ["bundling.coalesce=false", f"bundling.bundled={bundled}"]
        _, p = run(gated_trace, host, "llm-in-a-flash", *base)
        _, z = run(gated_trace, host, "llm-in-a-flash", *base, "bundling.align_bytes=0")
        _, a = run(gated_trace, host, "llm-in-a-flash", *base, "bundling.align_bytes=4096")
        assert [t.bytes_read for t in z.tokens] == [t.bytes_read for t in p.tokens]
        assert sum(t.bytes_read for t in p.tokens) > 0
        for x, y in zip(p.tokens, a.tokens):
            assert y.bytes_read * unit == x.bytes_read * 4096
            assert (y.reads_issued, y.hits, y.computed) == (x.reads_issued, x.hits, x.computed)
            assert y.cache_bytes * 3 * 64 * 2 == x.cache_bytes * 4096


def test_bundling_alignment_pads_cached_neurons_in_dram_by_hand(gated_trace, host) -> None:
    """A cached neuron takes its bundle padded to align_bytes of DRAM in BOTH layouts, as in the real cache
    (real/runtime/cache_matrices.py: one bundle row of round_up(bundle, 4 KiB)), not one padded stride per flash row.
    gated_trace: 3 layers x 192 SwiGLU neurons, d_model 64 fp16: bundle 3 x 128 = 384 B -> 4096 B (unbundled:
    three 128 B rows, 4096 B each on flash, still 4096 B in DRAM). Fixed: non-FFN 355,200 B + the oracle
    predictor 3 x (64 x 128 + 128 x 192) x 2 = 196,608 B; KV 768 B per token (768 at step 0, 18,432 at the
    last). Budget = fixed + 18,432 + 3 layers x 4096 x 40 = 1,061,760 B."""
    fixed, budget = 355_200 + 196_608, 355_200 + 196_608 + 18_432 + 3 * 4096 * 40
    for bundled in ("true", "false"):
        sets = [f"bundling.bundled={bundled}", f"memory.dram_budget_bytes={budget}", "predictor=oracle",
                "oracle.rank=128"]
        packed = fresh(gated_trace, host, preset_config("llm-in-a-flash").with_overrides(sets))
        padded = fresh(gated_trace, host, preset_config("llm-in-a-flash").with_overrides(
            [*sets, "bundling.align_bytes=4096"]))
        assert padded.stack.layout.dram_bytes_per_neuron(padded.spec) == padded.memory.neuron_bytes == 4096
        assert packed.stack.layout.dram_bytes_per_neuron(packed.spec) == packed.memory.neuron_bytes == 384
        assert padded.memory.fixed_bytes == packed.memory.fixed_bytes == fixed
        # share per layer: floor((budget - fixed - kv) / (3 x neuron bytes)); step 0 then the last (repeated)
        S = padded.steps.n
        assert padded.memory.cap_neurons(budget, 0, S)[[0, -1]].tolist() == [509_184 // 12_288, 40] == [41, 40]
        assert packed.memory.cap_neurons(budget, 0, S)[[0, -1]].tolist() == [509_184 // 1152, 491_520 // 1152] == [442, 426]
        r = padded.run()
        assert all(t.resident_bytes == fixed + t.kv_bytes + t.cache_bytes <= budget for t in r.tokens)
        assert all(t.cache_bytes % 4096 == 0 for t in r.tokens)
        # from step 8 the caches are full: 3 layers x 40 neurons x 4096 B; the last step uses the whole budget
        assert {t.cache_bytes for t in r.tokens[8:]} == {3 * 40 * 4096}
        assert r.tokens[-1].resident_bytes == budget == 1_061_760
        # the cache policy's own count, at the padded size
        res = padded.stack.residency
        assert res.dynamic_bytes(padded.memory.neuron_bytes) * 384 == res.dynamic_bytes() * 4096 > 0
    # static neurons (hybrid) are cache rows too: fraction 0.9 keeps (0.9 x 576,384 - 355,200) // (3 x 384)
    # = 141 neurons per layer
    hyb = ["residency=hybrid", "hybrid.fraction=0.9"]
    sp = fresh(gated_trace, host, preset_config("llm-in-a-flash").with_overrides([*hyb, "bundling.align_bytes=4096"]))
    sk = fresh(gated_trace, host, preset_config("llm-in-a-flash").with_overrides(hyb))
    assert sp.memory.parts["static_ffn_neurons"] == 3 * 141 * 4096 and sk.memory.parts["static_ffn_neurons"] == 3 * 141 * 384


def test_bundling_alignment_must_not_be_negative(gated_trace, host) -> None:
    from devices.errors import FlashsimError

    with pytest.raises(FlashsimError, match="align_bytes"):
        preset_config("llm-in-a-flash").with_overrides(["bundling.align_bytes=-1"])


def test_every_neuron_computed_is_gathered_by_a_window_and_run_in_place_by_dense(small_trace, host) -> None:
    """A window step computing every neuron gathers them all out of its cache (rows in arrival
    order, as real.runtime.backend does); dense holds the whole FFN in neuron order and runs it in place,
    and gathers only a sparser predictor's subset."""
    N, L = small_trace.n_neurons, small_trace.n_layers
    win, w = run(small_trace, host, "llm-in-a-flash", "predictor=none", "prefetch=none")
    den, d = run(small_trace, host, "dense", "predictor=none")
    full, part = np.array([[N, N - 1]]), np.array([[N - 1]])
    assert win.stack.residency.gathers_at(full).all()
    assert den.stack.residency.gathers_at(full).tolist() == [[False, True]]
    assert den.stack.residency.gathers_at(part).all()
    assert all(t.computed == L * N for t in w.tokens + d.tokens)
    cm, n, c = win.planner.compute, np.array([1.0]), np.array([[float(N)]])
    assert cm.ffn(n, c, win.stack.residency.gathers_at(c)).gather_s[0, 0] > 0
    assert cm.ffn(n, c, den.stack.residency.gathers_at(c)).gather_s[0, 0] == 0
    for tw, td in zip(decode(w), decode(d), strict=True):   # the same neurons, the window's gathered
        assert tw.ffn_compute_s > td.ffn_compute_s
