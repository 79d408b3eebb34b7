"""One prompt through a causal LM, token by token, with a KV cache: prefill then decode.

The loop is written out (not `model.generate`) so that decoding is exactly what the trace says it
is: greedy (temperature 0) or sampled from softmax(logits / temperature) with a seeded NumPy
generator (no global RNG). Every generated token, including a final end-of-sequence token, is fed
back once, so a prompt of P tokens that generates G tokens runs P + G token positions through
the model (one prefill pass of P tokens, then G single-token passes) and the trace has exactly
P prefill rows and G decode rows; the logits of the last pass are not used.

torch is imported inside the functions.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from devices.errors import FlashsimError


def encode_prompt(tokenizer: Any, text: str, chat_template: bool = True) -> list[int]:
    """Token ids of one user prompt, wrapped in the tokenizer's chat template when it has one."""
    if chat_template and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        ids = tokenizer(text)["input_ids"]
    return [int(i) for i in ids]


def eos_token_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """Every id that ends a generation (tokenizer eos plus the generation config's eos list)."""
    ids: set[int] = set()
    for value in (getattr(tokenizer, "eos_token_id", None),
                  getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return frozenset(ids)


class Decoder:
    """Runs prompts through `model` (batch 1, KV cache): `run(input_ids, max_new_tokens, rng)`."""

    def __init__(self, model: Any, eos_ids: frozenset[int] = frozenset(), temperature: float = 0.0):
        if not (math.isfinite(temperature) and temperature >= 0):
            raise FlashsimError(f"--temperature must be a number >= 0, got {temperature}")
        self.model, self.eos_ids, self.temperature = model, eos_ids, temperature
        params = inspect.signature(model.forward).parameters
        # transformers 5 calls the KV cache argument `cache`; 4.x called it `past_key_values`.
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._prefill_kw = {"logits_to_keep": 1} if "logits_to_keep" in params else {}

    def _next(self, logits: Any, rng: np.random.Generator | None) -> int:
        if self.temperature == 0:
            return int(logits.argmax())
        z = logits.double().numpy() / self.temperature
        p = np.exp(z - z.max())
        p /= p.sum()
        if rng is None:
            raise ValueError("sampling needs a seeded generator")
        return int(rng.choice(p.size, p=p))

    def run(self, input_ids: Sequence[int], max_new_tokens: int, rng: np.random.Generator | None = None,
            on_token: Callable[[int], None] | None = None) -> list[int]:
        """Generated token ids (at most max_new_tokens; stops after an end-of-sequence token)."""
        import torch

        with torch.inference_mode():
            out = self.model(input_ids=torch.tensor([list(input_ids)]), use_cache=True, **self._prefill_kw)
            generated: list[int] = []
            for _ in range(max_new_tokens):
                token = self._next(out.logits[0, -1], rng)
                generated.append(token)
                cache = out[self._cache_arg] if self._cache_arg in out else out.get("past_key_values")
                out = self.model(input_ids=torch.tensor([[token]]), use_cache=True, **{self._cache_arg: cache})
                if on_token is not None:
                    on_token(token)
                if token in self.eos_ids:
                    break
        return generated
