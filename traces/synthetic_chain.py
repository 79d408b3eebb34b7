"""The activation chain of synthetic traces: its closed forms and the fit of its parameters.

Owns the per-neuron model of traces/synthetic.py (see its docstring for the generative model and the
fitting procedure): the two-state Markov chain's transition probabilities and window coverage in
closed form, the class grid (persistence rho x context variability sigma) and its constrained
least-squares fit to a source's window coverage, the count-variance inflation used to remove a
source's sampling noise from its rates, and the rate distributions (shrunk source rates resampled
to a target neuron count, or a capped power law solved for --hot-skew and --overlap). Pure NumPy on
rate vectors; nothing here reads or writes a trace.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Sequence

import numpy as np

from devices.errors import FlashsimError
from traces.stats import hot_fraction

# Persistence: alternating (-0.5) through memoryless (0) to ~100-token holds (0.99) and whole prompts (1).
RHO_GRID = (-0.5, -0.3, -0.2, -0.1, 0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)
# Context variability: sd of log prompt-level rate (0 = the same rate in every prompt).
SIGMA_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0)
CLASSES = tuple((rho, sigma) for sigma in SIGMA_GRID for rho in RHO_GRID)
# Cost per unit share of a context class in the fit (see `fit_classes`): 0.01 per unit of sigma, so
# a context class must improve the worst coverage error by about that much to be chosen.
CONTEXT_PENALTY = np.array([0.01 * sigma for _, sigma in CLASSES])
QUAD_Z = np.array([statistics.NormalDist().inv_cdf((j + 0.5) / 16) for j in range(16)])
FIT_RATES = 512               # representative rates for the coverage integrals
# A rate of 1 would be a dense neuron that never switches off; keep every chain able to switch.
RATE_CAP = 0.995
RATE_FLOOR = 1e-7
BETA_MAX = 8.0                # power-law exponent range of --hot-skew: 8 saturates the hottest at the cap


# ---- the chain's closed forms -----------------------------------------------------------------
def rho_floor(rates: np.ndarray) -> np.ndarray:
    """The most negative persistence a chain with these rates can have (p11 >= 0 and p01 <= 1)."""
    pi = np.clip(np.asarray(rates, np.float64), RATE_FLOOR, RATE_CAP)
    return -np.minimum(pi / (1.0 - pi), (1.0 - pi) / pi)


def transition_probs(rates: np.ndarray, rho: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(p01, p11) of each neuron's chain: P(on | was off), P(on | was on); rho clipped at its floor."""
    r = np.maximum(rho, rho_floor(rates))
    return rates * (1.0 - r), rates + r * (1.0 - rates)


def prompt_rates(rates: np.ndarray, sigma: np.ndarray | float, z: np.ndarray | float,
                 norm: np.ndarray | None = None) -> np.ndarray:
    """Prompt-level rates lambda = min(pi exp(sigma z) / M(sigma), RATE_CAP) for z among the QUAD_Z
    nodes, M(sigma) = mean over the nodes of exp(sigma z), so E[lambda] = pi before the cap.
    `norm` is M(sigma) when already known (`context_norm`)."""
    sigma = np.asarray(sigma, np.float64)
    if norm is None:
        norm = np.exp(sigma[..., None] * QUAD_Z).mean(axis=-1)
    return np.clip(rates * np.exp(sigma * z) / norm, RATE_FLOOR, RATE_CAP)


def context_norm(sigma: np.ndarray) -> np.ndarray:
    """M(sigma) of `prompt_rates` per neuron, evaluated once per distinct sigma (the same values):
    the classes give a neuron one of a few sigma values."""
    sigma = np.asarray(sigma, np.float64)
    norm = np.empty(len(sigma))
    todo = np.ones(len(sigma), bool)
    for _ in range(len(SIGMA_GRID) + 2):
        if not todo.any():
            return norm
        value = sigma[np.argmax(todo)]
        same = sigma == value
        norm[same] = np.exp(value * QUAD_Z).mean()
        todo &= ~same
    norm[todo] = np.exp(sigma[todo, None] * QUAD_Z).mean(axis=-1)
    return norm


def uniform_bits(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """uint32 [shape]: the 32-bit draws behind `rng.random(shape, dtype=np.float32)`, whose values
    are u = (x >> 8) / 2^24, leaving rng where that call would (so the chains compare integers with
    `bit_thresholds` and get the same booleans). NumPy's PCG64 hands out each 64-bit output as two
    32-bit draws, low half first, and keeps an odd one's high half for the next draw: on a
    little-endian host the raw outputs viewed as uint32 are that sequence. Otherwise the float32
    draws are scaled back (the same top 24 bits)."""
    bitgen, size = rng.bit_generator, shape[0] * shape[1]
    if not isinstance(bitgen, np.random.PCG64) or sys.byteorder != "little" or size == 0:
        return (rng.random(shape, dtype=np.float32) * np.float32(1 << 24)).astype(np.uint32) << 8
    state = bitgen.state
    first = [np.uint32(state["uinteger"])] if state["has_uint32"] else []
    if first:
        state["has_uint32"] = 0
        bitgen.state = state
    rest = size - len(first)
    raw = bitgen.random_raw((rest + 1) // 2).view(np.uint32)
    if rest % 2:                                  # the last output's high half stays buffered
        state = bitgen.state
        state["has_uint32"], state["uinteger"] = 1, int(raw[-1])
        bitgen.state = state
    bits = np.concatenate([first, raw[:rest]]).astype(np.uint32, copy=False) if first else raw[:rest]
    return bits.reshape(shape)


def bit_thresholds(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(uint32 thresholds, bool [p >= 1]) such that for x from `uniform_bits` and its float32
    u = (x >> 8) / 2^24: u < p  <=>  x < threshold, or p >= 1 (whose threshold 2^32 does not fit)."""
    t = np.ceil(np.asarray(p, np.float32).astype(np.float64) * (1 << 24)) * 256.0
    return np.minimum(t, 2.0 ** 32 - 1).astype(np.uint32), np.asarray(p) >= 1.0


def representative_rates(rates: np.ndarray, n_reps: int = FIT_RATES) -> tuple[np.ndarray, np.ndarray]:
    """(values, neuron counts) standing for a rate distribution in the coverage integrals: all
    rates when there are at most n_reps, else the n_reps/4 hottest one by one (they carry the most
    events) and equal-count bin means of the rest."""
    r = np.asarray(rates, np.float64)
    pi = (r if np.all(r[1:] >= r[:-1]) else np.sort(r))[::-1]     # the fits pass ascending rates
    if len(pi) <= n_reps:
        return pi, np.ones(len(pi))
    top = n_reps // 4
    edges = np.linspace(0, len(pi) - top, n_reps - top + 1).astype(np.int64)
    counts = np.diff(edges).astype(np.float64)
    means = np.add.reduceat(pi[top:], edges[:-1]) / counts
    return np.concatenate([pi[:top], means]), np.concatenate([np.ones(top), counts])


def class_matrix(rates: np.ndarray, max_k: int, classes: Sequence[tuple[float, float]] = CLASSES,
                 reps: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Expected coverage [max_k, C] at k = 1..max_k if every neuron were in class c, and the mean
    rate ratio [C] E[lambda] / E[pi] (below 1 where the cap bites).

    Over the representative rates (and QUAD_Z nodes) i, with events w_i = count_i lambda_i and
    r = max(rho, floor_i) (floor_i = `rho_floor`), coverage_k = 1 - miss_k / sum w with
        miss_k = sum_i w_i (1 - r)(1 - lambda_i)(1 - lambda_i (1 - r))^(k-1).
    Where rho is not clipped (r = rho, a = 1 - rho) the binomial expansion gives
        miss_k = a sum_j C(k-1, j) (-a)^j M_j,   M_j = sum_i w_i (1 - lambda_i) lambda_i^j,
    so every class shares the moments M_j; a class with rho < 0 clips the elements with
    floor_i > rho, whose terms (r = floor_i) do not depend on the class: both are summed once per
    level of floor_i between the classes' rho values. (All terms are in [0, 1] x w_i; the sums
    agree with the direct ones to ~1e-15 absolute in coverage.) `reps`: `representative_rates(rates)`
    when already computed."""
    pi, count = representative_rates(rates) if reps is None else reps
    table = np.asarray(classes, np.float64).reshape(-1, 2)
    powers = np.arange(max_k)
    binom = np.array([[math.comb(k, j) for j in powers] for k in powers], np.float64)   # C(k-1, j)
    sigmas, group = np.unique(table[:, 1], return_inverse=True)
    levels = [np.sort(table[group == g, 0]) for g in range(len(sigmas))]   # each sigma's rho values
    width = max(len(v) for v in levels) + 1
    lam_g, w_g, key_g, floor_g = [], [], [], []
    for g, sigma in enumerate(sigmas):                 # elements: representative rates x QUAD_Z nodes
        lam2 = prompt_rates(pi[:, None], sigma, QUAD_Z[None, :]) if sigma else pi[:, None]
        lam = lam2.ravel()
        floor = rho_floor(lam)
        lam_g.append(lam)
        w_g.append((count[:, None] * lam2).ravel())    # events: neurons x rate
        floor_g.append(floor)
        key_g.append(g * width + np.searchsorted(levels[g], floor, side="left"))  # + how many rho < floor_i
    key = np.concatenate(key_g).astype(np.uint16)
    order = np.argsort(key, kind="stable")
    lam, weight, floor = (np.concatenate(v)[order] for v in (lam_g, w_g, floor_g))
    feats = np.empty((2 * max_k, len(lam)))
    feats[0] = weight * (1.0 - lam)                    # moments M_j (unclipped)
    for j in range(1, max_k):
        np.multiply(feats[j - 1], lam, out=feats[j])
    feats[max_k] = weight * (1.0 - floor) * (1.0 - lam)   # clipped terms, k = 1..max_k
    stay_off = 1.0 - lam * (1.0 - floor)
    for k in range(1, max_k):
        np.multiply(feats[max_k + k - 1], stay_off, out=feats[max_k + k])
    key = key[order]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    present = key[starts]
    sums = np.zeros((2 * max_k, len(sigmas) * width))
    sums[:, present] = np.add.reduceat(feats, starts, axis=1)
    upto = np.cumsum(sums.reshape(2 * max_k, len(sigmas), width), axis=2)   # sums over level <= q
    total = np.array([float(v.sum()) for v in w_g])
    rho = table[:, 0]
    q = np.empty(len(rho), np.int64)
    for g in range(len(sigmas)):
        q[group == g] = np.searchsorted(levels[g], rho[group == g])
    a = 1.0 - rho
    coef = binom[None, :, :] * (-a[:, None, None]) ** powers[None, None, :]
    miss = a[:, None] * np.einsum("ckj,jc->ck", coef, upto[:max_k, group, q]) \
        + (upto[max_k:, group, -1] - upto[max_k:, group, q]).T            # clipped: level > q
    cov = (1.0 - miss / total[group, None]).T
    nodes = np.where(sigmas > 0, len(QUAD_Z), 1)
    ratio = (total / nodes / float((count * pi).sum()))[group]
    return cov, ratio


def _nnls(a: np.ndarray, b: np.ndarray, start: np.ndarray | None = None) -> np.ndarray:
    """Lawson-Hanson non-negative least squares: argmin ||a x - b|| subject to x >= 0.

    `start` (bool [n]) guesses the positive set (a warm start, e.g. the previous solution of a
    slightly reweighted problem): its columns whose least-squares values are not positive are
    dropped until all are, and the usual iteration continues from there. The KKT check that ends
    it is the same, so the result is the same optimum, and when the final positive set is the
    same it is the same floating-point solve, bit for bit."""
    n = a.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, bool)
    tol = 1e-12 * max(1.0, float(np.abs(a).max()))
    if start is not None:
        passive = start.copy()
        while passive.any():
            z = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if z.min() > tol:
                x[passive] = z
                break
            passive[np.flatnonzero(passive)[z <= tol]] = False
    for _ in range(3 * n):
        w = a.T @ (b - a @ x)
        if passive.all() or w[~passive].max() <= tol:
            break
        passive[np.argmax(np.where(passive, -np.inf, w))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if z[passive].min() > tol:
                x = z
                break
            neg = passive & (z <= tol)
            step = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + step * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
    return x


def fit_classes(cov: np.ndarray, target_cov: Sequence[float | None], minimax_iters: int = 15,
                context_penalty: np.ndarray | None = None, fallback_index: int = 0,
                start: np.ndarray | None = None) -> np.ndarray:
    """Class shares [C] whose mixture of coverages best matches `target_cov` (k = 1..; None = skip).

    The agreement that matters is the worst k (the tolerance is absolute per k), so the shares
    minimise the largest error: Lawson's iteratively reweighted non-negative least squares (each
    k reweighted by its residual), keeping the best iterate. Shares sum to one (a stiff extra row).
    `context_penalty` [C] adds a small cost per unit share (a row asking sum(penalty * v) = 0), so
    that among equally good mixtures the one with the least prompt-level variability wins: context
    classes inflate count noise and must only be used where coverage needs them. Without any
    target (no token has a predecessor) all share goes to `fallback_index`. `start` [C] (e.g. the
    shares of a previous fit to nearby coverages): its support warm-starts the first solve, and each
    reweighted solve starts from the previous one's support (see `_nnls`: the same optimum).
    """
    n_cls = cov.shape[1]
    k_ok = [i for i, v in enumerate(target_cov) if v is not None]
    fallback = np.zeros(n_cls)
    fallback[fallback_index] = 1.0
    if not k_ok:
        return fallback
    a = cov[k_ok]
    b = np.array([target_cov[i] for i in k_ok], np.float64)
    big = 100.0
    pen = np.zeros(n_cls) if context_penalty is None else np.asarray(context_penalty, np.float64)
    row_w = np.ones(len(b))
    best_w, best_err = fallback, np.inf
    support = None if start is None else np.asarray(start) > 0
    for _ in range(max(1, minimax_iters)):
        w = _nnls(np.vstack([a * row_w[:, None], np.full((1, n_cls), big), pen[None, :]]),
                  np.concatenate([b * row_w, [big, 0.0]]), support)
        support = w > 0
        if w.sum() <= 0:
            break
        w = w / w.sum()
        resid = np.abs(a @ w - b)
        if resid.max() < best_err - 1e-9:
            best_w, best_err = w, float(resid.max())
        row_w = row_w * np.maximum(resid, 1e-6)
        row_w *= len(row_w) / row_w.sum()
    best_w = np.where(best_w > 1e-6, best_w, 0.0)
    return best_w / best_w.sum()


def count_inflation(rates: np.ndarray, classes: Sequence[tuple[float, float]], weights: np.ndarray,
                    segments: Sequence[int]) -> np.ndarray:
    """Per neuron, Var(token count) / (T pi (1 - pi)) under the class mixture, for chains restarted
    at each prompt of the given lengths m: within a prompt an AR(1) sum has
    g(m, rho) = m (1+rho)/(1-rho) - 2 rho (1 - rho^m)/(1-rho)^2 (m^2 for rho = 1) in place of m,
    and the prompt-level rate adds m^2 Var(lambda) (lambda over the QUAD_Z nodes, capped)."""
    pi = np.clip(np.asarray(rates, np.float64), RATE_FLOOR, RATE_CAP)
    m = np.asarray(segments, np.int64)
    t = float(m.sum())
    m2 = float((m.astype(np.float64) ** 2).sum()) / t
    var_pi = pi * (1.0 - pi)
    out = np.zeros_like(pi)
    for (rho, sigma), w in zip(classes, weights):
        if w <= 0:
            continue
        if rho >= 1.0:
            g = m2
        else:
            g = float((m * (1 + rho) / (1 - rho) - 2 * rho * (1 - rho ** m) / (1 - rho) ** 2).sum()) / t
        lam = prompt_rates(pi[:, None], sigma, QUAD_Z[None, :]) if sigma else pi[:, None]
        within = g * (lam * (1.0 - lam)).mean(axis=1) / var_pi
        between = m2 * lam.var(axis=1) / var_pi
        out += w * (within + between)
    return out


def segment_lengths(prompt_index: np.ndarray, measured: np.ndarray) -> list[int]:
    """Lengths of the maximal runs of measured tokens inside one contiguous prompt."""
    pi = np.asarray(prompt_index)
    cut = np.ones(len(pi), bool)
    cut[1:] = (pi[1:] != pi[:-1]) | ~measured[:-1]
    starts = np.flatnonzero(cut & measured)
    ends = np.concatenate([starts[1:], [len(pi)]])
    return [int(np.count_nonzero(measured[a:b])) for a, b in zip(starts, ends)]


def cycle_segments(lengths: Sequence[int], n_tokens: int) -> list[int]:
    """Repeat prompt lengths until they cover n_tokens (the last one cut short)."""
    out: list[int] = []
    total, i = 0, 0
    while total < n_tokens:
        out.append(min(int(lengths[i % len(lengths)]), n_tokens - total))
        total += out[-1]
        i += 1
    return out


# ---- rate distributions -----------------------------------------------------------------------
def normalize_rates(rates: np.ndarray, mean: float) -> np.ndarray:
    """Scale rates to the given mean, keeping them in [RATE_FLOOR, RATE_CAP]."""
    r = np.clip(np.asarray(rates, np.float64), RATE_FLOOR, None)
    n = len(r)
    target = min(mean, RATE_CAP) * n
    capped = np.zeros(n, bool)
    for _ in range(100):
        free = ~capped
        room = target - RATE_CAP * capped.sum()
        r[free] *= room / r[free].sum()
        new = free & (r > RATE_CAP)
        r[capped | new] = RATE_CAP
        if not new.any():
            break
        capped |= new
    return np.clip(r, RATE_FLOOR, RATE_CAP)


def shrink_rates(p_hat: np.ndarray, n_tokens: int, infl: float | np.ndarray) -> tuple[np.ndarray, float]:
    """Remove sampling noise from empirical rates: shrink toward the mean so that
    var(rates) = var(p_hat) - mean(p_hat (1 - p_hat) infl) / n_tokens. Returns (rates, factor)."""
    mean = float(p_hat.mean())
    var = float(p_hat.var())
    noise = float(np.mean(p_hat * (1.0 - p_hat) * infl)) / n_tokens
    s = math.sqrt(max(0.0, var - noise) / var) if var > 0 else 0.0
    return normalize_rates(mean + s * (p_hat - mean), mean), s


def resample_quantiles(values: np.ndarray, n: int) -> np.ndarray:
    """n values with the same distribution (quantile function, piecewise linear), ascending."""
    v = np.sort(np.asarray(values, np.float64))
    if len(v) == n:
        return v
    return np.interp((np.arange(n) + 0.5) / n, (np.arange(len(v)) + 0.5) / len(v), v)


def power_law_rates(n: int, mean: float, beta: float) -> np.ndarray:
    """Rates proportional to u^-beta over rank fractions u = (rank + 1/2)/n, scaled to the mean
    and capped at RATE_CAP (the mass above the cap goes to the other neurons)."""
    u = (np.arange(n) + 0.5) / n
    return normalize_rates(u ** (-beta), mean)


def expected_hot80(rates: np.ndarray, n_tokens: int, infl: float | np.ndarray, z: np.ndarray) -> float:
    """hot80_fraction that the counts of these chains over n_tokens show (Gaussian sampling noise
    with the given standard normal draws `z`)."""
    sd = np.sqrt(rates * (1.0 - rates) * infl / n_tokens)
    return float(hot_fraction(np.clip(rates + sd * z, 0.0, None)))


def fit_hot_skew(n: int, mean: float, hot80: float, n_tokens: int, infl: float, z: np.ndarray) -> float:
    """beta of `power_law_rates` whose measured hot80_fraction at n_tokens is `hot80`."""
    lo_b, hi_b = 0.0, BETA_MAX
    most = expected_hot80(power_law_rates(n, mean, lo_b), n_tokens, infl, z)
    least = expected_hot80(power_law_rates(n, mean, hi_b), n_tokens, infl, z)
    if hot80 > most + 0.005:
        raise FlashsimError(
            f"--hot-skew {hot80}: with {n_tokens} tokens at active fraction {mean}, sampling noise alone "
            f"gives a hot80_fraction of {most:.3f}; use --hot-skew <= {most:.3f} or more --tokens")
    if hot80 < least - 0.005:
        raise FlashsimError(
            f"--hot-skew {hot80}: at active fraction {mean} at least {least:.3f} of the neurons give 80% "
            f"of the activity (a neuron cannot fire more than every token); use --hot-skew >= {least:.3f}")
    for _ in range(50):
        mid = 0.5 * (lo_b + hi_b)
        if expected_hot80(power_law_rates(n, mean, mid), n_tokens, infl, z) > hot80:
            lo_b = mid
        else:
            hi_b = mid
    return 0.5 * (lo_b + hi_b)


def solve_overlap(rates: np.ndarray, overlap: float, f: float, h: float) -> float:
    """The single persistence rho (sigma = 0) whose expected overlap_prev is `overlap` (bisection;
    rho is clipped per neuron at its floor, so the overlap is monotone in rho)."""
    reps = representative_rates(rates)

    def ov(r: float) -> float:
        return float(class_matrix(rates, 1, [(r, 0.0)], reps)[0][0, 0])

    lo, hi = -1.0, RHO_GRID[-2]
    if not ov(lo) - 1e-9 <= overlap <= ov(hi) + 1e-9:
        raise FlashsimError(
            f"--overlap {overlap}: at --active-fraction {f} and --hot-skew {h} the neuron chains can give "
            f"an overlap between {ov(lo):.3f} and {ov(hi):.3f}; choose --overlap in that range")
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if ov(mid) < overlap else (lo, mid)
    return 0.5 * (lo + hi)
