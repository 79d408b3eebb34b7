"""The vectorised draws of synthetic traces against direct references: the coverage matrix (shared
moments) against the per-class, per-window sum; the warm-started NNLS against a cold start; the
packed chain generator against a per-token boolean generator using the same random numbers; the
magnitude draw against its model (distribution, independence from neuron identity, uniform
inactive picks, abs_sum); and the masks of small syntheses against hashes stored from the
synthesiser before it was vectorised (a stored hash only detects a change, it says nothing about
which output is right: the statistical tests in test_synthetic.py do)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.traces.test_format import tiny_spec
from traces.format import open_trace
from traces.synthetic import LayerPlan, assign_classes, generate_layer, synthesize, unpack
from traces.synthetic_chain import (
    CLASSES,
    QUAD_Z,
    _nnls,
    bit_thresholds,
    class_matrix,
    normalize_rates,
    prompt_rates,
    representative_rates,
    rho_floor,
    transition_probs,
    uniform_bits,
)
from traces.synthetic_magnitudes import MAG_PROBS, default_magnitudes, draw_magnitudes


def _direct_class_matrix(rates, max_k, classes):
    """The defining sums, one class and one window at a time."""
    pi, count = representative_rates(rates)
    cov, ratio = np.empty((max_k, len(classes))), np.empty(len(classes))
    for c, (rho, sigma) in enumerate(classes):
        lam = prompt_rates(pi[:, None], sigma, QUAD_Z[None, :]) if sigma else pi[:, None]
        w, lam = (count[:, None] * lam).ravel(), lam.ravel()
        r = np.maximum(rho, rho_floor(lam))
        for k in range(1, max_k + 1):
            cov[k - 1, c] = 1.0 - (w * (1 - r) * (1 - lam) * (1 - lam * (1 - r)) ** (k - 1)).sum() / w.sum()
        ratio[c] = w.sum() / (len(QUAD_Z) if sigma else 1) / (count * pi).sum()
    return cov, ratio


@pytest.mark.parametrize("n, mean", [(300, 0.5), (3000, 0.05), (3000, 0.6)])
def test_class_matrix_matches_the_direct_sums(n, mean):
    rates = normalize_rates(np.sort(np.random.default_rng(n).beta(0.3, 1.0, n)), mean)   # some at the cap
    cov, ratio = class_matrix(rates, 8)
    ref_cov, ref_ratio = _direct_class_matrix(rates, 8, CLASSES)
    assert np.abs(cov - ref_cov).max() < 1e-12
    assert np.abs(ratio - ref_ratio).max() < 1e-12


def test_warm_started_nnls_finds_the_cold_optimum():
    rng = np.random.default_rng(0)
    for _ in range(20):
        a, b = rng.random((10, 40)), rng.random(10)
        cold = _nnls(a, b)
        assert np.array_equal(_nnls(a, b, cold > 0), cold)                  # its own support: the same solve
        assert np.abs(_nnls(a, b, rng.random(40) < 0.3) - cold).max() < 1e-9  # any guess: the same optimum


def _per_token_chain(plan, restart, rng, block):
    """bool [T, N]: the chain token by token, drawing the same random numbers in the same order."""
    n, out, prev = len(plan.rates), [], None
    for t0 in range(0, len(restart), block):
        b = min(block, len(restart) - t0)
        u = rng.random((b, n), dtype=np.float32)
        x = np.empty((b, n), bool)
        for t in range(b):
            if restart[t0 + t]:
                z = QUAD_Z[rng.integers(0, len(QUAD_Z), n)] if np.any(plan.sigma > 0) else 0.0
                lam = prompt_rates(plan.rates, plan.sigma, z)
                lam, p01, p11 = (v.astype(np.float32) for v in (lam, *transition_probs(lam, plan.rho)))
                x[t] = u[t] < lam
            else:
                x[t] = u[t] < np.where(x[t - 1] if t else prev, p11, p01)
        prev = x[-1].copy()
        out.append(x)
    return np.concatenate(out)


@pytest.mark.parametrize("block", [32, 33])         # 33 x 203 draws: odd, a 32-bit half left buffered
def test_packed_chain_is_the_per_token_chain(block):
    rng = np.random.default_rng(2)
    n = 203                                              # neither bytes nor 64-bit words divide it
    classes = [(-0.5, 0.0), (0.6, 1.5), (1.0, 0.0), (0.0, 3.0), (0.9, 0.5)]
    r, rho, sigma = assign_classes(np.sort(rng.beta(0.4, 2.0, n)), classes, np.full(5, 0.2), rng)
    plan = LayerPlan(r, rho, sigma, [], {}, {})
    restart = np.zeros(100, bool)
    restart[[0, 17, 18, 40, 64, 65]] = True             # a one-token prompt, prompts at block edges
    rng_got, rng_want = np.random.default_rng(9), np.random.default_rng(9)
    got = np.concatenate([p for _, p in generate_layer(plan, restart, rng_got, block=block)])
    want = _per_token_chain(plan, restart, rng_want, block)
    assert np.array_equal(got, np.packbits(want, axis=1, bitorder="little"))
    assert np.array_equal(unpack(got, n), want)
    assert rng_got.random(5).tolist() == rng_want.random(5).tolist()   # the generator is left in the same state


def test_uniform_bits_are_the_float32_draws():
    for size in (0, 1, 7, 64):
        a, b = np.random.default_rng(size), np.random.default_rng(size)
        for shape in ((3, size), (1, 1), (2, size + 1)):                # odd and even counts, buffer carried
            bits = uniform_bits(a, shape)
            u = b.random(shape, dtype=np.float32)
            assert np.array_equal((bits >> 8).astype(np.float32) / np.float32(1 << 24), u)
            p = np.array([0.0, 1e-7, 0.3, 0.5, 0.999, 1.0], np.float32)
            thr, one = bit_thresholds(p)
            assert np.array_equal((bits.ravel()[:, None] < thr) | one, u.ravel()[:, None] < p)
        assert a.integers(0, 1 << 30) == b.integers(0, 1 << 30)
    a, b = (np.random.Generator(np.random.MT19937(3)) for _ in range(2))   # another bit generator: scaled back
    assert np.array_equal(uniform_bits(a, (4, 9)) >> 8, (b.random((4, 9), dtype=np.float32) * (1 << 24)).astype(np.uint32))


def test_magnitude_draw_follows_the_model():
    rng = np.random.default_rng(5)
    b, n = 400, 1024
    rate = rng.uniform(0.05, 0.5, n)
    active = rng.random((b, n)) < rate
    model = default_magnitudes(theta=0.2)
    counts = active.sum(axis=1)
    k = int(counts.max()) + 40
    idx, mag, abs_sum = draw_magnitudes(active, model, k, np.random.default_rng(1), index_dtype=np.uint16)
    assert idx.dtype == np.uint16 and mag.dtype == np.float16 and abs_sum.dtype == np.float32
    mag = mag.astype(np.float64)
    assert np.all(np.diff(mag, axis=1) <= 0)
    col = np.arange(k)[None, :]
    is_act = col < counts[:, None]
    on = np.take_along_axis(active, idx.astype(np.int64), axis=1)
    assert np.array_equal(on, is_act)                                        # every active first, then inactives
    assert all(len(set(row)) == k for row in idx)
    theta = np.float16(model.threshold)
    assert np.all(mag[is_act] >= theta) and np.all(mag[~is_act] <= theta)
    # pooled active |a| follow the model's quantiles (about 110,000 draws)
    probs = np.linspace(0.05, 0.95, 19)
    want = np.interp(probs, MAG_PROBS, model.active_quantiles)
    assert np.quantile(mag[is_act], probs) == pytest.approx(want, rel=0.01)
    assert mag[is_act].mean() == pytest.approx(np.trapezoid(model.active_quantiles, MAG_PROBS), rel=0.01)
    # the order within a row does not depend on which neuron it is: rank position vs index and rate
    rank = np.broadcast_to(col / np.maximum(counts - 1, 1)[:, None], idx.shape)
    per_neuron = np.bincount(idx[is_act], rank[is_act], n) / np.bincount(idx[is_act], minlength=n)
    assert per_neuron.mean() == pytest.approx(0.5, abs=0.01)
    assert abs(np.corrcoef(per_neuron, np.arange(n))[0, 1]) < 0.1
    assert abs(np.corrcoef(per_neuron, rate)[0, 1]) < 0.1
    # stored inactive neurons: uniform among each row's inactive ones
    picked = np.bincount(idx[~is_act], minlength=n) / (~active).sum(axis=0)
    assert abs(np.corrcoef(picked, np.arange(n))[0, 1]) < 0.1 and abs(np.corrcoef(picked, rate)[0, 1]) < 0.1
    # abs_sum: active mass plus nu * theta per inactive neuron, on average
    expect = counts * mag[is_act].mean() + (n - counts) * model.inactive_mean_ratio * model.threshold
    assert abs_sum.mean() == pytest.approx(expect.mean(), rel=0.02)


# sha256 of masks.npy written by the synthesiser before vectorisation (commit 0fbaf99)
OLD_MASKS = {"parameters": "20bc8bf609932e9bc286f39551ec2214ba010feb50f2bca35e22f941ad156c1b",
             "parameters, magnitudes": "1405d30dfa59632ea06e5e7f7729465453815c7f30f141745e3e7494e686e6af"}


def test_masks_are_those_of_the_per_token_synthesiser(tmp_path):
    a = open_trace(synthesize(tmp_path / "a", tiny_spec(3, 1000), 150, seed=4, active_fraction=0.1, overlap=0.6,
                              hot_skew=0.4, magnitudes=False, prompt_tokens=40))
    b = open_trace(synthesize(tmp_path / "b", tiny_spec(2, 512), 90, seed=4, active_fraction=0.2, overlap=0.5,
                              hot_skew=0.5))
    assert a.manifest.files["masks"].sha256 == OLD_MASKS["parameters"]
    assert b.manifest.files["masks"].sha256 == OLD_MASKS["parameters, magnitudes"]
