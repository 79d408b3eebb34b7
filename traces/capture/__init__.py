"""Capture of FFN activation traces from real models (llama/mistral/qwen2 gated; opt/gpt2 ungated).

    from traces.capture import load_hf_model, load_prompts, capture_trace
    loaded = load_hf_model("smollm2-135m")            # or a HF folder, or FILE.gguf
    capture_trace(loaded, load_prompts("builtin"), "out/trace", max_new_tokens=16)

Modules: `models` (locate, load and cache models), `prompts` (JSON-lines prompt files and the
builtin suite), `hooks` (FFN pre-hooks into a preallocated buffer), `generate` (prefill + decode
loop), `assemble` (sparsity rules, stored magnitudes, atomic write), `run` (the whole capture).
Importing this package does not import torch or transformers; the functions do, when called.
"""

from traces.capture.assemble import ActivationStore, default_rule
from traces.capture.models import LoadedModel, load_hf_model, resolve_model_source
from traces.capture.prompts import Prompt, load_prompts
from traces.capture.run import capture_trace

__all__ = ["ActivationStore", "LoadedModel", "Prompt", "capture_trace", "default_rule", "load_hf_model",
           "load_prompts", "resolve_model_source"]
