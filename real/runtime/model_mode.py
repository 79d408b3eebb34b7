"""Model mode: a llama-family Hugging Face model (SmolLM2, ...) decoded token by token with its
attention, norms and embeddings resident (the HF modules themselves, fp32 torch) and every layer's
FFN replaced by the store-backed sparse FFN (`real.runtime.backend.RealExecutor.ffn`) under the policy
stack. Units: seconds, bytes; logits are fp32.

The true active sets (the `needed` sets the policies see) come from an oracle pass: the dense
model runs the same tokens once, untimed (`prepare`), and its FFN activations |act(gate x) * (up x)|
give each token's active set by the trace rule (`topk` with a target fraction; 1.0 keeps every
neuron). What is computed comes from the predictor (`real.runtime.predictors`): `oracle` (the true sets,
flagged as an oracle in the run's notes), `previous` (the previous token's true set) or
`lowrank:FILE` (a trained low-rank predictor); None keeps the config's predictor slot (e.g. the
simulator's `noisy`). `run_prepared` runs any number of predictors on one dense pass.

Teacher forcing: the real run feeds the text's tokens one at a time (KV cache on), so each step's
logits can be compared with the dense forward at the same position:
* `max_abs_diff`: with every neuron kept, the sparse run must equal the dense HF model run the
  same way (token by token with its KV cache) to <= 1e-4; `max_abs_diff_full_forward` compares
  with the one-shot full-sequence forward instead (SmolLM2: ~1.2e-4, fp32 summation order of the
  batched attention, present between HF's own two paths as well);
* `greedy_agreement`: fraction of positions whose argmax equals the dense argmax;
* `perplexity` / `dense_perplexity`: exp(mean NLL of the next text token) for both.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from devices.errors import FlashsimError
from devices.model_spec import ModelSpec
from devices.schema import DeviceProfile
from real.runtime.backend import RealExecutor, RealRun
from real.weights.dtypes import decode
from sim.config import RunConfig
from sim.policies.base import CapacityError

ORACLE_NOTE = ("active sets: ORACLE (dense gate/up activations of the same tokens, computed from the "
               "resident model before the run)")
PREVIOUS_NOTE = ("active sets: PREVIOUS token's true set (a one-step-stale ORACLE: the dense activations of "
                 "token t-1; token 0, which has no previous token, its own true set)")


def _cache_arg(model: Any) -> str:
    """The KV-cache argument's name: transformers 5 calls it `cache` (4.x: `past_key_values`,
    deprecated in 5), as in traces/capture/generate.py. Looked up once per run, not per token."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _decode_step(model: Any, ids: np.ndarray, past: Any, arg: str) -> tuple[Any, Any]:
    """One cached forward step; (output, KV cache). `arg`: `_cache_arg(model)`."""
    import torch

    out = model(torch.as_tensor(ids), use_cache=True, **{arg: past})
    return out, (out[arg] if arg in out else out.get("past_key_values"))


def check_store_matches(store: Any, spec: ModelSpec) -> None:
    s = store.spec
    if (s.n_layers, s.d_model, s.d_ff, s.gated) != (spec.n_layers, spec.d_model, spec.d_ff, spec.gated):
        raise FlashsimError(f"store {store.path} holds {s.name} ({s.n_layers} layers, d_model {s.d_model}, d_ff "
                            f"{s.d_ff}) but the model is {spec.name} ({spec.n_layers}, {spec.d_model}, {spec.d_ff}); "
                            "convert the model with `flashsim real convert --model ...` or pass its store")
    if store.dtype != "fp32":
        raise FlashsimError(f"store {store.path} is {store.dtype}: model mode compares with the fp32 model, "
                            "convert with --dtype fp32")
    if spec.ffn_bias:
        raise FlashsimError(f"{spec.name}: FFN biases are not supported by model mode")


FFN_WEIGHTS = ("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")


def load_resident(model: Any, store: Any) -> int:
    """Copy the store's resident tensors (attention, norms, embeddings, lm_head) into the model, so a
    model-mode run computes with the store's bytes, not the source model's; the FFN weights are read
    from the store's bundles by the run itself. Returns the tensors copied; FlashsimError when the
    store lacks one the model needs or a shape differs."""
    import torch

    from real.weights.safetensors_io import read_safetensors

    if not store.manifest.resident.complete:
        raise FlashsimError(f"store {store.path}: its resident tensors are incomplete (a shape-mode store); "
                            "model mode needs a store written by `flashsim real convert --model`")
    tensors, _ = read_safetensors(store.resident_path())
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    n = 0
    with torch.no_grad():
        for name, param in model.state_dict().items():
            if name.endswith(FFN_WEIGHTS) or (tied and name == "lm_head.weight"):
                continue
            if name not in tensors:
                raise FlashsimError(f"{store.resident_path()}: tensor {name!r} is missing; re-create the store")
            arr = np.asarray(tensors[name][1])
            if tuple(arr.shape) != tuple(param.shape):
                raise FlashsimError(f"{store.resident_path()}: tensor {name!r} has shape {list(arr.shape)}, the "
                                    f"model needs {list(param.shape)}; the store is of another model")
            param.copy_(torch.from_numpy(decode(arr, store.dtype).reshape(arr.shape)))
            n += 1
    return n


def _mlps(model: Any) -> list[Any]:
    try:
        return [layer.mlp for layer in model.model.layers]
    except AttributeError:
        raise FlashsimError("model mode needs a llama-family model (model.model.layers[i].mlp)") from None


def dense_pass(model: Any, token_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(logits float32 [T, V], FFN activations float32 [L, T, N], FFN inputs x float32 [L, T, d]) of
    the dense model (x: each layer's `mlp` input, i.e. after the post-attention norm)."""
    import torch

    mlps = _mlps(model)
    acts: list[Any] = [None] * len(mlps)
    xs: list[Any] = [None] * len(mlps)
    hooks = []
    for i, mlp in enumerate(mlps):
        def hook(mod: Any, inp: Any, out: Any, i: int = i) -> None:
            acts[i] = inp[0][0].detach().float().numpy().copy()

        def xhook(mod: Any, inp: Any, i: int = i) -> None:
            xs[i] = inp[0][0].detach().float().numpy().copy()
        hooks.append(mlp.down_proj.register_forward_hook(hook))
        hooks.append(mlp.register_forward_pre_hook(xhook))
    try:
        with torch.no_grad():
            out = model(torch.as_tensor(token_ids[None, :], dtype=torch.long), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return out.logits[0].float().numpy(), np.stack(acts), np.stack(xs)


def dense_incremental_logits(model: Any, token_ids: np.ndarray) -> np.ndarray:
    """float32 [T, V]: the dense HF model fed one token at a time with its KV cache: the same
    attention code path as the real run, so only the FFN differs between the two."""
    import torch

    past, out_logits, arg = None, [], _cache_arg(model)
    with torch.no_grad():
        for s in range(len(token_ids)):
            out, past = _decode_step(model, token_ids[None, s:s + 1], past, arg)
            out_logits.append(out.logits[0, -1].float().numpy())
    return np.stack(out_logits)


def write_oracle_trace(out: str | Path, spec: ModelSpec, token_ids: np.ndarray, acts: np.ndarray,
                       keep_fraction: float) -> Path:
    """The dense activations as a trace (every token a decode step of one prompt, rule topk)."""
    from traces.build import write_dense_trace
    from traces.format import PromptInfo

    T = len(token_ids)
    prompts = [PromptInfo(id="text", task="model-mode", n_prompt_tokens=0, n_generated_tokens=T)]
    return write_dense_trace(out, spec, acts, token_ids.astype(np.int32), np.ones(T, np.uint8),
                             np.zeros(T, np.int32), prompts, rule="topk", target_fraction=keep_fraction,
                             provenance={"kind": "model-mode oracle (dense activations)"}, overwrite=True)


@dataclass
class DenseReference:
    """What the untimed dense pass gives every predictor's run of the same text."""

    token_ids: np.ndarray        # int64 [T]
    full_logits: np.ndarray      # float32 [T, V]: one-shot full-sequence forward
    dense_logits: np.ndarray     # float32 [T, V]: token by token with the KV cache (the real run's path)
    ffn_inputs: np.ndarray       # float32 [L, T, d]: each layer's FFN input x
    truth: np.ndarray            # bool [L, T, N]: the true active sets (rule topk, keep_fraction)
    trace: Any                   # the oracle trace (masks = truth) the runs are planned from
    keep_fraction: float
    workdir: Path


def prepare(model: Any, spec: ModelSpec, store: Any, token_ids: np.ndarray, *, keep_fraction: float,
            workdir: str | Path) -> DenseReference:
    """Dense passes (untimed) and the oracle trace of the true active sets."""
    from traces.format import open_trace

    check_store_matches(store, spec)
    if not 0 < keep_fraction <= 1:
        raise FlashsimError(f"--keep {keep_fraction}: must be in (0, 1]")
    load_resident(model, store)
    token_ids = np.asarray(token_ids, np.int64)
    if len(token_ids) < 2:
        raise FlashsimError("model mode needs a text of at least 2 tokens")
    full_logits, acts, xs = dense_pass(model, token_ids)
    dense_logits = dense_incremental_logits(model, token_ids)
    workdir = Path(workdir)
    trace = open_trace(write_oracle_trace(workdir / "oracle-trace", spec, token_ids, acts, keep_fraction))
    truth = np.stack([trace.mask(layer) for layer in range(trace.n_layers)])
    return DenseReference(token_ids, full_logits, dense_logits, xs, truth, trace, keep_fraction, workdir)


class _Live:
    """The low-rank predictor evaluated on the sparse run's own FFN inputs (torch, timed inside the
    step like any other compute); counts its agreement (Jaccard) with the sets the run used."""

    def __init__(self, pred: Any, used: np.ndarray):
        import torch

        self.torch = torch
        self.A = torch.from_numpy(pred.A)
        self.B = torch.from_numpy(pred.B)
        self.b = torch.from_numpy(pred.bias)
        from real.studies.predictor_train import logit_of

        self.cut = logit_of(pred.threshold)
        self.used = used
        self.jaccard: list[float] = []

    def __call__(self, layer: int, step: int, x: Any) -> None:
        xf = x.reshape(-1, x.shape[-1]).float()
        live = (((xf @ self.A[layer]) @ self.B[layer] + self.b[layer]) >= self.cut)[-1].numpy()
        used = self.used[layer, step]
        union = int((live | used).sum())
        self.jaccard.append(int((live & used).sum()) / union if union else 1.0)


def _sparse_mlp(ex: RealExecutor, layer: int, live: _Live | None = None) -> Any:
    """A torch module standing in for a decoder layer's `mlp`: calls the executor's store-backed FFN
    (after the live predictor, when there is one)."""
    import torch

    class SparseMlp(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            shape = x.shape
            if live is not None:
                live(layer, ex.step, x)
            return ex.ffn(layer, x.reshape(-1, shape[-1])).reshape(shape)

    return SparseMlp()


def run_model(model: Any, spec: ModelSpec, store: Any, token_ids: np.ndarray, profile: DeviceProfile,
              config: RunConfig, *, keep_fraction: float, workdir: str | Path, device: str = "cpu",
              threads: int | None = None, predictor: str | None = None) -> tuple[RealRun, dict]:
    """Dense oracle pass, then the real token-by-token run. Returns (run, quality).
    predictor: oracle | previous | lowrank:FILE, or None to keep the config's predictor slot."""
    ref = prepare(model, spec, store, token_ids, keep_fraction=keep_fraction, workdir=workdir)
    return run_prepared(ref, model, spec, store, profile, config, predictor=predictor, device=device, threads=threads)


def run_prepared(ref: DenseReference, model: Any, spec: ModelSpec, store: Any, profile: DeviceProfile,
                 config: RunConfig, *, predictor: str | None = None, device: str = "cpu",
                 threads: int | None = None) -> tuple[RealRun, dict]:
    """One real run of the prepared text under `config` with the given predictor."""
    import torch

    from real.runtime.predictors import (
        config_overrides,
        lowrank_masks,
        parse_predictor,
        previous_masks,
        set_quality,
        write_mask_trace,
    )

    check_store_matches(store, spec)
    token_ids = ref.token_ids
    notes: list[str] = []
    live = None
    if predictor is None and not config.predictor.instantiate().sets_from_the_model():
        # a predictor simulated from statistics (the presets' noisy one) has no sets a real model can
        # compute: run the true active sets, and say so (a real predictor: --predictor lowrank:FILE)
        notes.append(f"the configuration's {config.predictor.name} predictor is simulated from statistics; "
                     "model mode ran the ORACLE instead (--predictor lowrank:FILE runs a real one)")
        predictor = "oracle"
    if predictor is None:
        label = config.predictor.name
        used = ref.truth
        if label == "oracle":
            notes.append(ORACLE_NOTE)
    else:
        choice = parse_predictor(predictor)
        label = choice.label
        tag = f"{choice.kind}-{hashlib.sha256(choice.label.encode()).hexdigest()[:8]}"
        if choice.kind == "oracle":
            used = ref.truth
            notes.append(ORACLE_NOTE)
            config = config.with_overrides(config_overrides(choice, None, 0))   # an oracle slot keeps its rank
        elif choice.kind == "previous":
            used = previous_masks(ref.truth)
            path = write_mask_trace(ref.workdir / f"pred-{tag}", ref.trace, used, spec, {"predictor": label})
            config = config.with_overrides(config_overrides(choice, path, 0))
            notes.append(PREVIOUS_NOTE)
        else:
            from real.studies.predictor_train import check_matches, load_predictor

            pred = load_predictor(choice.path or "")
            check_matches(pred, spec, f"--predictor {predictor}")
            used = lowrank_masks(pred, ref.ffn_inputs)
            path = write_mask_trace(ref.workdir / f"pred-{tag}", ref.trace, used, spec, {"predictor": label})
            config = config.with_overrides(config_overrides(choice, path, pred.rank))
            live = _Live(pred, used)
            ho = pred.meta.get("heldout", {}).get("overall", {})
            notes.append(f"active sets: low-rank predictor {choice.path} (rank {pred.rank}, threshold "
                         f"{pred.threshold:g}, trained on rule {pred.meta.get('sparsity', '?')}, held-out recall "
                         f"{ho.get('recall', float('nan')):.3f} precision {ho.get('precision', float('nan')):.3f}) on the "
                         "dense model's FFN inputs; evaluated live on the run's own inputs too (live_agreement)")
    try:    # the executor plans every step when it is built: a budget too small shows here
        ex = RealExecutor(store, ref.trace, profile, config, device=device, threads=threads)
    except CapacityError as e:
        raise _budget_error(label, e) from None
    layers = model.model.layers
    saved = [layer.mlp for layer in layers]
    logits = []
    try:
        for i, layer in enumerate(layers):
            layer.mlp = _sparse_mlp(ex, i, live)
        past, arg = None, _cache_arg(model)
        with torch.no_grad():
            for s in range(ex.n_steps):
                ex.begin_step(s)
                out, past = _decode_step(model, token_ids[None, s:s + 1], past, arg)
                logits.append(out.logits[0, -1].float().numpy())
                ex.end_step()
        run = ex.finish()
    except BaseException:
        ex.close()
        raise
    finally:
        for layer, mlp in zip(layers, saved):
            layer.mlp = mlp
    run.notes.extend(notes)
    run.config["model_predictor"] = label
    real = np.stack(logits)
    run.outputs = [real]
    n = len(real)
    dense_logits, full_logits = ref.dense_logits, ref.full_logits
    quality = {
        "predictor": label, "tokens": n, "keep_fraction": ref.keep_fraction,
        **set_quality(used[:, :n], ref.truth[:, :n]),
        "max_abs_diff": float(np.abs(real - dense_logits[:n]).max()),
        "max_abs_diff_full_forward": float(np.abs(real - full_logits[:n]).max()),
        "greedy_agreement": float(np.mean(real.argmax(-1) == dense_logits[:n].argmax(-1))),
        "perplexity": _perplexity(real[:-1], token_ids[1:n]),
        "dense_perplexity": _perplexity(dense_logits[: n - 1], token_ids[1:n]),
    }
    if live is not None:
        quality["live_agreement"] = float(np.mean(live.jaccard)) if live.jaccard else 1.0
    return run, quality


def _budget_error(label: str, e: CapacityError) -> FlashsimError:
    return FlashsimError(f"DRAM budget too small for predictor {label} at step {e.step}: layer {e.layer} computes "
                         f"{e.need} neurons but its share of the cache holds {e.cap}; raise --dram-budget or use a "
                         "sparser predictor")


def _perplexity(logits: np.ndarray, targets: np.ndarray) -> float:
    if len(targets) == 0:
        return float("nan")
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    nll = -logp[np.arange(len(targets)), targets].mean()
    return float(math.exp(nll))
