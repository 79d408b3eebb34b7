"""Block pruning on a real llama-family Hugging Face model: dropped blocks are SKIPPED, not zeroed.

Owns: `skipped_blocks` (a context manager that stops the dropped MHA / FFN modules from computing),
`evaluate_drop_set` / `measure_drop_sets` (perplexity, greedy-token agreement with the dense model and
wall time per forward pass, for a list of dropped sets), and `gsi_prefixes` (drop sets made of the
first k blocks of a GSI file's removal order: its GSI steps, then one-shot order).

Blocks are named as in real/studies/gsi.py and sim/blocks.py: "mha:i" (self-attention of decoder layer i,
with its input norm) and "ffn:i" (the MLP of layer i, with its norm).

How a block is skipped (transformers 5.x, `LlamaDecoderLayer.forward`):
    h = h + self_attn(input_layernorm(h))[0]        # self_attn returns (attn_output, attn_weights)
    h = h + mlp(post_attention_layernorm(h))        # mlp returns a tensor
For the duration of the context, the dropped module's `forward` is replaced (an instance attribute
that shadows the class method, so `nn.Module.__call__` and its hooks still run) by a function that
computes nothing and returns zeros of the hidden-state shape: `(zeros, None)` for attention, as the
decoder layer unpacks `hidden_states, _ = self.self_attn(...)`, and `zeros` for the MLP. So the
projections, RoPE, the attention kernel and the FFN matmuls are not run and the residual stream is
left unchanged: the same function of the input as real/studies/gsi.py's zero-output hooks, which still run
the block. For model types whose layer norms feed only their block (`NORM_SKIP_MODEL_TYPES`: llama,
mistral, qwen2) the block's norm is replaced by the identity as well (its output would only feed the
skipped module). Everything is restored on exit, also when the body raises.

A skipped attention block writes nothing into a KV cache, so the measurements here use
teacher-forced passes with `use_cache=False` (what perplexity needs anyway); decoding with a cache
while mha:0 is skipped would see a cache that reports length 0 for layer 0.

Units: perplexity is exp(mean next-token cross-entropy, nats) over the given token ids; agreement
is the fraction of positions whose argmax token equals the dense model's argmax at that position
(teacher-forced, so every position sees the same prefix); times are seconds per forward pass, wall
clock (median and minimum of `repeats` timed passes, interleaved across configurations, after one
untimed pass per configuration) and process CPU time, on the current torch threads.

torch is imported inside the functions, so importing this module is cheap.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from devices.errors import FlashsimError
from real.studies.gsi import _decoder_layers, block_names, parse_block

# Model types whose decoder layer is the llama layout: input_layernorm feeds only self_attn and
# post_attention_layernorm feeds only the mlp, so a skipped block's norm can be skipped too. Other
# families (e.g. gemma2's post-attention norm is applied to the attention OUTPUT) keep their norms.
NORM_SKIP_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2"})
DEFAULT_REPEATS = 3


def _hidden(args: tuple, kwargs: dict) -> Any:
    h = kwargs.get("hidden_states", kwargs.get("x"))
    if h is None:
        if not args:
            raise RuntimeError("skipped block called without a hidden-state tensor")
        h = args[0]
    return h


def _skip_attention(*args: Any, **kwargs: Any) -> tuple[Any, None]:
    import torch

    return torch.zeros_like(_hidden(args, kwargs)), None


def _skip_mlp(*args: Any, **kwargs: Any) -> Any:
    import torch

    return torch.zeros_like(_hidden(args, kwargs))


def _identity(hidden_states: Any, *args: Any, **kwargs: Any) -> Any:
    return hidden_states


@contextlib.contextmanager
def skipped_blocks(model: Any, blocks: Iterable[str]) -> Iterator[list[str]]:
    """Within the context the named blocks ("mha:i" / "ffn:i") are not computed at all.

    Yields the canonical list of skipped block names (in block order). Restores every replaced
    `forward` on exit, including when the body raises. Names are validated before anything changes.
    """
    layers = _decoder_layers(model)
    parsed = sorted({parse_block(b, len(layers)) for b in blocks}, key=lambda kb: (kb[1], kb[0] != "mha"))
    skip_norms = getattr(getattr(model, "config", None), "model_type", None) in NORM_SKIP_MODEL_TYPES
    replaced: list[tuple[Any, bool, Any]] = []   # (module, had an instance forward, that forward)

    def replace(module: Any, fn: Any) -> None:
        had = "forward" in module.__dict__
        replaced.append((module, had, module.__dict__.get("forward")))
        module.forward = fn

    try:
        for kind, i in parsed:
            layer = layers[i]
            if kind == "mha":
                replace(layer.self_attn, _skip_attention)
                norm = getattr(layer, "input_layernorm", None)
            else:
                replace(layer.mlp, _skip_mlp)
                norm = getattr(layer, "post_attention_layernorm", None)
            if skip_norms and norm is not None:
                replace(norm, _identity)
        yield [f"{k}:{i}" for k, i in parsed]
    finally:
        for module, had, fn in reversed(replaced):
            if had:
                module.forward = fn
            else:
                del module.forward


# ---- measurement ---------------------------------------------------------------------------------------
def _forward_logits(model: Any, input_ids: Any) -> Any:
    import torch

    with torch.inference_mode():
        return model(input_ids=input_ids, use_cache=False).logits[0].float()


def _ppl_from_logits(logits: Any, input_ids: Any) -> float:
    import torch

    nll = float(torch.nn.functional.cross_entropy(logits[:-1], input_ids[0, 1:]))
    if not math.isfinite(nll) or nll > 700:  # exp overflows float64 past ~709 nats
        return math.inf
    return math.exp(nll)


def _time_pass(model: Any, input_ids: Any, blocks: Sequence[str]) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of one forward pass with `blocks` skipped."""
    with skipped_blocks(model, blocks):
        c0, t0 = time.process_time(), time.perf_counter()
        _forward_logits(model, input_ids)
        return time.perf_counter() - t0, time.process_time() - c0


def evaluate_drop_set(model: Any, input_ids: Any, blocks: Sequence[str], dense_argmax: Any) -> dict[str, Any]:
    """Perplexity and agreement with `dense_argmax` [T] with `blocks` skipped (one pass, not timed)."""
    with skipped_blocks(model, blocks) as names:
        logits = _forward_logits(model, input_ids)
    agree = float((logits.argmax(-1) == dense_argmax).float().mean())
    return {"dropped": names, "n_dropped": len(names), "ppl": _ppl_from_logits(logits, input_ids),
            "agreement": agree}


def measure_drop_sets(model: Any, input_ids: Any, drop_sets: Sequence[Sequence[str]],
                      repeats: int = DEFAULT_REPEATS) -> list[dict[str, Any]]:
    """One dict per drop set (same order): dropped, n_dropped, ppl, agreement; wall seconds per pass
    s_per_pass (median), s_per_pass_min, s_per_pass_all (every timed pass); cpu_s_per_pass (median
    process CPU seconds, all torch threads); the dense reference measured in the same call
    (dense_ppl, dense_s_per_pass, dense_s_per_pass_min, dense_cpu_s_per_pass); time_ratio =
    s_per_pass_min / dense_s_per_pass_min and cpu_time_ratio = cpu_s_per_pass / dense_cpu_s_per_pass.
    `input_ids`: int64 [1, T], T >= 2.

    Timing: after one untimed pass per configuration (which gives the logits and warms up), `repeats`
    rounds each time one pass of the dense model and of every drop set in turn. Interleaving makes
    load from other processes fall on every configuration alike. On a shared machine a pass's wall
    time is its work plus time spent waiting for a core, which only adds: so the fastest pass (min)
    is the best estimate of the uncontended time and the ratios use it; process CPU time does not
    count the waiting at all (it does count threads spinning while they wait for each other)."""
    if int(input_ids.shape[-1]) < 2:
        raise FlashsimError(f"evaluation text has {int(input_ids.shape[-1])} token(s); perplexity needs at least 2")
    if repeats < 1:
        raise FlashsimError(f"repeats {repeats}: must be >= 1")
    n_layers = len(_decoder_layers(model))
    for s in drop_sets:  # validate every set before the first (slow) pass
        for b in s:
            parse_block(b, n_layers)
    dense_logits = _forward_logits(model, input_ids)
    dense_argmax = dense_logits.argmax(-1)
    dense_ppl = _ppl_from_logits(dense_logits, input_ids)
    out = [evaluate_drop_set(model, input_ids, s, dense_argmax) for s in drop_sets]
    configs: list[Sequence[str]] = [[], *drop_sets]
    wall: list[list[float]] = [[] for _ in configs]
    cpu: list[list[float]] = [[] for _ in configs]
    for _ in range(repeats):
        for i, blocks in enumerate(configs):
            w, c = _time_pass(model, input_ids, blocks)
            wall[i].append(w)
            cpu[i].append(c)
    dense_min, dense_cpu = min(wall[0]), statistics.median(cpu[0])
    for r, w, c in zip(out, wall[1:], cpu[1:]):
        r.update(s_per_pass=statistics.median(w), s_per_pass_min=min(w), s_per_pass_all=w,
                 cpu_s_per_pass=statistics.median(c), dense_ppl=dense_ppl,
                 dense_s_per_pass=statistics.median(wall[0]), dense_s_per_pass_min=dense_min,
                 dense_cpu_s_per_pass=dense_cpu,
                 time_ratio=min(w) / dense_min if dense_min > 0 else math.nan,
                 cpu_time_ratio=statistics.median(c) / dense_cpu if dense_cpu > 0 else math.nan)
    return out


def gsi_prefixes(doc: dict[str, Any], steps: Sequence[int]) -> list[list[str]]:
    """The first k blocks of a GSI file's removal order, for each k in `steps` (0 <= k <= 2L).

    The removal order is the one the controllers use (adapt.importance.removal_order): the file's
    greedy GSI steps, then the blocks GSI did not reach by ascending one-shot perplexity. So a file
    made with `--steps N` gives exact GSI prefixes up to k = N and one-shot order beyond."""
    from adapt.importance import removal_order

    names = block_names(int(doc["model"]["n_layers"]))
    order = [names[i] for i in removal_order(doc, names)]
    for k in steps:
        if not 0 <= k <= len(order):
            raise FlashsimError(f"--gsi-steps {k}: must be between 0 and {len(order)} (the model's blocks)")
    return [order[:k] for k in steps]


__all__ = ["DEFAULT_REPEATS", "NORM_SKIP_MODEL_TYPES", "block_names", "evaluate_drop_set", "gsi_prefixes",
           "measure_drop_sets", "skipped_blocks"]
