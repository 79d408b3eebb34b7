"""`capture_trace`: run prompts through a real model with FFN hooks and write a trace.

Order of work: tokenize every prompt (chat template when the tokenizer has one), then per prompt
prefill + decode with hooks copying activations into one preallocated fp32 buffer, hand the rows
to an `ActivationStore`, and finally apply the sparsity rule over all tokens and write the trace
atomically. Nothing is written until every prompt has run; an exception (or Ctrl-C) at any point
leaves no trace directory behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import platform
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

import numpy as np

from devices.errors import FlashsimError
from devices.progress import Stage
from traces.capture.assemble import ActivationStore, default_rule
from traces.capture.generate import Decoder, encode_prompt, eos_token_ids
from traces.capture.hooks import FfnRecorder
from traces.capture.models import LoadedModel
from traces.capture.prompts import Prompt
from traces.format import PromptInfo
from traces.sparsity import parse_rule


def library_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("flashsim", "numpy", "torch", "transformers", "gguf", "safetensors"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[dist] = metadata.version(dist)
    return out


def prompt_seed(seed: int, prompt_id: str) -> np.random.SeedSequence:
    """The sampling stream of one prompt: keyed by the prompt's id, so any subset of a prompt file
    (--limit-prompts, a reordered file) samples the same tokens for the same prompt and seed."""
    key = int.from_bytes(hashlib.sha256(prompt_id.encode()).digest()[:8], "little")
    return np.random.SeedSequence([seed, key])


def capture_trace(loaded: LoadedModel, prompts: Sequence[Prompt], out: str | Path, *, max_new_tokens: int,
                  sparsity: str | None = None, magnitude_fraction: float | None = None, seed: int = 0,
                  temperature: float = 0.0, chat_template: bool = True, provenance: dict | None = None,
                  progress: bool = True, overwrite: bool = False) -> Path:
    """Capture `prompts` through `loaded.model` into a trace at `out`. Returns its path.

    sparsity: 'relu' | 'threshold:F' | 'topk:F' (None: `default_rule(spec)`); magnitude_fraction:
    share of neurons whose |a| is stored per token (None: just enough to re-derive the masks).
    """
    import torch

    spec = loaded.spec
    if max_new_tokens < 0:
        raise FlashsimError(f"--max-new-tokens must be >= 0, got {max_new_tokens}")
    if not prompts:
        raise FlashsimError("no prompts to capture")
    rule, target = parse_rule(sparsity) if sparsity else default_rule(spec)
    if rule == "relu" and spec.ffn_kind != "relu":
        print(f"flashsim: note: --sparsity relu on a {spec.ffn_kind} model marks every a > 0 active "
              "(about half the neurons); threshold:F or topk:F are the usual rules here", file=sys.stderr)
    if magnitude_fraction is not None and not 0 <= magnitude_fraction <= 1:
        raise FlashsimError(f"--magnitude-fraction must be in [0, 1], got {magnitude_fraction}")
    if Path(out).exists() and not overwrite:
        raise FlashsimError(f"{out}: already exists; choose another --out or remove it")

    encoded = [encode_prompt(loaded.tokenizer, p.text, chat_template) for p in prompts]
    for p, ids in zip(prompts, encoded):
        if not ids:
            raise FlashsimError(f"prompt {p.id!r}: tokenizes to nothing")
    L, N = spec.n_layers, spec.d_ff
    recorder = FfnRecorder(loaded.model, N)
    if recorder.n_layers != L:
        raise FlashsimError(f"{spec.name}: the model has {recorder.n_layers} FFN layers, its config says {L}")
    decoder = Decoder(loaded.model, eos_token_ids(loaded.model, loaded.tokenizer), temperature)
    children = [prompt_seed(seed, p.id) for p in prompts]
    buffer = torch.zeros((L, max(len(ids) for ids in encoded) + max_new_tokens, N), dtype=torch.float32)
    store = ActivationStore(L, N)
    infos: list[PromptInfo] = []
    total = sum(len(ids) for ids in encoded) + len(prompts) * max_new_tokens
    # A bar on a terminal, one line at the end in a log (devices/progress.py).
    with Stage(f"capture {spec.name}", total, "tokens", enabled=progress) as bar, recorder:
        for prompt, ids, child in zip(prompts, encoded, children):
            recorder.reset(buffer)
            bar.set_postfix(prompt.id)
            bar.update(len(ids))  # the prefill pass starts now
            generated = decoder.run(ids, max_new_tokens, np.random.default_rng(child),
                                    on_token=lambda _t: bar.update(1))
            bar.update(max_new_tokens - len(generated))
            n = len(ids) + len(generated)
            if recorder.n_recorded != n:
                raise RuntimeError(f"recorded {recorder.n_recorded} positions for {n} tokens")
            store.add(np.array(ids + generated, np.int32), len(ids), buffer[:, :n].numpy())
            infos.append(PromptInfo(id=prompt.id, task=prompt.task, text=prompt.text,
                                    n_prompt_tokens=len(ids), n_generated_tokens=len(generated)))
    prov = {
        "model": spec.name, "model_source": loaded.source, "seed": seed,
        "decoding": {"max_new_tokens": max_new_tokens, "temperature": temperature,
                     "chat_template": bool(chat_template and getattr(loaded.tokenizer, "chat_template", None)),
                     "eos_token_ids": sorted(decoder.eos_ids)},
        "sparsity": sparsity or f"{rule}" + (f":{target}" if target else "") + " (default)",
        "magnitude_fraction": "auto" if magnitude_fraction is None else magnitude_fraction,
        "torch_threads": torch.get_num_threads(),
        "libraries": library_versions(), **(provenance or {}),
    }
    return store.write(out, spec, infos, rule=rule, target_fraction=target, magnitude_fraction=magnitude_fraction,
                       provenance=prov, overwrite=overwrite)

