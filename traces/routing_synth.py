"""Synthetic routing traces at any MoE shape, fitted to a measured trace's statistics (traces/routing_stats.py).

The generator, per token t, stored MoE layer l and expert e (vectorised NumPy, float32):

    score[t, l, e] = base[l, e] + sigma * z[t, l, e] + g[t, l, e]       experts = the top K of score
    z[t, l]  = phi * z[t-1, l] + sqrt(1 - phi^2) * w[t, l]              (AR(1) over tokens: locality)
    w[t, l]  = psi * w[t, l-1][perm_l] + sqrt(1 - psi^2) * u[t, l]      (coupling to the previous layer)
    g[t, l]  = g[t, l-1][perm_l] with probability psi, else fresh Gumbel(0, 1)   (the same coupling of a
               token's fresh preference; a copy keeps g's Gumbel marginal exact)
    u ~ N(0, 1), perm_l a fixed random permutation of the experts       weights = softmax(beta * score)
                                                                          over the K selected

Top-K of (log-share + Gumbel) samples K experts without replacement in proportion to their shares
(the Gumbel-top-k trick), so with sigma = 0 tokens are independent draws from the layer's popularity.
A persistent latent z (strength sigma, memory phi) makes consecutive tokens prefer the same experts:
local routing consistency over tens of tokens. Repeats (probability kappa per token and layer, the
token reuses the previous token's routing) add the short-range reuse a latent cannot give without
also lengthening the long-range consistency. Coupling psi makes a token's preference at layer l
predict its preference at l+1 through a fixed expert-to-expert map (perm_l): the cross-layer correlation. The latent runs as one
stream over the whole trace; sequences only label tokens.

Fitting (`fit_like`): base[l] starts at log(popularity of layer l) and is corrected on the generated
tokens until each layer's popularity matches (a multiplicative fixed point, 6 rounds); sigma and phi are
chosen on a coarse grid, then a finer one around the best point, to match the source's reuse_prev,
SRP(16) and SCH(16) (mean over layers), kappa at each point solved from reuse_prev; then psi
(bisection) to match the cross-layer NMI, then beta (bisection) to match the mean top-1 weight. The
fitted scalars are shape-free, so `synthesize` can apply them to another MoE shape: the target layer takes the popularity
of the proportionally placed source layer, its share curve (shares sorted, as a function of rank / E)
resampled to the target's expert count, assigned to experts in a seeded random order.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from devices.errors import FlashsimError
from devices.limits import check_memory
from traces.routing import RoutingTrace, order_by_weight, write_routing_trace
from traces.routing_stats import RoutingView, popularity, reuse_prev, routing_stats, scalar

SIGMAS = (0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0)
PHIS = (0.0, 0.5, 0.7, 0.8, 0.9, 0.95, 0.98)
PSI_STEPS = 8
FIT_KEYS = ("reuse_prev", "srp.16", "sch.16")
POP_ROUNDS = 6
BLOCK = 64                                    # tokens per block of the AR(1) recursion


@dataclass(frozen=True)
class SynthParams:
    """The shape-free parameters of the generator (module docstring)."""

    sigma: float = 1.0
    phi: float = 0.8
    psi: float = 0.3
    beta: float = 1.0
    kappa: float = 0.0


def _ar1(a: np.ndarray, phi: float) -> np.ndarray:
    """z[t] = phi z[t-1] + sqrt(1-phi^2) a[t] along axis 0, z[0] = a[0]: a lower-triangular matmul per
    block of BLOCK tokens, carried across blocks (vectorised over every other axis)."""
    if phi == 0.0:
        return a
    T = a.shape[0]
    flat = a.reshape(T, -1)
    pad = (-T) % BLOCK
    x = np.concatenate([flat, np.zeros((pad, flat.shape[1]), flat.dtype)]) if pad else flat
    nb = x.shape[0] // BLOCK
    i = np.arange(BLOCK)
    L = np.tril(phi ** (i[:, None] - i[None, :]).clip(0)).astype(np.float32)
    inner = np.einsum("ts,nsc->ntc", L, x.reshape(nb, BLOCK, -1) * np.float32(np.sqrt(1 - phi * phi)))
    inner[0] += (phi ** i)[:, None].astype(np.float32) * (x[0] * np.float32(1 - np.sqrt(1 - phi * phi)))[None]
    carry_w = (phi ** (i + 1)).astype(np.float32)[:, None]
    for b in range(1, nb):
        inner[b] += carry_w * inner[b - 1, -1][None]
    return inner.reshape(nb * BLOCK, -1)[:T].reshape(a.shape)


def _noise(T: int, M: int, E: int, seed: int, p: SynthParams) -> tuple[np.ndarray, np.ndarray]:
    """(latent z [T, M, E], Gumbel g [T, M, E]) from named streams of one seed."""
    ss = np.random.SeedSequence(seed)
    r_u, r_g, r_perm = (np.random.default_rng(s) for s in ss.spawn(3))
    u = r_u.standard_normal((T, M, E), dtype=np.float32)
    perms = np.stack([r_perm.permutation(E) for _ in range(M)])
    if p.psi > 0:
        c = np.float32(np.sqrt(1 - p.psi * p.psi))
        for m in range(1, M):
            u[:, m] = np.float32(p.psi) * u[:, m - 1][:, perms[m]] + c * u[:, m]
    z = _ar1(u, p.phi)
    g = -np.log(-np.log(r_g.random((T, M, E), dtype=np.float32).clip(1e-12, 1 - 1e-7)))
    if p.psi > 0:                     # a token's fresh preference is the previous layer's, mapped, w.p. psi
        copy = r_g.random((T, M)) < p.psi
        for m in range(1, M):
            g[:, m] = np.where(copy[:, m, None], g[:, m - 1][:, perms[m]], g[:, m])
    return z, g


def _topk(score: np.ndarray, K: int, beta: float) -> tuple[np.ndarray, np.ndarray]:
    part = np.argpartition(-score, K - 1, axis=2)[:, :, :K]
    s = np.take_along_axis(score, part, axis=2)
    w = np.exp(beta * (s - s.max(axis=2, keepdims=True)))
    w /= w.sum(axis=2, keepdims=True)
    return order_by_weight(part, w)


def _repeat(ex: np.ndarray, w: np.ndarray, kappa: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """With probability kappa per token and layer, the token reuses the previous token's routing (a
    chain of repeats all take the row of its first token): vectorised by a running maximum of indices."""
    if kappa <= 0:
        return ex, w
    T, M, _ = ex.shape
    copy = np.random.default_rng(np.random.SeedSequence([seed, 13])).random((T, M)) < kappa
    copy[0] = False
    idx = np.maximum.accumulate(np.where(copy, 0, np.arange(T)[:, None]), axis=0)
    cols = np.arange(M)[None, :]
    return ex[idx, cols], w[idx, cols]


def generate(pop: np.ndarray, K: int, T: int, p: SynthParams, seed: int, calibrate: bool = True,
             noise: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(experts int64 [T, M, K], weights float32 [T, M, K]) with layer popularity `pop` [M, E]."""
    M, E = pop.shape
    z, g = noise if noise is not None else _noise(T, M, E, seed, p)
    target = np.maximum(pop, 1e-9)
    base = np.log(target).astype(np.float32)
    noisy = np.float32(p.sigma) * z + g
    for _ in range(POP_ROUNDS if calibrate else 0):
        ex, _ = _topk(base[None] + noisy, K, p.beta)
        got = np.zeros((M, E))
        np.add.at(got, (np.broadcast_to(np.arange(M)[None, :, None], ex.shape), ex), 1.0)
        got = got / got.sum(axis=1, keepdims=True)
        base += np.log(target / np.maximum(got, 0.5 / (T * K))).astype(np.float32)
    ex, w = _topk(base[None] + noisy, K, p.beta)
    ex, w = _repeat(ex, w, p.kappa, seed)
    return ex, w.astype(np.float32)


def _loss(stats: dict[str, Any], target: dict[str, Any], keys: tuple[str, ...]) -> float:
    return float(sum((scalar(stats, k) - scalar(target, k)) ** 2 for k in keys
                     if scalar(stats, k) is not None and scalar(target, k) is not None))


def fit_like(v: RoutingView, seed: int = 0) -> tuple[SynthParams, dict[str, Any]]:
    """Fit SynthParams to a routing view (module docstring); returns them and the source's statistics."""
    target = routing_stats(v)
    pop = popularity(v)
    T, M, K = v.experts.shape
    E = v.n_experts

    want_reuse = target["reuse_prev"]

    def point(sigma: float, phi: float, psi: float, calibrate: bool = False) -> tuple[SynthParams, dict[str, Any]]:
        """Stats at (sigma, phi, psi) with kappa solved from reuse: repeats lift reuse r0 to
        kappa + (1 - kappa) r0, so kappa = (target - r0) / (1 - r0) when the latent alone falls short."""
        ex, w = generate(pop, K, T, SynthParams(sigma, phi, psi), seed, calibrate=calibrate)
        view = RoutingView(ex, w, v.sequence, E)
        r0 = float(np.nanmean(reuse_prev(view)))
        kappa = 0.0 if want_reuse is None or not r0 < want_reuse else round((want_reuse - r0) / (1 - r0), 4)
        if kappa > 0:
            view = RoutingView(*_repeat(ex, w, kappa, seed), v.sequence, E)
        return SynthParams(sigma, phi, psi, 1.0, kappa), routing_stats(view)

    coarse = [(s, f) for s in SIGMAS for f in PHIS if not (s == 0 and f > 0)]
    s0, f0 = min(coarse, key=lambda sf: _loss(point(sf[0], sf[1], 0.0)[1], target, FIT_KEYS))
    fine = [(max(0.0, s0 + ds), round(min(0.99, max(0.0, f0 + df)), 4)) for ds in (-0.25, -0.125, 0, 0.125, 0.25)
            for df in (-0.06, -0.03, 0, 0.03, 0.06)]
    s1, f1 = min(fine, key=lambda sf: _loss(point(sf[0], sf[1], 0.0, True)[1], target, FIT_KEYS))
    want_nmi, lo, hi = target["cross_layer_nmi"], 0.0, 0.99
    for _ in range(PSI_STEPS if want_nmi is not None and M > 1 else 0):     # NMI rises with psi
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if point(s1, f1, mid)[1]["cross_layer_nmi"] < want_nmi else (lo, mid)
    p, _ = point(s1, f1, round(0.5 * (lo + hi), 4) if want_nmi is not None and M > 1 else 0.0, True)
    want = target["top1_weight"]
    if want is not None and K > 1:
        lo, hi = 0.0, 50.0
        z, g = _noise(T, M, E, seed, p)
        for _ in range(20):
            mid = 0.5 * (lo + hi)
            _, w = generate(pop, K, T, SynthParams(p.sigma, p.phi, p.psi, mid), seed, calibrate=False, noise=(z, g))
            lo, hi = (mid, hi) if float(w[:, :, 0].mean()) < want else (lo, mid)
        p = SynthParams(p.sigma, p.phi, p.psi, round(0.5 * (lo + hi), 4), p.kappa)
    return p, target


def resample_popularity(src: np.ndarray, M: int, E: int, seed: int) -> np.ndarray:
    """[M, E] popularity for another shape: layer m takes source layer round(m (M_src-1)/(M-1)); its share
    curve (sorted shares against rank / E) is resampled to E experts and assigned in a seeded random order."""
    if src.shape == (M, E):
        return src
    rng = np.random.default_rng(np.random.SeedSequence([seed, 7]))
    Ms, Es = src.shape
    out = np.empty((M, E))
    for m in range(M):
        s = np.sort(src[round(m * (Ms - 1) / max(M - 1, 1))])[::-1]
        cum = np.concatenate([[0.0], np.cumsum(s)])                      # Lorenz curve at rank / Es
        c = np.interp(np.arange(E + 1) / E, np.arange(Es + 1) / Es, cum)
        out[m] = np.diff(c)[rng.permutation(E)]
    out = np.maximum(out, 1e-12)
    return out / out.sum(axis=1, keepdims=True)


def zipf_popularity(M: int, E: int, skew: float, seed: int) -> np.ndarray:
    """[M, E] shares proportional to 1 / rank^skew, in a seeded random expert order per layer."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 11]))
    s = 1.0 / np.arange(1, E + 1) ** skew
    return np.stack([(s / s.sum())[rng.permutation(E)] for _ in range(M)])


def synthesize(out: str | Path, *, model: str, n_layers: int, moe_layers: list[int], n_experts: int, top_k: int,
               n_tokens: int, seed: int = 0, like: RoutingTrace | None = None, params: SynthParams | None = None,
               skew: float = 0.0, sequence_tokens: int | None = None, overwrite: bool = False,
               provenance: dict | None = None) -> tuple[Path, dict[str, Any]]:
    """Write a synthetic routing trace; returns its path and the fit record stored in source["fit"]."""
    M = len(moe_layers)
    if not 1 <= top_k <= n_experts:
        raise FlashsimError(f"top_k must be in [1, {n_experts}], got {top_k}")
    if n_tokens < 1:
        raise FlashsimError(f"--tokens must be >= 1, got {n_tokens}")
    check_memory(f"synthesising {n_tokens:,} tokens x {M} MoE layers x {n_experts} experts",
                 n_tokens * M * n_experts * 4 * 5, "use fewer --tokens")
    fit: dict[str, Any] = {}
    if like is not None:
        from traces.routing_stats import view_of

        v = view_of(like)
        p, target = fit_like(v, seed)
        pop = resample_popularity(popularity(v), M, n_experts, seed)
        target.pop("per_layer")
        fit = {"like": str(like.path), "like_model": like.manifest.model, "target": target}
        same_tokens = n_tokens == like.n_tokens
        seq = v.sequence if same_tokens and sequence_tokens is None else None
    else:
        p = params or SynthParams()
        pop = zipf_popularity(M, n_experts, skew, seed)
        fit = {"zipf_skew": skew}
        seq = None
    if seq is None:
        per = sequence_tokens or n_tokens
        seq = (np.arange(n_tokens) // per).astype(np.int32)
    ex, w = generate(pop, top_k, n_tokens, p, seed)
    achieved = routing_stats(RoutingView(ex, w, seq, n_experts))
    achieved.pop("per_layer")
    fit.update({"params": asdict(p), "achieved": achieved, "seed": seed})
    source = {"kind": "synthetic", "generator": "traces/routing_synth.py", "fit": fit, **(provenance or {})}
    path = write_routing_trace(out, model=model, n_layers=n_layers, moe_layers=moe_layers, n_experts=n_experts,
                               top_k=top_k, experts=ex, weights=w, phase=np.ones(n_tokens, np.uint8),
                               sequence=seq, source=source, overwrite=overwrite)
    return path, fit
