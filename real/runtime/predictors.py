"""Predictors of model mode: which FFN neurons each token computes, given the truth the oracle pass
measured (bool masks [L, T, N]; sizes in neurons).

* `oracle`: exactly the true active set (the dense model's activations of the same token): an
  ORACLE, no real system has it.
* `previous`: the previous token's true active set (token 0, which has none: its own true set;
  every neuron would not fit the budgets a sparse run is given). A one-step-stale
  oracle: a real system would have to observe the previous token's full activations, which a sparse
  run does not compute; it is the "activations change slowly" baseline of the sparsity papers.
* `lowrank:FILE`: the trained low-rank predictor (`real.studies.predictor_train`, `flashsim real
  train-predictor`) applied to each layer's FFN input x of the dense model at the same position
  (teacher forced). The policy stack plans one step ahead (delta prefetch asks for step s + 1's
  computed set while step s runs), so predictions are made for the whole text before the timed run;
  the sparse run's own x differs from the dense x by the sparsity error of the layers below, so the
  run also evaluates the predictor on its own x, live and timed (its real cost), and reports how
  often that live prediction equals the set used (`live_agreement`).

Non-oracle predictions reach the policy stack as the simulator's `recorded` predictor over a trace
of the predicted sets (`write_mask_trace`), so the real run and the simulator's replay see the same
sets; `rank` charges the low-rank predictor's DRAM and FLOPs in the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from devices.errors import FlashsimError

KINDS = ("oracle", "previous", "lowrank:FILE")


@dataclass(frozen=True)
class PredictorChoice:
    kind: str                  # oracle | previous | lowrank
    path: str | None = None    # lowrank: the predictor file

    @property
    def label(self) -> str:
        return f"lowrank:{self.path}" if self.kind == "lowrank" else self.kind

    @property
    def is_oracle(self) -> bool:
        return self.kind in ("oracle", "previous")


def parse_predictor(text: str) -> PredictorChoice:
    t = text.strip()
    if t in ("oracle", "previous"):
        return PredictorChoice(t)
    if t.startswith("lowrank:") and len(t) > len("lowrank:"):
        path = t[len("lowrank:"):]
        if not Path(path).is_file():
            raise FlashsimError(f"--predictor {t}: no such predictor file {path} "
                                "(train one with `flashsim real train-predictor`)")
        return PredictorChoice("lowrank", path)
    raise FlashsimError(f"--predictor {text!r}: use oracle, previous or lowrank:FILE.safetensors")


def previous_masks(truth: np.ndarray) -> np.ndarray:
    """bool [L, T, N]: token t computes token t-1's true set; token 0 its own (there is no previous one)."""
    out = np.empty_like(truth)
    out[:, 0] = truth[:, 0]
    out[:, 1:] = truth[:, :-1]
    return out


def lowrank_masks(pred: Any, ffn_inputs: np.ndarray) -> np.ndarray:
    """bool [L, T, N] from x [L, T, d]."""
    return np.stack([pred.predict(layer, ffn_inputs[layer]) for layer in range(ffn_inputs.shape[0])])


def set_quality(pred: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    """Recall, precision and computed fraction of predicted sets against true ones (bool [L, T, N])."""
    tp = int((pred & truth).sum())
    npred, ntrue = int(pred.sum()), int(truth.sum())
    return {"predictor_recall": tp / ntrue if ntrue else 1.0, "predictor_precision": tp / npred if npred else 1.0,
            "predicted_fraction": npred / pred.size if pred.size else 0.0}


def write_mask_trace(out: str | Path, src: Any, masks: np.ndarray, spec: Any, provenance: dict) -> Path:
    """A trace of the same tokens as `src` whose masks are `masks` (bool [L, T, N]); magnitudes are
    copied from `src` (the recorded predictor reads only the masks)."""
    from traces.format import SparsityRule, TraceWriter

    L, T, N = masks.shape
    if (L, T, N) != (src.n_layers, src.n_tokens, src.n_neurons):
        raise ValueError(f"masks {masks.shape} do not match the trace {src.n_layers}x{src.n_tokens}x{src.n_neurons}")
    with TraceWriter(out, spec, T, src.top_k, SparsityRule(rule="synthetic"), list(src.manifest.prompts),
                     provenance={"kind": "model-mode predicted sets", **provenance}, overwrite=True) as w:
        w.token_ids[:] = np.asarray(src.token_ids)
        w.phase[:] = np.asarray(src.phase)
        w.prompt_index[:] = np.asarray(src.prompt_index)
        for layer in range(L):
            w.masks[layer] = np.packbits(masks[layer], axis=-1, bitorder="little")
            idx, mag = src.top(layer)
            w.top_idx[layer], w.top_mag[layer] = np.asarray(idx), np.asarray(mag)
            w.abs_sum[layer] = np.asarray(src.abs_sum(layer))
    return Path(out)


def config_overrides(choice: PredictorChoice, trace_path: Path | None, rank: int) -> list[str]:
    """The predictor slot for this choice (recorded sets for everything but the oracle)."""
    if choice.kind == "oracle":
        return ["predictor=oracle"]
    assert trace_path is not None
    return ["predictor=recorded", f"recorded.path={trace_path}", f"recorded.rank={rank}"]
