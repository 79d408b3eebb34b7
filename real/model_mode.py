"""Model mode: a llama-family Hugging Face model (SmolLM2, ...) decoded token by token with its
attention, norms and embeddings resident (the HF modules themselves, fp32 torch) and every layer's
FFN replaced by the store-backed sparse FFN (`real.backend.RealExecutor.ffn`) under the policy
stack. Units: seconds, bytes; logits are fp32.

Active sets (the `needed` sets the policies see) come from an **oracle** pass: the dense model
runs the same tokens once, untimed, and its FFN activations |act(gate x) * (up x)| give each
token's active set by the trace rule (`topk` with a target fraction; 1.0 keeps every neuron). That
is an oracle (it sees the dense activations) and is flagged so in the run's notes. Predictors in
the policy stack then choose what is computed from those sets (oracle: all of them).

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

import math
from pathlib import Path
from typing import Any

import numpy as np

from devices.errors import FlashsimError
from devices.model_spec import ModelSpec
from devices.schema import DeviceProfile
from real.backend import RealExecutor, RealRun
from sim.config import RunConfig

ORACLE_NOTE = ("active sets: ORACLE (dense gate/up activations of the same tokens, computed from the "
               "resident model before the run)")


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


def _mlps(model: Any) -> list[Any]:
    try:
        return [layer.mlp for layer in model.model.layers]
    except AttributeError:
        raise FlashsimError("model mode needs a llama-family model (model.model.layers[i].mlp)") from None


def dense_pass(model: Any, token_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(logits float32 [T, V], FFN activations float32 [L, T, N]) of the dense model."""
    import torch

    mlps = _mlps(model)
    acts: list[Any] = [None] * len(mlps)
    hooks = []
    for i, mlp in enumerate(mlps):
        def hook(mod: Any, inp: Any, out: Any, i: int = i) -> None:
            acts[i] = inp[0][0].detach().float().numpy().copy()
        hooks.append(mlp.down_proj.register_forward_hook(hook))
    try:
        with torch.no_grad():
            out = model(torch.as_tensor(token_ids[None, :], dtype=torch.long), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return out.logits[0].float().numpy(), np.stack(acts)


def dense_incremental_logits(model: Any, token_ids: np.ndarray) -> np.ndarray:
    """float32 [T, V]: the dense HF model fed one token at a time with its KV cache: the same
    attention code path as the real run, so only the FFN differs between the two."""
    import torch

    past, out_logits = None, []
    with torch.no_grad():
        for s in range(len(token_ids)):
            out = model(torch.as_tensor(token_ids[None, s:s + 1]), past_key_values=past, use_cache=True)
            past = out.past_key_values
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


def _sparse_mlp(ex: RealExecutor, layer: int) -> Any:
    """A torch module standing in for a decoder layer's `mlp`: calls the executor's store-backed FFN."""
    import torch

    class SparseMlp(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            shape = x.shape
            return ex.ffn(layer, x.reshape(-1, shape[-1])).reshape(shape)

    return SparseMlp()


def run_model(model: Any, spec: ModelSpec, store: Any, token_ids: np.ndarray, profile: DeviceProfile,
              config: RunConfig, *, keep_fraction: float, workdir: str | Path, device: str = "cpu",
              threads: int | None = None) -> tuple[RealRun, dict]:
    """Dense oracle pass, then the real token-by-token run. Returns (run, quality)."""
    import torch

    from traces.format import open_trace

    check_store_matches(store, spec)
    if not 0 < keep_fraction <= 1:
        raise FlashsimError(f"--keep {keep_fraction}: must be in (0, 1]")
    token_ids = np.asarray(token_ids, np.int64)
    if len(token_ids) < 2:
        raise FlashsimError("model mode needs a text of at least 2 tokens")
    full_logits, acts = dense_pass(model, token_ids)
    dense_logits = dense_incremental_logits(model, token_ids)
    trace = open_trace(write_oracle_trace(Path(workdir) / "oracle-trace", spec, token_ids, acts, keep_fraction))
    ex = RealExecutor(store, trace, profile, config, device=device, threads=threads)
    layers = model.model.layers
    saved = [layer.mlp for layer in layers]
    logits = []
    try:
        for i, layer in enumerate(layers):
            layer.mlp = _sparse_mlp(ex, i)
        past = None
        with torch.no_grad():
            for s in range(ex.n_steps):
                ex.begin_step(s)
                out = model(torch.as_tensor(token_ids[None, s:s + 1]), past_key_values=past, use_cache=True)
                past = out.past_key_values
                logits.append(out.logits[0, -1].float().numpy())
                ex.end_step()
        run = ex.finish()
    except BaseException:
        ex.close()
        raise
    finally:
        for layer, mlp in zip(layers, saved):
            layer.mlp = mlp
    run.notes.append(ORACLE_NOTE)
    real = np.stack(logits)
    run.outputs = [real]
    n = len(real)
    quality = {
        "tokens": n, "keep_fraction": keep_fraction,
        "max_abs_diff": float(np.abs(real - dense_logits[:n]).max()),
        "max_abs_diff_full_forward": float(np.abs(real - full_logits[:n]).max()),
        "greedy_agreement": float(np.mean(real.argmax(-1) == dense_logits[:n].argmax(-1))),
        "perplexity": _perplexity(real[:-1], token_ids[1:n]),
        "dense_perplexity": _perplexity(dense_logits[: n - 1], token_ids[1:n]),
    }
    return run, quality


def _perplexity(logits: np.ndarray, targets: np.ndarray) -> float:
    if len(targets) == 0:
        return float("nan")
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    nll = -logp[np.arange(len(targets)), targets].mean()
    return float(math.exp(nll))
