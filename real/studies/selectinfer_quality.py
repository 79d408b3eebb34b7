"""SelectInfer's neuron selection on a real model: perplexity and greedy-token agreement with the dense
model when every layer's FFN uses only a selected set of neurons (issue 7, item 6).

Owns: the neuron sets (`ranked_sets` from the profiler's rankings, `random_order` for the baseline,
`vote_dynamic` for the prefill votes), the FFN masking hooks (`FfnMask`), and the evaluation over
held-out prompts (`answer_sequences`, `evaluate_selection`, `run_selectinfer_quality`).

Neuron selection follows sim/policies/selective.py (SelectiveResidency) as far as it applies to one
forward pass, with both knobs given RELATIVE to N (neurons per layer) and to the loaded set:
* gamma (selective loading): n_load = round(gamma * N) neurons per layer are loaded: the top
  n_static = round(static_share * n_load) of the task's base ranking (`rank_base.<task>`), then
  neurons in the model-wide secondary ranking (`rank_secondary`) that are not yet in, up to n_load.
  (The simulator's delta = static_share * gamma, its phi = compute_ratio * gamma.)
* compute_ratio: of the loaded neurons, the fraction computed at decode tokens:
  n_compute = round(compute_ratio * n_load) = static (the base neurons above, always computed) +
  dynamic. The dynamic neurons come from prefill votes: every prompt token votes for its top
  k = max(1, round(alpha * |pool|)) neurons by |a| among the pool (loaded, not static); the most
  voted pool neurons (ties: higher model-wide score, then lower index) fill the rest. Prompt tokens
  compute every loaded neuron (as in the simulator); answer tokens compute static + dynamic.
  The votes use the |a| of the real prefill pass computed with the loaded set (the simulator uses
  the trace's dense magnitudes); compute_ratio = 1 means every loaded neuron is computed.
* random baseline of the same sizes: one seeded random permutation of each layer's neurons per
  gamma; loaded = its first n_load, computed = its first n_compute (no ranking, no votes).

A neuron outside the set is "not loaded / not computed": a forward pre-hook on each layer's down
projection multiplies the intermediate activation a = act(gate(x)) * up(x) by a 0/1 mask, so
down(a * m) sums only the selected neurons' columns. That is exactly the output of a FFN that loads
or computes only those neurons (gate/up rows are still computed here: this measures quality, not
speed). A mask is per layer and per position: [T, N], prompt rows = loaded set, answer rows = computed.

Evaluation text: each held-out prompt (builtin prompts that are NOT in the profiled trace) in the
chat template, followed by the dense model's greedy answer (`max_new_tokens`, stopping after an
end-of-sequence token). One teacher-forced pass over prompt + answer gives, per task (pooled over
its prompts): `ppl_answer` = exp(mean NLL of the answer tokens), `agreement` = fraction of answer
positions whose argmax equals the dense model's argmax there, and `ppl_prompt` / `agreement_prompt`
for the prompt tokens (the loaded set only). The dense rows have agreement 1 by definition.

torch is imported inside the functions.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from devices.errors import FlashsimError
from traces.capture.hooks import FfnPreHooks, ffn_input_modules
from traces.profiler import NeuronProfile

DEFAULT_GAMMAS = (0.1, 0.25, 0.5)
DEFAULT_RATIOS = (1.0, 0.5)
DEFAULT_STATIC_SHARE = 0.25   # simulator defaults: delta / gamma = 0.2 / 0.7 ~ 0.29
DEFAULT_ALPHA = 0.1           # the simulator's default vote fraction
DEFAULT_MAX_NEW_TOKENS = 32
SELECTIONS = ("profile", "random")


# ---- neuron sets ---------------------------------------------------------------------------------------
def _count(fraction: float, n: int) -> int:
    return int(round(fraction * n))


def ranked_sets(base_scores: np.ndarray, secondary_scores: np.ndarray, gamma: float,
                static_share: float) -> tuple[np.ndarray, np.ndarray]:
    """(loaded, static): bool [L, N]. Static = top round(static_share * n_load) by base score; loaded =
    static + the best remaining neurons by secondary score, n_load = round(gamma * N). Stable sorts."""
    L, N = base_scores.shape
    n_load = _count(gamma, N)
    n_static = _count(static_share, n_load)
    base = np.argsort(-base_scores, axis=1, kind="stable")
    sec = np.argsort(-secondary_scores, axis=1, kind="stable")
    loaded = np.zeros((L, N), bool)
    static = np.zeros((L, N), bool)
    for layer in range(L):
        static[layer, base[layer, :n_static]] = True
        rest = sec[layer][~static[layer, sec[layer]]]
        loaded[layer] = static[layer]
        loaded[layer, rest[: n_load - n_static]] = True
    return loaded, static


def vote_dynamic(mags: np.ndarray, pool: np.ndarray, n_dyn: int, secondary: np.ndarray,
                 alpha: float) -> np.ndarray:
    """bool [N]: the n_dyn pool neurons with most prefill votes (ties: secondary score desc, index asc).

    mags: |a| [P, N] of the prompt tokens; each token votes for its top max(1, round(alpha * |pool|))
    pool neurons by |a| (only strictly positive |a| count as votes, as in the simulator)."""
    N = pool.size
    n_pool = int(pool.sum())
    n_dyn = max(0, min(n_dyn, n_pool))
    votes = np.zeros(N, np.int64)
    if len(mags) and n_pool:
        m = np.where(pool[None, :], mags, -1.0)
        k = min(max(1, _count(alpha, n_pool)), N)
        top = np.argpartition(-m, k - 1, axis=1)[:, :k]
        picked = np.take_along_axis(m, top, axis=1) > 0
        np.add.at(votes, top[picked], 1)
    cand = np.flatnonzero(pool)
    order = np.lexsort((cand, -secondary[cand], -votes[cand]))
    dyn = np.zeros(N, bool)
    dyn[cand[order[:n_dyn]]] = True
    return dyn


def random_order(seed: int, gamma: float, n_layers: int, n_neurons: int) -> np.ndarray:
    """int64 [L, N]: a random permutation of each layer's neurons, from (seed, gamma) only, so the
    random set for one gamma does not depend on which other gammas or ratios are evaluated."""
    ss = np.random.SeedSequence(seed, spawn_key=(int(round(gamma * 1_000_000)),))
    rng = np.random.default_rng(ss)
    return np.stack([rng.permutation(n_neurons) for _ in range(n_layers)])


def check_settings(gammas: Sequence[float], ratios: Sequence[float], static_share: float, alpha: float) -> None:
    """FlashsimError naming the bad parameter."""
    if not gammas or not ratios:
        raise FlashsimError("--gamma and --compute-ratio need at least one value each")
    for name, values in (("--gamma", gammas), ("--compute-ratio", ratios)):
        for v in values:
            if not (math.isfinite(v) and 0 < v <= 1):
                raise FlashsimError(f"{name} {v}: each value must be in (0, 1]")
    if not (0 <= static_share <= 1):
        raise FlashsimError(f"--static-share {static_share}: must be in [0, 1]")
    if static_share > min(ratios):
        raise FlashsimError(f"--static-share {static_share} exceeds --compute-ratio {min(ratios)}: the static "
                            "(base) neurons are always computed, so static_share <= every compute ratio")
    if not (0 < alpha <= 1):
        raise FlashsimError(f"--alpha {alpha}: must be in (0, 1]")


# ---- masking hooks -------------------------------------------------------------------------------------
class FfnMask(FfnPreHooks):
    """Context manager: multiplies each layer's FFN intermediate activation by `masks[layer]`
    (torch float [T, N] or [N]; None = no mask) and, when `record` is set, keeps |a| (before the
    mask) of the last pass per layer as float32 numpy [T, N]."""

    def __init__(self, model: Any):
        self.modules = ffn_input_modules(model)
        self.masks: list[Any] = [None] * len(self.modules)
        self.record = False
        self.recorded: list[np.ndarray | None] = [None] * len(self.modules)
        self._handles: list[Any] = []

    def _hook(self, layer: int) -> Callable[[Any, tuple], tuple | None]:
        def pre_hook(_module: Any, args: tuple) -> tuple | None:
            a = args[0]
            if self.record:
                self.recorded[layer] = a.detach().abs().reshape(-1, a.shape[-1]).float().cpu().numpy()
            mask = self.masks[layer]
            if mask is None:
                return None
            return (a * mask.to(a.dtype),) + tuple(args[1:])
        return pre_hook



# ---- evaluation ----------------------------------------------------------------------------------------
@dataclass
class HeldOut:
    """One held-out prompt + the dense model's greedy answer, and the dense reference."""

    task: str
    prompt_id: str
    ids: list[int]                 # prompt + answer token ids
    n_prompt: int
    dense_logits: Any = None       # torch float [T, V]

    @property
    def n_answer(self) -> int:
        return len(self.ids) - self.n_prompt


def answer_sequences(model: Any, items: Sequence[tuple[str, str, list[int]]], max_new_tokens: int,
                     eos_ids: frozenset[int] = frozenset()) -> list[HeldOut]:
    """(task, prompt id, prompt token ids) -> prompt + dense greedy answer, with the dense logits."""
    from traces.capture.generate import Decoder

    dec = Decoder(model, eos_ids)
    out = []
    for task, pid, prompt_ids in items:
        if len(prompt_ids) < 2:
            raise FlashsimError(f"prompt {pid!r}: {len(prompt_ids)} token(s); need at least 2")
        answer = dec.run(prompt_ids, max_new_tokens)
        if not answer:
            raise FlashsimError(f"prompt {pid!r}: the dense model generated no token")
        s = HeldOut(task, pid, [*prompt_ids, *answer], len(prompt_ids))
        s.dense_logits = _logits(model, s.ids)
        out.append(s)
    return out


def _logits(model: Any, ids: Sequence[int]) -> Any:
    import torch

    with torch.inference_mode():
        return model(input_ids=torch.tensor([list(ids)]), use_cache=False).logits[0].float()


@dataclass
class _Tally:
    nll_answer: float = 0.0
    n_answer: int = 0
    agree_answer: int = 0
    nll_prompt: float = 0.0
    n_prompt: int = 0
    agree_prompt: int = 0

    def add(self, logits: Any, s: HeldOut) -> None:
        import torch

        ids = torch.tensor(s.ids)
        nll = torch.nn.functional.cross_entropy(logits[:-1], ids[1:], reduction="none").double()
        same = (logits[:-1].argmax(-1) == s.dense_logits[:-1].argmax(-1))
        p = s.n_prompt - 1          # positions 0..P-2 predict prompt tokens; P-1..T-2 predict the answer
        self.nll_prompt += float(nll[:p].sum())
        self.n_prompt += p
        self.agree_prompt += int(same[:p].sum())
        self.nll_answer += float(nll[p:].sum())
        self.n_answer += len(s.ids) - 1 - p
        self.agree_answer += int(same[p:].sum())

    def row(self) -> dict[str, float]:
        def ppl(nll: float, n: int) -> float:
            mean = nll / n if n else math.nan
            return math.exp(mean) if math.isfinite(mean) and mean < 700 else math.inf
        return {"ppl_answer": ppl(self.nll_answer, self.n_answer),
                "agreement": self.agree_answer / self.n_answer if self.n_answer else math.nan,
                "ppl_prompt": ppl(self.nll_prompt, self.n_prompt),
                "agreement_prompt": self.agree_prompt / self.n_prompt if self.n_prompt else math.nan,
                "answer_tokens": self.n_answer, "prompt_tokens": self.n_prompt}


def _mask_rows(loaded: np.ndarray, computed: np.ndarray, n_prompt: int, n_total: int) -> Any:
    """torch float [T, N]: prompt rows = loaded, answer rows = computed."""
    import torch

    rows = np.empty((n_total, loaded.size), np.float32)
    rows[:n_prompt] = loaded
    rows[n_prompt:] = computed
    return torch.from_numpy(rows)


def evaluate_selection(model: Any, ffn: FfnMask, seqs: Sequence[HeldOut], *, loaded: np.ndarray,
                       static: np.ndarray | None, n_compute: int, secondary: np.ndarray | None,
                       alpha: float, computed: np.ndarray | None = None) -> dict[str, Any]:
    """Metrics pooled over `seqs` for one selection (bool [L, N] sets).

    Either `computed` (bool [L, N], fixed: the random baseline, or everything loaded) or `static` +
    `secondary` (float [L, N]) to choose dynamic neurons by prefill votes per sequence."""
    import torch

    L = loaded.shape[0]
    tally = _Tally()
    n_passes = 0
    for s in seqs:
        comp = computed
        if comp is None:
            # prefill: every loaded neuron computed, |a| recorded for the votes
            ffn.masks = [torch.from_numpy(loaded[layer].astype(np.float32)) for layer in range(L)]
            ffn.record = True
            try:
                _logits(model, s.ids[: s.n_prompt])
            finally:
                ffn.record = False
            n_passes += 1
            comp = np.zeros_like(loaded)
            for layer in range(L):
                pool = loaded[layer] & ~static[layer]
                n_dyn = n_compute - int(static[layer].sum())
                dyn = vote_dynamic(ffn.recorded[layer], pool, n_dyn, secondary[layer], alpha)
                comp[layer] = static[layer] | dyn
        ffn.masks = [_mask_rows(loaded[layer], comp[layer], s.n_prompt, len(s.ids)) for layer in range(L)]
        try:
            logits = _logits(model, s.ids)
        finally:
            ffn.masks = [None] * L
        n_passes += 1
        tally.add(logits, s)
    row = tally.row()
    row["passes"] = n_passes
    return row


def run_selectinfer_quality(model: Any, profile: NeuronProfile, seqs: Sequence[HeldOut], *,
                            gammas: Sequence[float] = DEFAULT_GAMMAS, ratios: Sequence[float] = DEFAULT_RATIOS,
                            static_share: float = DEFAULT_STATIC_SHARE, alpha: float = DEFAULT_ALPHA,
                            seed: int = 0, selections: Sequence[str] = SELECTIONS,
                            progress: Callable[[dict], None] | None = None) -> tuple[list[dict], list[str]]:
    """Rows (task x [dense] + gamma x ratio x selection) and notes. Sequences carry their dense logits."""
    check_settings(gammas, ratios, static_share, alpha)
    from traces.capture.hooks import ffn_input_modules

    L, N = profile.n_layers, profile.n_neurons
    if len(ffn_input_modules(model)) != L:
        raise FlashsimError(f"the neuron profile has {L} layers, the model has {len(ffn_input_modules(model))}")
    notes: list[str] = []
    tasks = sorted({s.task for s in seqs})
    rows: list[dict] = []
    ffn = FfnMask(model)
    with ffn:
        if ffn.modules[0].in_features != N:
            raise FlashsimError(f"the neuron profile has {N} neurons per layer, the model's FFN has "
                                f"{ffn.modules[0].in_features}")
        for task in tasks:
            tseqs = [s for s in seqs if s.task == task]
            base_scores = profile.scores_task.get(task)
            if base_scores is None:
                base_scores = profile.scores_all
                notes.append(f"task {task!r} is not in the profile (tasks: {', '.join(profile.tasks)}); "
                             "its base neurons use the model-wide ranking")
            dense = _Tally()
            for s in tseqs:
                dense.add(s.dense_logits, s)
            rows.append({"task": task, "gamma": 1.0, "compute_ratio": 1.0, "selection": "dense",
                         "prompts": [s.prompt_id for s in tseqs], **dense.row(), "passes": 0, "seconds": 0.0})
            for gamma in gammas:
                n_load = _count(gamma, N)
                loaded_r, static_r = ranked_sets(base_scores, profile.scores_all, gamma, static_share)
                perm = random_order(seed, gamma, L, N)
                for ratio in ratios:
                    n_compute = _count(ratio, n_load)
                    for sel in selections:
                        t0 = time.perf_counter()
                        if sel == "profile":
                            if n_compute >= n_load:
                                r = evaluate_selection(model, ffn, tseqs, loaded=loaded_r, static=None,
                                                       n_compute=n_compute, secondary=None, alpha=alpha,
                                                       computed=loaded_r)
                            else:
                                r = evaluate_selection(model, ffn, tseqs, loaded=loaded_r, static=static_r,
                                                       n_compute=n_compute, secondary=profile.scores_all,
                                                       alpha=alpha)
                        elif sel == "random":
                            loaded = np.zeros((L, N), bool)
                            np.put_along_axis(loaded, perm[:, :n_load], True, axis=1)
                            comp = np.zeros((L, N), bool)
                            np.put_along_axis(comp, perm[:, :n_compute], True, axis=1)
                            r = evaluate_selection(model, ffn, tseqs, loaded=loaded, static=None,
                                                   n_compute=n_compute, secondary=None, alpha=alpha,
                                                   computed=comp)
                        else:
                            raise FlashsimError(f"selection {sel!r}: expected one of {', '.join(SELECTIONS)}")
                        row = {"task": task, "gamma": gamma, "compute_ratio": ratio, "selection": sel,
                               "prompts": [s.prompt_id for s in tseqs], "n_loaded": n_load,
                               "n_computed": n_compute, **r, "seconds": round(time.perf_counter() - t0, 3)}
                        rows.append(row)
                        if progress:
                            progress(row)
    return rows, notes


def held_out_prompts(prompts: Sequence[Any], profiled: Sequence[Any]) -> list[Any]:
    """The prompts whose id and text are both absent from the profiled trace's prompts."""
    ids = {p.id for p in profiled}
    texts = {p.text for p in profiled}
    return [p for p in prompts if p.id not in ids and p.text not in texts]


def summarize(rows: Sequence[dict]) -> list[dict]:
    """Mean over tasks of ppl_answer (geometric) and agreement per (gamma, ratio, selection)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["gamma"], r["compute_ratio"], r["selection"]), []).append(r)
    out = []
    for (g, c, sel), rs in groups.items():
        lp = [math.log(r["ppl_answer"]) for r in rs if math.isfinite(r["ppl_answer"])]
        out.append({"gamma": g, "compute_ratio": c, "selection": sel, "tasks": len(rs),
                    "ppl_answer_geomean": math.exp(sum(lp) / len(lp)) if len(lp) == len(rs) else math.inf,
                    "agreement_mean": sum(r["agreement"] for r in rs) / len(rs)})
    return out
