"""Synthetic traces at any ModelSpec shape, fitted to a real trace or to three parameters.

Generative model ("markov-context-mixture-v1"), per layer; neurons are independent of each other.
    Every FFN neuron n has a base on-rate pi_n and belongs to a class c = (rho, sigma):
      * within a prompt the neuron is a two-state (off/on) Markov chain with on-rate lambda and
        lag-1 autocorrelation rho (its persistence):
            P(on at t | on at t-1)  = p11 = lambda + rho (1 - lambda)
            P(on at t | off at t-1) = p01 = lambda (1 - rho)
        rho = 0 is memoryless, rho < 0 alternates (clipped per neuron so that p01 <= 1, p11 >= 0),
        rho -> 1 holds the state ~1/(1 - rho) tokens, rho = 1 keeps it for the whole prompt;
      * at every prompt start the chain restarts from its stationary state, with a fresh
        prompt-level rate lambda = min(pi * exp(sigma z) / M(sigma), RATE_CAP), z drawn from the 16
        equiprobable standard-normal quantiles QUAD_Z (a discrete normal, so the integrals below
        are exact sums) and M(sigma) the mean of exp(sigma z) over them (E[lambda] = pi before the
        cap): sigma > 0 makes a neuron busier in some prompts than others, the
        context effect that makes coverage rise with k faster than a stationary chain can.
    For a two-state chain (reversible) the expected window coverage is exact:
        coverage_k = E[lambda (1 - (1 - rho)(1 - lambda)(1 - lambda (1 - rho))^(k-1))] / E[lambda]
    (expectation over neurons and prompt rates; evaluated over the 16 z nodes and 512 representative
    rates: the hottest 128 one by one, equal-count bin means of the rest), so overlap_prev =
    coverage_1.

    Fitting to a source trace (--like TRACE), per layer:
      * rates: the source layer's empirical rates (activation counts / T) shrunk toward their mean
        to remove the source's own sampling noise: var(pi) = var(counts/T) - mean(p(1-p) infl)/T,
        with infl the variance inflation of each neuron's count under the fitted classes and the
        source's prompt lengths (AR(1) sums within prompts, plus the prompt-rate variance); then
        resampled by quantiles to the target neuron count (statistics are matched, not neuron
        identities). A synthetic trace as long as its source (same prompt lengths) therefore has
        the source's hot-neuron CDF; a longer one has the underlying rates with less noise.
      * classes: weights over the grid RHO_GRID x SIGMA_GRID fitted to the source's window coverage
        at k = 1..8 by non-negative least squares with weights summing to one (coverage pools
        events, so classes mix by their event shares), minimising the largest error over k
        (Lawson's reweighting), with a small cost per unit sigma (CONTEXT_PENALTY) so context
        classes are used only where coverage needs them. Classes are assigned to neurons at random,
        independently of their rates; pi is rescaled so the mean active fraction after the cap
        equals the source's. Rates, classes and noise are iterated four times.
      * source layer l' = round(l (L_src - 1) / (L - 1)) feeds target layer l; the trace is cut into
        prompts of the source's (measured) prompt lengths, cycled.
    Parameters (--active-fraction F --overlap P --hot-skew H): rates follow a capped power law over
    neuron rank, pi(u) proportional to u^-beta with mean F (u = rank fraction; PowerInfer, Song et
    al. 2023, reports power-law distributed neuron activation frequencies) with beta solved so that
    hot80_fraction measured on the synthetic trace of this length is H (sampling noise included);
    one class (rho, sigma = 0) with rho solved so that the expected overlap_prev is P.
    Tasks (--like, source with >= 2 labelled tasks, same neuron count): see traces/synthetic_tasks.py;
    otherwise (or with --prompt-tokens) every prompt is labelled "synthetic". Every token is decode (id -1).

Magnitudes (on by default): per layer a threshold theta (the synthetic rule is "active <=> |a| >=
theta"); active neurons draw |a| i.i.d. from the source layer's empirical distribution of active
magnitudes (inverse CDF at 65 quantiles, piecewise linear, clipped below at theta; reconstructed
from the stored ranks when the source keeps only the strongest K of larger active sets, see
`_tail_quantiles`); inactive ones follow a power-function law |a| = theta U^(1/a) whose mean
nu * theta matches the source's inactive mass (exact |a| sums minus active magnitudes). The top K per token are stored (inactive ones as exact
order statistics via exponential spacings), and abs_sum adds the expected sum of the unstored rest,
so the activation-mass proxy (mass kept / abs_sum) is meaningful. K = N F_max + 6 sqrt(N F_max
(1 - F_max)) (F_max = the densest layer's active fraction): a token's active set fits in K except
with probability below 1e-8. In parameter mode theta = 1 (|a| in units of the threshold) and the
shape defaults are those measured on a SmolLM2-135M trace (see DEFAULT_ACTIVE_RATIO_QUANTILES).

Determinism: one seed -> SeedSequence -> child streams (fit; masks and magnitudes per layer); the
same inputs and seed give identical files.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from devices.errors import FlashsimError
from devices.model_spec import ModelSpec
from traces.format import DECODE, PromptInfo, SparsityRule, Trace, TraceWriter, check_trace_size
from traces.outputs import check_output_dir
from traces.stats import (
    HOT_CDF_GRID,
    count_packed,
    hot_fraction,
    measured_tokens,
    summarize_counts,
    tokens_before_in_prompt,
    trace_stats,
)
from traces.synthetic_tasks import TaskFit, apply_tasks, source_tasks, task_summary, token_task_ids

GENERATOR = "markov-context-mixture-v1"
FIT_WINDOWS = 8               # coverage k = 1..8 is fitted and checked
TOLERANCE = 0.03              # the absolute agreement the tests check
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
# Tokens generated at a time: ~TOKEN_BLOCK * N * 5 bytes of scratch, kept under glibc's mmap
# threshold (32 MiB) for 7B shapes so blocks reuse heap memory instead of page-faulting afresh.
TOKEN_BLOCK = 256
TOP_K_SIGMAS = 6.0
BETA_MAX = 8.0                # power-law exponent range of --hot-skew: 8 saturates the hottest at the cap
MAG_PROBS = np.linspace(0.0, 1.0, 65)
# Parameter-mode magnitude shape: active |a| / theta at MAG_PROBS (median over the 30 layers) and
# the inactive mean ratio nu, measured with `fit_magnitudes` on a SmolLM2-135M capture of the builtin
# prompts (32 new tokens each, 1787 tokens) re-thresholded to threshold:0.1. The long top end is
# real: SwiGLU FFNs have a few "massive" activations tens of times the threshold.
DEFAULT_ACTIVE_RATIO_QUANTILES = (
    1, 1.009, 1.017, 1.026, 1.036, 1.045, 1.055, 1.064, 1.074, 1.085, 1.096, 1.107, 1.118, 1.13,
    1.142, 1.154, 1.166, 1.179, 1.192, 1.206, 1.219, 1.234, 1.248, 1.262, 1.279, 1.296, 1.314,
    1.33, 1.35, 1.37, 1.391, 1.412, 1.435, 1.458, 1.484, 1.509, 1.536, 1.566, 1.595, 1.626, 1.66,
    1.697, 1.734, 1.775, 1.82, 1.866, 1.918, 1.973, 2.031, 2.096, 2.163, 2.242, 2.324, 2.41,
    2.514, 2.626, 2.757, 2.912, 3.09, 3.307, 3.598, 4.007, 4.626, 5.788, 45.77,
)
DEFAULT_INACTIVE_MEAN_RATIO = 0.272


# ---- the chain's closed forms -----------------------------------------------------------------
def rho_floor(rates: np.ndarray) -> np.ndarray:
    """The most negative persistence a chain with these rates can have (p11 >= 0 and p01 <= 1)."""
    pi = np.clip(np.asarray(rates, np.float64), RATE_FLOOR, RATE_CAP)
    return -np.minimum(pi / (1.0 - pi), (1.0 - pi) / pi)


def transition_probs(rates: np.ndarray, rho: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(p01, p11) of each neuron's chain: P(on | was off), P(on | was on); rho clipped at its floor."""
    r = np.maximum(rho, rho_floor(rates))
    return rates * (1.0 - r), rates + r * (1.0 - rates)


def prompt_rates(rates: np.ndarray, sigma: np.ndarray | float, z: np.ndarray | float) -> np.ndarray:
    """Prompt-level rates lambda = min(pi exp(sigma z) / M(sigma), RATE_CAP) for z among the QUAD_Z
    nodes, M(sigma) = mean over the nodes of exp(sigma z), so E[lambda] = pi before the cap."""
    sigma = np.asarray(sigma, np.float64)
    norm = np.exp(sigma[..., None] * QUAD_Z).mean(axis=-1)
    return np.clip(rates * np.exp(sigma * z) / norm, RATE_FLOOR, RATE_CAP)


def representative_rates(rates: np.ndarray, n_reps: int = FIT_RATES) -> tuple[np.ndarray, np.ndarray]:
    """(values, neuron counts) standing for a rate distribution in the coverage integrals: all
    rates when there are at most n_reps, else the n_reps/4 hottest one by one (they carry the most
    events) and equal-count bin means of the rest."""
    pi = np.sort(np.asarray(rates, np.float64))[::-1]
    if len(pi) <= n_reps:
        return pi, np.ones(len(pi))
    top = n_reps // 4
    edges = np.linspace(0, len(pi) - top, n_reps - top + 1).astype(np.int64)
    counts = np.diff(edges).astype(np.float64)
    means = np.add.reduceat(pi[top:], edges[:-1]) / counts
    return np.concatenate([pi[:top], means]), np.concatenate([np.ones(top), counts])


def class_matrix(rates: np.ndarray, max_k: int,
                 classes: Sequence[tuple[float, float]] = CLASSES) -> tuple[np.ndarray, np.ndarray]:
    """Expected coverage [max_k, C] at k = 1..max_k if every neuron were in class c, and the mean
    rate ratio [C] E[lambda] / E[pi] (below 1 where the cap bites)."""
    pi, count = representative_rates(rates)
    cov = np.empty((max_k, len(classes)))
    ratio = np.empty(len(classes))
    table = np.asarray(classes, np.float64).reshape(-1, 2)
    for sigma in np.unique(table[:, 1]):
        idx = np.flatnonzero(table[:, 1] == sigma)
        lam = prompt_rates(pi[:, None], sigma, QUAD_Z[None, :]) if sigma else pi[:, None]
        weight = (count[:, None] * lam).ravel()           # events: neurons x rate
        lam = lam.ravel()
        total = weight.sum()
        r = np.maximum(table[idx, 0][:, None], rho_floor(lam)[None, :])
        first = (1.0 - r) * (1.0 - lam)                  # P(off at t-1 | on at t)
        stay_off = 1.0 - lam * (1.0 - r)
        miss = first * weight
        for k in range(1, max_k + 1):
            cov[k - 1, idx] = 1.0 - miss.sum(axis=1) / total
            miss *= stay_off
        ratio[idx] = total / len(QUAD_Z if sigma else [0]) / float((count * pi).sum())
    return cov, ratio


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Lawson-Hanson non-negative least squares: argmin ||a x - b|| subject to x >= 0."""
    n = a.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, bool)
    tol = 1e-12 * max(1.0, float(np.abs(a).max()))
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
                context_penalty: np.ndarray | None = None, fallback_index: int = 0) -> np.ndarray:
    """Class shares [C] whose mixture of coverages best matches `target_cov` (k = 1..; None = skip).

    The agreement that matters is the worst k (the tolerance is absolute per k), so the shares
    minimise the largest error: Lawson's iteratively reweighted non-negative least squares (each
    k reweighted by its residual), keeping the best iterate. Shares sum to one (a stiff extra row).
    `context_penalty` [C] adds a small cost per unit share (a row asking sum(penalty * v) = 0), so
    that among equally good mixtures the one with the least prompt-level variability wins: context
    classes inflate count noise and must only be used where coverage needs them. Without any
    target (no token has a predecessor) all share goes to `fallback_index`.
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
    for _ in range(max(1, minimax_iters)):
        w = _nnls(np.vstack([a * row_w[:, None], np.full((1, n_cls), big), pen[None, :]]),
                  np.concatenate([b * row_w, [big, 0.0]]))
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
    def ov(r: float) -> float:
        return float(class_matrix(rates, 1, [(r, 0.0)])[0][0, 0])

    lo, hi = -1.0, RHO_GRID[-2]
    if not ov(lo) - 1e-9 <= overlap <= ov(hi) + 1e-9:
        raise FlashsimError(
            f"--overlap {overlap}: at --active-fraction {f} and --hot-skew {h} the neuron chains can give "
            f"an overlap between {ov(lo):.3f} and {ov(hi):.3f}; choose --overlap in that range")
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if ov(mid) < overlap else (lo, mid)
    return 0.5 * (lo + hi)


# ---- magnitudes -------------------------------------------------------------------------------
@dataclass(frozen=True)
class MagnitudeModel:
    """|a| of one layer: active ~ quantiles; inactive = theta * U^(1/a), mean nu * theta.

    shape: "source" when the quantiles are the source's own active magnitudes; "tail" when the
    source stores only the strongest K of larger active sets (see `_tail_quantiles`); "default"
    for DEFAULT_ACTIVE_RATIO_QUANTILES scaled by theta (parameter mode)."""

    threshold: float
    active_quantiles: tuple[float, ...]       # |a| at MAG_PROBS
    inactive_mean_ratio: float                # nu
    shape: str = "default"

    def to_json(self) -> dict[str, Any]:
        return {"threshold": self.threshold, "inactive_mean_ratio": round(self.inactive_mean_ratio, 6),
                "shape": self.shape, "active_quantiles": [round(q, 6) for q in self.active_quantiles]}


def default_magnitudes(theta: float = 1.0, nu: float = DEFAULT_INACTIVE_MEAN_RATIO) -> MagnitudeModel:
    return MagnitudeModel(theta, tuple(theta * q for q in DEFAULT_ACTIVE_RATIO_QUANTILES), nu, "default")


def fit_magnitudes(trace: Trace, layer: int, measured: np.ndarray, max_rows: int = 512) -> MagnitudeModel | None:
    """The magnitude model of one source layer, from up to `max_rows` evenly spaced measured tokens
    (None when the trace stores no magnitudes or the layer never fires).

    If most tokens have more active neurons than the K stored, the stored ones are only the top of
    the active distribution: `_tail_quantiles` reconstructs the rest. Otherwise nu comes from the
    exact |a| sums minus the active mass."""
    if trace.top_k == 0:
        return None
    rows = np.flatnonzero(measured)
    rows = rows[np.linspace(0, len(rows) - 1, min(max_rows, len(rows))).astype(np.int64)]
    idx = np.asarray(trace.top(layer)[0][rows]).astype(np.int64)
    mag = np.asarray(trace.top(layer)[1][rows], np.float64)
    packed = np.asarray(trace.packed_masks(layer)[rows])
    on = ((np.take_along_axis(packed, idx >> 3, axis=1) >> (idx & 7).astype(np.uint8)) & 1).astype(bool)
    counts = np.bitwise_count(packed).sum(axis=1, dtype=np.int64)
    if not on.any():
        return None
    rule = trace.manifest.sparsity
    known = rule.thresholds is not None and len(rule.thresholds) == trace.n_layers
    mins = np.where(on, mag, np.inf).min(axis=1)
    total_mass = float(np.asarray(trace.abs_sum(layer)[rows], np.float64).sum())
    n_inactive = int(len(rows) * trace.n_neurons - counts.sum())
    if np.mean(on.sum(axis=1) == counts) < 0.5:            # only the top of each active set
        quant, theta, nu = _tail_quantiles(mag, on, counts, trace.n_neurons, total_mass,
                                           float(rule.thresholds[layer]) if known else None)
        return MagnitudeModel(theta, quant, float(np.clip(nu, 0.0, 0.999)), "tail")
    active = mag[on]                                         # active sets stored: the source's shape
    theta = float(rule.thresholds[layer]) if known else float(np.median(mins[np.isfinite(mins)]))
    quant = tuple(float(q) for q in np.quantile(active, MAG_PROBS))
    nu = (total_mass - float(active.sum())) / n_inactive / theta if n_inactive > 0 and theta > 0 else 0.0
    return MagnitudeModel(theta, quant, float(np.clip(nu, 0.0, 0.999)), "source")


def _tail_quantiles(mag: np.ndarray, on: np.ndarray, counts: np.ndarray, n_neurons: int, total_mass: float,
                    theta: float | None) -> tuple[tuple[float, ...], float, float]:
    """(quantiles, theta, nu) of active |a| when each token stores only its K strongest actives.

    The j-th strongest of c actives sits at quantile level 1 - (j + 1/2)/c; above the level the
    stored values reach (p_known = 1 - K/c, median over tokens) each quantile is the median over
    tokens of the value at that rank. Below it the excess over theta follows a generalised Pareto
    quantile, q(p) = theta + (q_low - theta) g(p)/g(p_known), g(p) = (1 - p)^(-1/alpha) - 1
    (alpha -> infinity: exponential, the Laplace-like shape of FFN intermediate activations, TEAL,
    Liu et al. 2024; small alpha: heavier tails). The inactive mean ratio nu is that of a Laplace
    |a| cut at the active fraction F (E[|a| | |a| < theta] / theta with theta = b ln(1/F)), and
    alpha is solved so that active + inactive |a| add up to the exact sums the trace records (what
    even the exponential body cannot carry goes to the top quantile: SwiGLU's rare massive
    activations). theta is the recorded threshold or, without one, extrapolated with the default shape."""
    ok = counts > 0
    c = counts[ok].astype(np.float64)
    vals = np.sort(np.where(on[ok], mag[ok], -1.0), axis=1)[:, ::-1]    # stored actives first
    stored = (vals > 0).sum(axis=1)
    p_known = float(np.median(1.0 - np.minimum(stored / c, 1.0)))
    top = MAG_PROBS >= p_known
    quant = np.zeros(len(MAG_PROBS))
    for i in np.flatnonzero(top):
        j = np.minimum(np.floor((1.0 - MAG_PROBS[i]) * c).astype(np.int64), c.astype(np.int64) - 1)
        good = j < stored
        quant[i] = float(np.median(vals[good, j[good]])) if good.any() else 0.0
    quant[top] = np.maximum.accumulate(quant[top])
    q_low = float(quant[top][0])
    if theta is None:
        theta = q_low / float(np.interp(p_known, MAG_PROBS, DEFAULT_ACTIVE_RATIO_QUANTILES))
    theta = min(theta, q_low)
    f = float(np.clip(counts.sum() / (len(counts) * n_neurons), 1e-6, 1 - 1e-6))
    x = -math.log(f)                                         # theta / b for |a| ~ Exponential(b)
    nu = (1.0 - math.exp(-x) * (1.0 + x)) / (1.0 - math.exp(-x)) / x
    want_mean = (total_mass - nu * theta * (len(counts) * n_neurons - counts.sum())) / counts.sum()
    below = ~top

    def body(alpha: float) -> np.ndarray:
        g = np.expm1(-np.log1p(-MAG_PROBS[below]) / alpha)
        return theta + (q_low - theta) * g / math.expm1(-math.log1p(-p_known) / alpha)

    lo, hi = math.log(0.3), math.log(1e4)                   # heavier tail <-> smaller mean
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        quant[below] = body(math.exp(mid))
        lo, hi = (mid, hi) if np.trapezoid(quant, MAG_PROBS) < want_mean else (lo, mid)
    quant[below] = body(math.exp(0.5 * (lo + hi)))
    deficit = want_mean - float(np.trapezoid(quant, MAG_PROBS))
    if deficit > 0:             # mass no body shape carries: rare massive activations at the top end
        quant[-1] += 2.0 * deficit / (MAG_PROBS[-1] - MAG_PROBS[-2])
    return tuple(float(q) for q in quant), float(theta), float(nu)


def top_k_for(n_neurons: int, max_fraction: float) -> int:
    """Stored magnitudes per token: the mean active count of the densest layer plus 6 sigma."""
    mean = n_neurons * max_fraction
    return min(n_neurons, math.ceil(mean + TOP_K_SIGMAS * math.sqrt(mean * (1.0 - max_fraction))) + 1)


_U_BITS = 39                 # random sort keys: 39 bits of uniform draw above 24 bits of neuron index
_IDX_BITS = 24               # neuron indices < 2^24 (16.7M neurons per layer)


def _lookup(u: np.ndarray, quantiles: Sequence[float]) -> np.ndarray:
    """Inverse CDF on the uniform MAG_PROBS grid, piecewise linear (np.interp, but O(1) per value)."""
    q = np.asarray(quantiles, np.float64)
    x = u * (len(q) - 1)
    i = np.minimum(x.astype(np.int64), len(q) - 2)
    return q[i] + (x - i) * (q[i + 1] - q[i])


def draw_magnitudes(active: np.ndarray, model: MagnitudeModel, k: int, rng: np.random.Generator,
                    log_weight: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Top-k (indices, |a| float16, descending) and abs_sum (float32) for one block bool [B, N].

    Active |a| are i.i.d. from the model's quantiles, clipped below at the threshold (the synthetic
    trace's rule is "active <=> |a| >= theta"); each row stores its strongest actives, then the top
    order statistics of its inactive |a| (all below theta). Rows are ordered with integer sort keys
    (uniform draw, then neuron index) so the order is exact and platform-independent.
    With log_weight (float [N], traces/synthetic_tasks.py) a row's magnitudes (the same i.i.d.
    multiset) go to its active neurons in a Plackett-Luce order with weights exp(log_weight) (sorted
    by log_weight + Gumbel noise): neurons that carry the source's strongest activations get the
    largest draws more often, while every token's magnitude distribution is unchanged.
    """
    b, n = active.shape
    if n >= 1 << _IDX_BITS:
        raise FlashsimError(f"synthetic magnitudes support at most {1 << _IDX_BITS} neurons per layer")
    counts = active.sum(axis=1)
    flat = np.flatnonzero(active)
    rows = flat // n
    cols = flat - rows * n
    u_key = rng.integers(0, 1 << _U_BITS, len(flat))
    quant = np.maximum(np.asarray(model.active_quantiles), model.threshold)
    c_max = int(counts.max()) if b else 0
    keys = np.full((b, max(c_max, 1)), -1, np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    keys[rows, np.arange(len(flat)) - starts[rows]] = (u_key << _IDX_BITS) | cols
    keys = np.sort(keys, axis=1)[:, ::-1][:, :k]                 # strongest first, padding (-1) last
    n_act = np.minimum(counts, k)
    act_idx = keys & ((1 << _IDX_BITS) - 1)
    act_mag = _lookup((keys >> _IDX_BITS) / float(1 << _U_BITS), quant)
    if log_weight is not None and len(flat):
        race = log_weight[cols] + rng.gumbel(size=len(flat))        # Plackett-Luce via Gumbel-max
        r_int = np.clip(np.floor((race + 256.0) * (1 << 30)), 0, (1 << _U_BITS) - 1).astype(np.int64)
        rkeys = np.full((b, max(c_max, 1)), -1, np.int64)
        rkeys[rows, np.arange(len(flat)) - starts[rows]] = (r_int << _IDX_BITS) | cols
        act_idx = np.sort(rkeys, axis=1)[:, ::-1][:, :k] & ((1 << _IDX_BITS) - 1)
    n_off = n - counts
    m = np.minimum(k - n_act, n_off)                              # inactive entries stored per row
    m_max = int(m.max()) if b else 0
    theta, nu = model.threshold, model.inactive_mean_ratio
    rest = np.zeros(b)
    col = np.arange(k)[None, :]
    is_act = col < n_act[:, None]
    top_idx = np.zeros((b, k), np.int64)
    top_mag = np.zeros((b, k))
    w = act_idx.shape[1]
    top_idx[:, :w] = np.where(is_act[:, :w], act_idx, 0)
    top_mag[:, :w] = np.where(is_act[:, :w], act_mag, 0.0)
    act_sum = top_mag.sum(axis=1)
    over = np.flatnonzero(counts > k)          # rare: actives beyond the stored K still count in abs_sum
    if len(over):
        sel = np.isin(rows, over)
        act_sum += np.bincount(rows[sel], weights=_lookup(u_key[sel] / float(1 << _U_BITS), quant),
                               minlength=b) - np.where(counts > k, top_mag.sum(axis=1), 0.0)
    if m_max > 0:
        inact_idx = _pick_inactive(active, m, rng)
        gam = np.cumsum(rng.standard_exponential((b, m_max)), axis=1)
        last = np.where(m > 0, gam[np.arange(b), np.maximum(m, 1) - 1], 0.0)
        total = last + rng.gamma(n_off - m + 1.0)
        u_top = np.clip(1.0 - gam / total[:, None], 0.0, 1.0)     # top order statistics of U(0,1)
        if nu > 1e-9:
            a = nu / (1.0 - nu)                                   # power-function law: mean nu
            v = theta * u_top ** (1.0 / a)
            v_last = np.where(m > 0, v[np.arange(b), np.maximum(m, 1) - 1], theta)
            rest = (n_off - m) * v_last * a / (a + 1.0)           # expected sum of the unstored rest
        else:
            v = np.zeros_like(u_top)
        j = np.clip(col - n_act[:, None], 0, m_max - 1)
        is_in = ~is_act & (col < (n_act + m)[:, None])
        top_idx = np.where(is_in, np.take_along_axis(inact_idx, j, axis=1), top_idx)
        top_mag = np.where(is_in, np.take_along_axis(v, j, axis=1), top_mag)
        rest += np.where(np.arange(m_max)[None, :] < m[:, None], v, 0.0).sum(axis=1)
    return top_idx, top_mag.astype(np.float16), (act_sum + rest).astype(np.float32)


def _pick_inactive(active: np.ndarray, m: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """int64 [B, max(m)]: m[r] distinct inactive neurons per row, uniformly at random."""
    b, n = active.shape
    m_max = int(m.max())
    off_share = max(0.02, 1.0 - active.sum(axis=1).max() / n)
    n_cand = min(8 * n, int(1.5 * (m_max + 16) / off_share) + 16)
    cand = rng.integers(0, n, (b, n_cand))
    ok = ~np.take_along_axis(active, cand, axis=1)
    # duplicates: sort unique keys (value, column); every copy after the first column is dropped
    keys = np.sort(cand * n_cand + np.arange(n_cand), axis=1)
    vals, where = np.divmod(keys, n_cand)
    dup_sorted = np.zeros((b, n_cand), bool)
    dup_sorted[:, 1:] = vals[:, 1:] == vals[:, :-1]
    dup = np.zeros_like(dup_sorted)
    np.put_along_axis(dup, where, dup_sorted, axis=1)
    ok &= ~dup
    rank = np.cumsum(ok, axis=1)
    take = ok & (rank <= m[:, None])
    out = np.zeros((b, m_max), np.int64)
    r_i, c_i = np.nonzero(take)
    out[r_i, rank[r_i, c_i] - 1] = cand[r_i, c_i]
    for r in np.flatnonzero(rank[:, -1] < m):                     # rare: nearly dense rows
        out[r, : m[r]] = rng.choice(np.flatnonzero(~active[r]), m[r], replace=False)
    return out


# ---- plans ------------------------------------------------------------------------------------
@dataclass
class LayerPlan:
    """Everything needed to generate one layer, and what it was fitted to."""

    rates: np.ndarray                     # float64 [N] base on-rate per neuron
    rho: np.ndarray                       # float64 [N] persistence per neuron
    sigma: np.ndarray                     # float64 [N] context variability per neuron
    classes: list[tuple[float, float, float]]   # (rho, sigma, weight)
    target: dict[str, Any]
    predicted: dict[str, Any]
    magnitude: MagnitudeModel | None = None
    source_layer: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    task_z: np.ndarray | None = None      # float64 [n_tasks, N] fitted z per task (synthetic_tasks)
    task_scale: np.ndarray | None = None  # float64 [n_tasks] rate scale per task
    log_weight: np.ndarray | None = None  # float64 [N] magnitude order weights (synthetic_tasks)

    def to_json(self) -> dict[str, Any]:
        return {"source_layer": self.source_layer,
                "classes": [[round(r, 4), round(s, 4), round(w, 6)] for r, s, w in self.classes],
                "target": self.target, "predicted": self.predicted,
                "magnitude": None if self.magnitude is None else self.magnitude.to_json(), **self.extra}


def assign_classes(rates: np.ndarray, classes: Sequence[tuple[float, float]], weights: np.ndarray,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Shuffle rates over neurons; give each class round(w N) neurons (largest remainder) at random,
    independently of their rates. Returns (rates, rho, sigma) per neuron."""
    n = len(rates)
    exact = np.asarray(weights) * n
    cnt = np.floor(exact).astype(np.int64)
    cnt[np.argsort(-(exact - cnt), kind="stable")[: n - cnt.sum()]] += 1
    cls = rng.permutation(np.repeat(np.arange(len(classes)), cnt))
    table = np.asarray(classes, np.float64).reshape(-1, 2)
    return rng.permutation(rates), table[cls, 0], table[cls, 1]


def _rounded(x: Any) -> Any:
    if isinstance(x, float):
        return round(x, 6)
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    return x


def _cov_dict(values: Sequence[float | None]) -> dict[str, float | None]:
    return {str(k): (None if v is None else float(v)) for k, v in enumerate(values, 1)}


def plan_like(source: Trace, spec: ModelSpec, rng: np.random.Generator, phase: str = "all",
              magnitudes: bool = True) -> list[LayerPlan]:
    """One plan per target layer, fitted to the matching source layer (see the module docstring)."""
    st = trace_stats(source, phase=phase, max_window=FIT_WINDOWS)
    measured = measured_tokens(source.phase, phase)
    segments = segment_lengths(source.prompt_index, measured)
    l_src, n = source.n_layers, spec.d_ff
    plans = []
    cache: dict[int, tuple] = {}
    for layer in range(spec.n_layers):
        sl = round(layer * (l_src - 1) / (spec.n_layers - 1)) if spec.n_layers > 1 else 0
        if sl not in cache:
            lc, pl = st.layer_counts[sl], st.per_layer[sl]
            fit = _fit_layer(lc.neuron_counts / lc.n_tokens, lc.n_tokens, pl, segments, n)
            mag = (fit_magnitudes(source, sl, measured) or default_magnitudes()) if magnitudes else None
            cache[sl] = (*fit, mag)
        rates, weights, target, predicted, shrink, mag = cache[sl]
        r, rho, sigma = assign_classes(rates, CLASSES, weights, rng)
        used = [(c[0], c[1], float(w)) for c, w in zip(CLASSES, weights) if w > 0]
        plans.append(LayerPlan(r, rho, sigma, used, _rounded(target), _rounded(predicted), mag, sl,
                               {"rate_shrink": round(shrink, 6)}))
    return plans


def _fit_layer(p_hat: np.ndarray, t_src: int, pl: dict[str, Any], segments: list[int], n: int) -> tuple:
    """(rates ascending [n], class weights, target, predicted, shrink) for one source layer."""
    f = float(p_hat.mean())
    target_cov = [pl["window_coverage"][str(k)] for k in range(1, FIT_WINDOWS + 1)]
    infl: float | np.ndarray = 1.0
    scale = 1.0
    for it in range(4):                  # rates, classes and noise depend on each other
        src_rates, shrink = shrink_rates(p_hat, t_src, infl)
        rates = normalize_rates(resample_quantiles(src_rates, n), f * scale)
        cov, ratio = class_matrix(rates, FIT_WINDOWS)
        # Coverage pools events, so classes mix by their share of events v_c = w_c ratio_c / sum:
        # linear in v. The neuron shares follow as w_c = v_c / ratio_c, normalised.
        shares = fit_classes(cov, target_cov, minimax_iters=1 if it < 2 else 15, context_penalty=CONTEXT_PENALTY,
                             fallback_index=CLASSES.index((0.0, 0.0)))
        weights = shares / ratio
        weights /= weights.sum()
        mean_rate = float(weights @ ratio) * float(rates.mean())
        scale *= f / max(mean_rate, RATE_FLOOR)          # undo the cap's loss of activity
        infl = count_inflation(p_hat, CLASSES, weights, segments)
    pred = cov @ shares
    target = {"active_fraction": pl["active_fraction"], "overlap_prev": pl["overlap_prev"],
              "window_coverage": _cov_dict(target_cov), "hot80_fraction": pl["hot80_fraction"],
              "hot_cdf": pl["hot_cdf"]}
    predicted = {"active_fraction": mean_rate, "overlap_prev": float(pred[0]), "window_coverage": _cov_dict(pred)}
    return rates, weights, target, predicted, shrink


def plan_params(spec: ModelSpec, n_tokens: int, active_fraction: float, overlap: float, hot_skew: float,
                rng: np.random.Generator, magnitudes: bool = True,
                segments: Sequence[int] | None = None) -> list[LayerPlan]:
    """The same plan for every layer from (F, P, H); see the module docstring."""
    f, p, h = active_fraction, overlap, hot_skew
    if not 0 < f < 1:
        raise FlashsimError(f"--active-fraction {f}: must be in (0, 1)")
    if not 0 <= p < 1:
        raise FlashsimError(f"--overlap {p}: must be in [0, 1)")
    if not 0 < h <= 0.8:
        raise FlashsimError(f"--hot-skew {h}: the fraction of neurons giving 80% of activity must be in (0, 0.8]")
    n = spec.d_ff
    segments = list(segments or [n_tokens])
    z = rng.standard_normal(n)
    infl, rho = 1.0, 0.0
    for _ in range(3):
        beta = fit_hot_skew(n, f, h, n_tokens, infl, z)
        rates = power_law_rates(n, f, beta)
        rho = solve_overlap(rates, p, f, h)
        infl = float(count_inflation(np.array([f]), [(rho, 0.0)], np.array([1.0]), segments)[0])
    cov, _ = class_matrix(rates, FIT_WINDOWS, [(rho, 0.0)])
    target = {"active_fraction": f, "overlap_prev": p, "hot80_fraction": h}
    predicted = {"active_fraction": float(rates.mean()), "overlap_prev": float(cov[0, 0]),
                 "window_coverage": _cov_dict(cov[:, 0]),
                 "hot80_fraction": expected_hot80(rates, n_tokens, infl, z)}
    mag = default_magnitudes() if magnitudes else None
    plans = []
    for _ in range(spec.n_layers):
        r, rr, ss = assign_classes(rates, [(rho, 0.0)], np.array([1.0]), rng)
        plans.append(LayerPlan(r, rr, ss, [(rho, 0.0, 1.0)], _rounded(target), _rounded(predicted), mag,
                               extra={"power_law_beta": round(beta, 6)}))
    return plans


# ---- generation -------------------------------------------------------------------------------
def generate_layer(plan: LayerPlan, restart: np.ndarray, rng: np.random.Generator,
                   block: int = TOKEN_BLOCK, task_of_token: np.ndarray | None = None):
    """Yield (t0, bool [b, N]) blocks of one layer. At restart[t] (a prompt start) each neuron gets
    a fresh prompt rate and a stationary state; otherwise it follows its chain from token t-1.
    With task_of_token (int per token, -1 = none) and plan.task_z, a prompt of a fitted task takes
    that task's z per neuron and rate scale instead of random z (see traces/synthetic_tasks.py)."""
    n_tokens, n = len(restart), len(plan.rates)
    has_ctx = bool(np.any(plan.sigma > 0))
    prev = None
    lam = p01 = p11 = None
    for t0 in range(0, n_tokens, block):
        b = min(block, n_tokens - t0)
        u = rng.random((b, n), dtype=np.float32)
        x = np.empty(u.shape, bool)
        for t in range(b):
            if restart[t0 + t]:
                task = -1 if task_of_token is None or plan.task_z is None else int(task_of_token[t0 + t])
                if task >= 0:
                    assert plan.task_scale is not None
                    lam64 = prompt_rates(plan.rates * plan.task_scale[task], plan.sigma, plan.task_z[task])
                else:
                    z = QUAD_Z[rng.integers(0, len(QUAD_Z), n)] if has_ctx else 0.0
                    lam64 = prompt_rates(plan.rates, plan.sigma, z)
                q01, q11 = transition_probs(lam64, plan.rho)
                lam, p01, p11 = (a.astype(np.float32) for a in (lam64, q01, q11))
                np.less(u[t], lam, out=x[t])
            else:
                np.less(u[t], np.where(x[t - 1] if t else prev, p11, p01), out=x[t])
        prev = x[-1].copy()
        yield t0, x


def synthesize(out: str | Path, spec: ModelSpec, n_tokens: int, seed: int, *, like: Trace | None = None,
               like_phase: str = "all", active_fraction: float | None = None, overlap: float | None = None,
               hot_skew: float | None = None, magnitudes: bool = True, prompt_tokens: int | None = None,
               overwrite: bool = False, provenance: dict | None = None) -> Path:
    """Fit, generate and write a synthetic trace atomically; returns its path.

    The trace is cut into prompts (chains restart at each): of `prompt_tokens` each if given, else
    the source's prompt lengths (cycled) with `like`, else one prompt."""
    if n_tokens < 2:
        raise FlashsimError(f"--tokens {n_tokens}: a synthetic trace needs at least 2 tokens")
    check_trace_size(spec, n_tokens, spec.d_ff if magnitudes else 0)   # before any array is built
    check_output_dir(out, "--out", overwrite)
    if prompt_tokens is not None and prompt_tokens < 1:
        raise FlashsimError(f"--prompt-tokens {prompt_tokens}: must be >= 1")
    if prompt_tokens is not None:
        segments = cycle_segments([prompt_tokens], n_tokens)
    elif like is not None:
        segments = cycle_segments(segment_lengths(like.prompt_index, measured_tokens(like.phase, like_phase)),
                                  n_tokens)
    else:
        segments = [n_tokens]
    fit_ss, mask_ss, mag_ss, task_ss = np.random.SeedSequence(seed).spawn(4)
    task_fit: TaskFit | None = None
    fit_rng = np.random.default_rng(fit_ss)
    if like is not None:
        if like.n_tokens < 2:
            raise FlashsimError(f"--like {like.path}: the source trace needs at least 2 tokens")
        plans = plan_like(like, spec, fit_rng, phase=like_phase, magnitudes=magnitudes)
        like_measured = measured_tokens(like.phase, like_phase)
        task_fit = source_tasks(like, like_measured, spec.d_ff)
        if task_fit.active:
            apply_tasks(plans, like, like_measured, task_fit, np.random.default_rng(task_ss))
        params: dict[str, Any] = {"mode": "like", "source": {
            "path": str(like.path), "model": like.spec.name, "n_tokens": like.n_tokens,
            "n_layers": like.n_layers, "n_neurons": like.n_neurons, "phase": like_phase,
            "synthetic": like.is_synthetic}}
    else:
        if active_fraction is None or overlap is None or hot_skew is None:
            raise FlashsimError("trace synth: give --like TRACE, or all of --active-fraction, --overlap and --hot-skew")
        plans = plan_params(spec, n_tokens, active_fraction, overlap, hot_skew, fit_rng, magnitudes, segments)
        params = {"mode": "parameters", "active_fraction": active_fraction, "overlap": overlap,
                  "hot_skew": hot_skew}
    f_max = max(float(p.predicted["active_fraction"]) for p in plans)
    k = top_k_for(spec.d_ff, f_max) if magnitudes else 0
    mean_f = float(np.mean([p.predicted["active_fraction"] for p in plans]))
    labels = (["synthetic"] * len(segments) if task_fit is None or prompt_tokens is not None else
              [task_fit.segment_tasks[i % len(task_fit.segment_tasks)] for i in range(len(segments))])
    prompts = [PromptInfo(id=f"synthetic-{i}", task=t, n_prompt_tokens=0, n_generated_tokens=m)
               for i, (t, m) in enumerate(zip(labels, segments))]
    prompt_index = np.repeat(np.arange(len(segments), dtype=np.int32), segments)
    tasked = task_fit is not None and task_fit.active and prompt_tokens is None
    task_ids = token_task_ids(task_fit.segment_tasks, segments, task_fit.tasks) if tasked else None
    n_before = tokens_before_in_prompt(prompt_index)
    restart = n_before == 0
    measured = np.ones(n_tokens, bool)
    layer_ss, mlayer_ss = mask_ss.spawn(spec.n_layers), mag_ss.spawn(spec.n_layers)
    rule = SparsityRule(rule="synthetic", target_fraction=min(1.0, max(mean_f, 1e-9)))
    with TraceWriter(out, spec, n_tokens, k, rule, prompts, provenance=provenance, overwrite=overwrite) as w:
        w.token_ids[:] = -1
        w.phase[:] = DECODE
        w.prompt_index[:] = prompt_index
        counts = []
        for layer, plan in enumerate(plans):
            rng = np.random.default_rng(layer_ss[layer])
            mrng = np.random.default_rng(mlayer_ss[layer])
            for t0, x in generate_layer(plan, restart, rng, task_of_token=task_ids):
                t1 = t0 + len(x)
                w.masks[layer, t0:t1] = np.packbits(x, axis=1, bitorder="little")
                if k:
                    assert plan.magnitude is not None
                    w.top_idx[layer, t0:t1], w.top_mag[layer, t0:t1], w.abs_sum[layer, t0:t1] = \
                        draw_magnitudes(x, plan.magnitude, k, mrng, plan.log_weight)
                else:
                    w.abs_sum[layer, t0:t1] = x.sum(axis=1)
            counts.append(count_packed(w.masks[layer], spec.d_ff, measured, n_before, None, FIT_WINDOWS))
        overall, per_layer = summarize_counts(counts)
        keep = ("active_fraction", "overlap_prev", "window_coverage", "hot80_fraction", "hot_cdf")
        w.synthetic = {
            "generator": GENERATOR, "seed": seed, **params,
            "prompt_lengths": segments if len(segments) <= 1000 else segments[:1000] + ["..."],
            "top_k_rule": "N*F_max + 6*sqrt(N*F_max*(1-F_max))" if k else "no magnitudes",
            "hot_cdf_grid": list(HOT_CDF_GRID),
            "achieved": _rounded({kk: overall[kk] for kk in keep}),
            "layers": [{**p.to_json(), "achieved": _rounded({kk: pl[kk] for kk in keep})}
                       for p, pl in zip(plans, per_layer)],
        }
        if task_fit is not None:
            w.synthetic["tasks"] = task_summary(task_fit, tasked, w, spec, like, plans, prompt_index,
                                                labels, str(out))
    return Path(out)


def cdf_distance(a: Sequence[float | None], b: Sequence[float | None]) -> float:
    """Largest absolute difference between two hot-neuron CDFs on HOT_CDF_GRID."""
    return float(max(abs(x - y) for x, y in zip(a, b) if x is not None and y is not None))
