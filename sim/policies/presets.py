"""Presets: the papers' configurations as slot fillings (any part can be changed with --set).

LLM in a flash's ablation (Table 2 of the paper, OPT-6.7B on the M1 Max) runs as:

    naive         --preset naive [--set memory.stream_non_ffn=true: the paper's naive reads the whole model]
    hybrid        --preset hybrid
    +predictor    --preset llm-in-a-flash --set window.k=0 --set bundling.bundled=false
    +windowing    --preset llm-in-a-flash --set bundling.bundled=false
    +bundling     --preset llm-in-a-flash

Presets only choose policies and their parameters; every default lives on its parameter.
"""

from __future__ import annotations

from typing import Any

from devices.errors import FlashsimError
from devices.suggest import hint
from sim.config import PolicyChoice, RunConfig
from sim.policies.registry import SLOTS

PRESETS: dict[str, dict[str, Any]] = {
    "naive": {
        "description": "read every FFN weight from flash every token (LLM in a flash's naive baseline)",
        "residency": "naive", "predictor": "none", "layout": {"name": "bundling", "bundled": False},
    },
    "hybrid": {
        "description": "half the model resident, the rest read every token (LLM in a flash's hybrid baseline)",
        "residency": {"name": "hybrid", "fraction": 0.5}, "predictor": "none",
        "layout": {"name": "bundling", "bundled": False},
    },
    "mmap": {
        "description": "OS demand paging of the model file: LRU page cache of the budget's size, read-ahead, "
                       "dense compute (llama.cpp with mmap)",
        "residency": "mmap", "predictor": "none", "layout": {"name": "bundling", "bundled": False},
    },
    "dense": {
        "description": "every weight resident, nothing read (the upper bound; needs the model to fit)",
        "residency": "dense", "predictor": "none",
    },
    "quantized": {
        "description": "every weight resident as 4-bit (llama.cpp Q4_0-like): the quantization baseline",
        "residency": "dense", "predictor": "none", "precision": {"name": "quantized", "bits": 4},
    },
    "llm-in-a-flash": {
        "description": "LLM in a flash: predictor + sliding window (k=5) + row-column bundling",
        "residency": {"name": "window", "k": 5}, "predictor": {"name": "oracle", "rank": 128},
        "layout": {"name": "bundling", "bundled": True},
    },
    "neuroprefetcher": {
        "description": "NeuroPrefetcher: delta prefetch of the next token's bundled rows while the current "
                       "token computes, into a neuron cache that fills the free DRAM (LRU)",
        "residency": {"name": "window", "k": "inf"}, "predictor": {"name": "oracle", "rank": 128},
        "layout": {"name": "bundling", "bundled": True}, "prefetch": "delta",
    },
    "selectinfer": {
        "description": "SelectInfer: load base+secondary neurons up to gamma=0.7, compute static+dynamic "
                       "neurons up to a compute ratio of 0.4",
        "residency": {"name": "selective", "load_ratio": 0.7, "compute_ratio": 0.4}, "predictor": "none",
        "layout": {"name": "bundling", "bundled": True},
    },
}


def preset_names() -> list[str]:
    return sorted(PRESETS)


def preset_config(name: str) -> RunConfig:
    """The RunConfig of a preset (unknown names list the valid ones)."""
    if name not in PRESETS:
        raise FlashsimError(f"unknown preset {name!r}; {hint(name, preset_names(), 'valid presets')}")
    spec = PRESETS[name]
    kwargs: dict[str, Any] = {"preset": name}
    for slot in SLOTS:
        if slot in spec:
            kwargs[slot] = PolicyChoice.build(slot, spec[slot])
    return RunConfig(**kwargs)
