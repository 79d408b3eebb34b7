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

Magnitudes (on by default): see traces/synthetic_magnitudes.py.

Determinism: one seed -> SeedSequence -> child streams (fit; masks and magnitudes per layer); the
same inputs and seed give identical files.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from devices.errors import FlashsimError
from devices.model_spec import ModelSpec
from devices.progress import Stage, phase
from traces.format import DECODE, PromptInfo, SparsityRule, Trace, TraceWriter, check_trace_size
from traces.outputs import check_output_dir
from traces.stats import (
    HOT_CDF_GRID,
    count_packed,
    measured_tokens,
    summarize_counts,
    tokens_before_in_prompt,
    trace_stats,
)
from traces.synthetic_chain import (
    CLASSES,
    CONTEXT_PENALTY,
    QUAD_Z,
    RATE_FLOOR,
    bit_thresholds,
    class_matrix,
    context_norm,
    count_inflation,
    cycle_segments,
    expected_hot80,
    fit_classes,
    fit_hot_skew,
    normalize_rates,
    power_law_rates,
    prompt_rates,
    resample_quantiles,
    segment_lengths,
    shrink_rates,
    solve_overlap,
    transition_probs,
    uniform_bits,
)
from traces.synthetic_magnitudes import (
    MagnitudeModel,
    default_magnitudes,
    draw_magnitudes,
    fit_magnitudes,
    top_k_for,
)
from traces.synthetic_tasks import TaskFit, apply_tasks, source_tasks, task_summary, token_task_ids

GENERATOR = "markov-context-mixture-v1"
FIT_WINDOWS = 8               # coverage k = 1..8 is fitted and checked
TOLERANCE = 0.03              # the absolute agreement the tests check
# Tokens generated at a time: ~TOKEN_BLOCK * N * 5 bytes of scratch, kept under glibc's mmap
# threshold (32 MiB) for 7B shapes so blocks reuse heap memory instead of page-faulting afresh.
TOKEN_BLOCK = 256


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
    shares = None
    for it in range(4):                  # rates, classes and noise depend on each other
        src_rates, shrink = shrink_rates(p_hat, t_src, infl)
        rates = normalize_rates(resample_quantiles(src_rates, n), f * scale)
        cov, ratio = class_matrix(rates, FIT_WINDOWS)
        # Coverage pools events, so classes mix by their share of events v_c = w_c ratio_c / sum:
        # linear in v. The neuron shares follow as w_c = v_c / ratio_c, normalised.
        shares = fit_classes(cov, target_cov, minimax_iters=1 if it < 2 else 15, context_penalty=CONTEXT_PENALTY,
                             fallback_index=CLASSES.index((0.0, 0.0)), start=shares)
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
    """Yield (t0, uint8 [b, ceil(N/8)]) blocks of one layer, bit-packed like the trace's masks
    (np.packbits, bitorder="little"; `unpack` gives bool [b, N]). At restart[t] (a prompt start)
    each neuron gets a fresh prompt rate and a stationary state; otherwise it follows its chain from
    token t-1. With task_of_token (int per token, -1 = none) and plan.task_z, a prompt of a fitted
    task takes that task's z per neuron and rate scale instead of random z (see
    traces/synthetic_tasks.py).

    Within a prompt, token t is on iff u_t < p11 (if on at t-1) or u_t < p01 (if off), u_t uniform
    float32 (compared as its 32-bit draw, `uniform_bits`): both comparisons are made for the whole
    block at once and packed, and the recurrence
    x_t = B_t ^ ((A_t ^ B_t) & x_(t-1)) (A = [u < p11], B = [u < p01]) runs on 64-bit words, 64
    neurons per operation."""
    n_tokens, n = len(restart), len(plan.rates)
    nb = (n + 7) // 8
    words = -(-nb // 8)                                   # 64-bit words per token (padded)
    has_ctx = bool(np.any(plan.sigma > 0))
    norm = context_norm(plan.sigma)
    prev = np.zeros(words, np.uint64)
    th01 = th11 = (np.zeros(n, np.uint32), np.zeros(n, bool))    # set at the first token (a prompt start)
    for t0 in range(0, n_tokens, block):
        b = min(block, n_tokens - t0)
        u = uniform_bits(rng, (b, n))                     # u < p  <=>  bits < bit_thresholds(p)
        out = np.zeros((b, words * 8), np.uint8)
        out64 = out.view(np.uint64)
        starts = np.flatnonzero(restart[t0:t0 + b])
        bounds = np.unique(np.concatenate([[0], starts, [b]]))
        for s0, s1 in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            if restart[t0 + s0]:
                task = -1 if task_of_token is None or plan.task_z is None else int(task_of_token[t0 + s0])
                if task >= 0:
                    assert plan.task_scale is not None
                    lam64 = prompt_rates(plan.rates * plan.task_scale[task], plan.sigma, plan.task_z[task], norm)
                else:
                    z = QUAD_Z[rng.integers(0, len(QUAD_Z), n)] if has_ctx else 0.0
                    lam64 = prompt_rates(plan.rates, plan.sigma, z, norm)
                q01, q11 = transition_probs(lam64, plan.rho)
                (t_lam, one_lam), th01, th11 = (bit_thresholds(a.astype(np.float32)) for a in (lam64, q01, q11))
                out[s0, :nb] = np.packbits((u[s0] < t_lam) | one_lam, bitorder="little")
                prev = out64[s0]
                s0 += 1
            if s0 == s1:
                continue
            on = np.zeros((2, s1 - s0, words * 8), np.uint8)
            for j, (thr, one) in enumerate((th11, th01)):
                on[j, :, :nb] = np.packbits(u[s0:s1] < thr, axis=1, bitorder="little")
                if one.any():                              # p = 1: on whatever the draw
                    on[j, :, :nb] |= np.packbits(one, bitorder="little")
            flip, base = on.view(np.uint64)                   # A ^ B and B per token
            flip ^= base
            for i in range(s1 - s0):
                row = out64[s0 + i]
                np.bitwise_and(flip[i], prev, out=row)
                np.bitwise_xor(row, base[i], out=row)
                prev = row
        prev = prev.copy()
        yield t0, out[:, :nb]


def unpack(packed: np.ndarray, n: int) -> np.ndarray:
    """bool [b, n] from packed masks uint8 [b, ceil(n/8)] (bitorder="little")."""
    return np.unpackbits(packed, axis=1, count=n, bitorder="little").view(bool)


def synthesize(out: str | Path, spec: ModelSpec, n_tokens: int, seed: int, *, like: Trace | None = None,
               like_phase: str = "all", active_fraction: float | None = None, overlap: float | None = None,
               hot_skew: float | None = None, magnitudes: bool = True, prompt_tokens: int | None = None,
               overwrite: bool = False, provenance: dict | None = None, progress: bool = False) -> Path:
    """Fit, generate and write a synthetic trace atomically; returns its path.

    The trace is cut into prompts (chains restart at each): of `prompt_tokens` each if given, else
    the source's prompt lengths (cycled) with `like`, else one prompt. `progress`: the fit and the
    layers as stages on stderr (devices/progress.py)."""
    if n_tokens < 2:
        raise FlashsimError(f"--tokens {n_tokens}: a synthetic trace needs at least 2 tokens")
    check_trace_size(spec, n_tokens, spec.d_ff if magnitudes else 0)   # before any array is built
    check_output_dir(out, "--out", overwrite, flag="--force")
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
        with phase(f"trace synth: fit to {like.path}", enabled=progress):
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
    with TraceWriter(out, spec, n_tokens, k, rule, prompts, provenance=provenance, overwrite=overwrite) as w, \
            Stage(f"trace synth: {spec.name}, {n_tokens} tokens", len(plans), "layers", enabled=progress) as stage:
        w.token_ids[:] = -1
        w.phase[:] = DECODE
        w.prompt_index[:] = prompt_index
        counts = []
        for layer, plan in enumerate(plans):
            rng = np.random.default_rng(layer_ss[layer])
            mrng = np.random.default_rng(mlayer_ss[layer])
            for t0, packed in generate_layer(plan, restart, rng, task_of_token=task_ids):
                t1 = t0 + len(packed)
                w.masks[layer, t0:t1] = packed
                if k:
                    assert plan.magnitude is not None
                    w.top_idx[layer, t0:t1], w.top_mag[layer, t0:t1], w.abs_sum[layer, t0:t1] = \
                        draw_magnitudes(unpack(packed, spec.d_ff), plan.magnitude, k, mrng, plan.log_weight,
                                        w.top_idx.dtype, packed)
                else:
                    w.abs_sum[layer, t0:t1] = np.bitwise_count(packed).sum(axis=1)
            counts.append(count_packed(w.masks[layer], spec.d_ff, measured, n_before, None, FIT_WINDOWS))
            stage.update()
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
