"""Greedy Sequential Importance (GSI) of the MHA and FFN blocks of a real llama-family model.

Owns: dropping blocks from a loaded Hugging Face model (`dropped_blocks`), teacher-forced perplexity
on a calibration text (`perplexity`), the GSI ordering and the one-shot ordering (`run_gsi`), and the
JSON file that records them (`write_gsi_file` / `read_gsi_file`).

A *block* is the self-attention (MHA) or the feed-forward network (FFN) of one decoder layer, named
"mha:i" or "ffn:i" (i = layer index from 0). Dropping a block means its output adds nothing to the
residual stream: a forward hook replaces the module's output tensor with zeros (the block still
runs, so dropping saves no time here; the simulator accounts the savings). Hooks are removed on exit.

Perplexity is exp(mean next-token cross-entropy, nats) of one teacher-forced forward pass over the
first `max_tokens` tokens of the text (no BOS added; the model sees exactly those tokens).

GSI (RAP): with D = set of dropped blocks (empty at first), score every remaining block b by the
perplexity with D + {b} dropped, drop the block with the lowest score (ties: the earliest in the order
mha:0, ffn:0, mha:1, ...), repeat. Step k costs (2L - k) forward passes, so all 2L steps cost
O(L^2) passes. The first GSI step's scores are the one-shot scores (each block removed alone), which
are reused rather than recomputed.

Output file (JSON, written atomically: temp name then os.replace), schema_version 1 (the reader,
validator and writer are in adapt/importance.py so the simulator reads these files without
importing real; they are re-exported here):
  schema_version: 1
  model:          model name (e.g. "smollm2-135m") and n_layers
  text:           {source: "builtin" | path, sha256: hex digest of the UTF-8 text, n_tokens: tokens scored}
  dense_ppl:      perplexity with no block dropped
  gsi:            [{block: "ffn:12", ppl_after: float}, ...] in removal order; ppl_after is the
                  perplexity with this block and all earlier ones dropped
  one_shot:       [{block, ppl_alone: float}, ...] every block, sorted ascending by ppl_alone (ties
                  in block order)
A non-finite perplexity (the model diverged) is written as null. The file holds no timings, so the
same model, text and settings give a byte-identical file.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from adapt.importance import (
    SCHEMA_VERSION,
    make_gsi_document,
    read_gsi_file,
    write_gsi_file,
)
from devices.errors import FlashsimError
from sim.blocks import KINDS, block_names

__all__ = ["BUILTIN_TEXT", "KINDS", "SCHEMA_VERSION", "GsiResult", "block_names", "dropped_blocks", "gsi_document",
           "parse_block", "perplexity", "read_gsi_file", "run_gsi", "tokenize_text", "write_gsi_file"]

# Written for this project: a plain English paragraph (~300 tokens with SmolLM2's tokenizer) on a
# neutral subject, so the perplexity reflects general language modelling rather than one domain.
BUILTIN_TEXT = (
    "The old lighthouse at the end of the harbour has not guided a ship for more than forty years, "
    "but the town still keeps it painted white and red. Every spring a group of volunteers climbs the "
    "narrow stairs with buckets, brushes and ladders, and for a week the whole street smells of fresh "
    "paint. Children gather at the foot of the tower to watch, and the baker on the corner sends up "
    "bread and coffee in a basket tied to a long rope. Nobody remembers exactly when this tradition "
    "began. Some say it started after a storm broke the lamp and the keeper refused to leave until it "
    "was repaired; others say it was simply a way for neighbours to meet after a long winter. The "
    "museum in the town hall has a few photographs from those early years: men in heavy coats, women "
    "holding umbrellas against the wind, and a dog that appears in almost every picture. Today the "
    "lighthouse is mostly a place for visitors. They walk along the stone pier, read the small sign "
    "that explains how the light once turned, and take pictures of the sunset over the water. In the "
    "evening the fishing boats come back one by one, their engines quiet, and the gulls follow them "
    "into the harbour. When the weather is clear you can see the islands on the horizon, and on very "
    "calm nights the reflection of the tower stretches almost all the way to the boats. The people "
    "who live here say that as long as the lighthouse stands, the town will know where it is."
)


def parse_block(name: str, n_layers: int) -> tuple[str, int]:
    kind, _, idx = name.partition(":")
    if kind not in KINDS or not idx.isdigit() or not 0 <= int(idx) < n_layers:
        raise FlashsimError(f"block {name!r}: expected mha:I or ffn:I with 0 <= I < {n_layers}")
    return kind, int(idx)


def _decoder_layers(model: Any) -> Any:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise FlashsimError(f"{type(model).__name__}: not a llama-family model (no model.layers); "
                            "GSI needs decoder layers with .self_attn and .mlp")
    return layers


def _zero_output(_module: Any, _inputs: Any, output: Any) -> Any:
    """Forward hook: the same structure as `output` with its hidden-state tensor replaced by zeros."""
    import torch

    if isinstance(output, tuple):
        return (torch.zeros_like(output[0]),) + tuple(output[1:])
    return torch.zeros_like(output)


@contextlib.contextmanager
def dropped_blocks(model: Any, blocks: Iterable[str]) -> Iterator[None]:
    """Within the context, the named blocks ("mha:i" / "ffn:i") add nothing to the residual stream."""
    layers = _decoder_layers(model)
    handles = []
    try:
        for name in blocks:
            kind, i = parse_block(name, len(layers))
            module = layers[i].self_attn if kind == "mha" else layers[i].mlp
            handles.append(module.register_forward_hook(_zero_output))
        yield
    finally:
        for h in handles:
            h.remove()


def tokenize_text(tokenizer: Any, text: str, max_tokens: int) -> Any:
    """[1, T] token ids of the first `max_tokens` tokens of `text` (no special tokens added)."""
    import torch

    ids = tokenizer(text, add_special_tokens=False)["input_ids"][:max_tokens]
    if len(ids) < 2:
        raise FlashsimError(f"calibration text has {len(ids)} token(s); perplexity needs at least 2")
    return torch.tensor([ids], dtype=torch.long)


def perplexity(model: Any, input_ids: Any) -> float:
    """exp(mean next-token cross-entropy in nats) of one teacher-forced pass; inf if not finite."""
    import torch

    with torch.no_grad():
        logits = model(input_ids=input_ids, use_cache=False).logits[0, :-1].float()
        nll = torch.nn.functional.cross_entropy(logits, input_ids[0, 1:])
    value = float(nll)
    if not math.isfinite(value) or value > 700:  # exp overflows float64 past ~709 nats
        return math.inf
    return math.exp(value)


@dataclass
class GsiResult:
    dense_ppl: float
    gsi: list[tuple[str, float]]            # (block, ppl with it and all earlier ones dropped)
    one_shot: list[tuple[str, float]]       # (block, ppl with it alone dropped), ascending
    n_passes: int = 0
    seconds: float = 0.0

    @property
    def seconds_per_pass(self) -> float:
        return self.seconds / self.n_passes if self.n_passes else 0.0


def _argmin(scores: dict[str, float], order: Sequence[str]) -> str:
    """Lowest score; inf/nan count as worst; ties go to the earliest block in `order`."""
    def key(b: str) -> tuple[float, int]:
        s = scores[b]
        return (s if math.isfinite(s) else math.inf, order.index(b))
    return min(scores, key=key)


def run_gsi(model: Any, input_ids: Any, steps: int | None = None,
            progress: Callable[[int, str, float], None] | None = None) -> GsiResult:
    """GSI for `steps` removals (default all 2L blocks) plus the one-shot ordering."""
    t0 = time.perf_counter()
    order = block_names(len(_decoder_layers(model)))
    steps = len(order) if steps is None else steps
    if not 1 <= steps <= len(order):
        raise FlashsimError(f"--steps {steps}: must be between 1 and {len(order)} (2 x {len(order) // 2} layers)")
    n_passes = 1
    dense = perplexity(model, input_ids)
    alone: dict[str, float] = {}
    for b in order:
        with dropped_blocks(model, [b]):
            alone[b] = perplexity(model, input_ids)
        n_passes += 1
    one_shot = sorted(alone.items(), key=lambda kv: (kv[1] if math.isfinite(kv[1]) else math.inf,
                                                     order.index(kv[0])))
    dropped: list[str] = []
    gsi: list[tuple[str, float]] = []
    scores = dict(alone)  # step 1's scores are the one-shot scores
    for step in range(steps):
        if step > 0:
            scores = {}
            for b in order:
                if b in dropped:
                    continue
                with dropped_blocks(model, [*dropped, b]):
                    scores[b] = perplexity(model, input_ids)
                n_passes += 1
        best = _argmin(scores, order)
        dropped.append(best)
        gsi.append((best, scores[best]))
        if progress:
            progress(step + 1, best, scores[best])
    return GsiResult(dense, gsi, one_shot, n_passes, time.perf_counter() - t0)


# ---- file (format and reader/writer live in adapt.importance) ---------------------------------------
def gsi_document(result: GsiResult, *, model_name: str, n_layers: int, text: str, text_source: str,
                 n_tokens: int) -> dict[str, Any]:
    return make_gsi_document(dense_ppl=result.dense_ppl, gsi=result.gsi, one_shot=result.one_shot,
                             model_name=model_name, n_layers=n_layers,
                             text_sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(),
                             text_source=text_source, n_tokens=n_tokens)
