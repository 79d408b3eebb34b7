"""Presets: the papers' configurations as slot fillings (any part can be changed with --set).

LLM in a flash's ablation (Table 2 of the paper, OPT-6.7B on the M1 Max) runs as:

    naive         --preset naive [--set memory.stream_non_ffn=true: the paper's naive reads the whole model]
    hybrid        --preset hybrid
    +predictor    --preset llm-in-a-flash --set window.k=0 --set bundling.bundled=false
    +windowing    --preset llm-in-a-flash --set bundling.bundled=false
    +bundling     --preset llm-in-a-flash

Presets only choose policies and their parameters; every default lives on its parameter.

A preset's predictor and prefetch are the ones its system really ran, as they behave: the `noisy`
predictor (errors with the memory measured on a trained low-rank predictor, sim/policies/predictor.py)
at the recall and precision the system published, or flashsim's own measurement where it published
none; never the oracle. `ideal_policy(config)` is the same configuration with a perfect predictor and
prefetch (oracle; recall = precision = 1): the ideal-policy bound printed beside the expected figure.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from devices.errors import FlashsimError
from devices.suggest import hint
from sim.config import PolicyChoice, RunConfig
from sim.params import params_to_dict
from sim.policies.registry import SLOTS

# LLM in a flash's predictor (arXiv 2312.11514) is tuned for recall and over-predicts. Recall 0.99:
# with it the paper's zero-shot accuracy barely moves (OPT-6.7B: HellaSwag 49.8 with the predictor vs
# 50.3 dense); the paper gives no recall figure, so 0.99 is this reading of "no accuracy loss". Precision 0.3: Table 2's "+Predictor" row reads 0.9 GB of FFN weights per
# token where the ~3% truly active neurons of OPT-6.7B (Sec. 3.1: ~97% sparsity) hold ~0.26 GB, so
# about 0.26 / 0.9 of the predicted neurons are active.
LLM_IN_A_FLASH_RECALL, LLM_IN_A_FLASH_PRECISION = 0.99, 0.3
# NeuroPrefetcher publishes no recall/precision for its predictor: flashsim's own measurement of a
# trained low-rank predictor (rank 32, SmolLM2-135M, generated held-out tokens, threshold 0.15;
# docs/replay.md "Predictor errors with memory", `flashsim real predictor-errors`), the threshold
# whose recall is the higher (NeuroPrefetcher keeps >= 90% of the dense model's accuracy).
MEASURED_RECALL, MEASURED_PRECISION = 0.843, 0.285
# NeuroPrefetcher's delta prefetch predicts the next token's set from the current one: it measured
# 82-85% of the active MLP neurons shared between consecutive tokens (Mistral-7B, Llama-3-8B), so
# about 0.83 of the next set is foreseen and 0.83 of the foreseen set is used.
NEUROPREFETCHER_PREFETCH_RECALL = NEUROPREFETCHER_PREFETCH_PRECISION = 0.83

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
        "residency": {"name": "window", "k": 5},
        "predictor": {"name": "noisy", "recall": LLM_IN_A_FLASH_RECALL, "precision": LLM_IN_A_FLASH_PRECISION,
                      "rank": 128},
        "layout": {"name": "bundling", "bundled": True},
    },
    "neuroprefetcher": {
        "description": "NeuroPrefetcher: delta prefetch of the next token's bundled rows while the current "
                       "token computes, into a neuron cache that fills the free DRAM (LRU)",
        "residency": {"name": "window", "k": "inf"},
        "predictor": {"name": "noisy", "recall": MEASURED_RECALL, "precision": MEASURED_PRECISION, "rank": 128},
        "layout": {"name": "bundling", "bundled": True},
        "prefetch": {"name": "delta", "recall": NEUROPREFETCHER_PREFETCH_RECALL,
                     "precision": NEUROPREFETCHER_PREFETCH_PRECISION},
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


# A perfect predictor: computes exactly the active set (what `noisy` and `recorded` approximate).
IDEAL_PREDICTOR = "oracle"


def ideal_policy(config: RunConfig) -> RunConfig | None:
    """`config` with its policy idealisations switched on: the predictor replaced by the oracle (same
    rank, so the same predictor cost) and the prefetch's recall and precision set to 1; None when
    `config` is already ideal (its expected figure is its own ideal-policy bound)."""
    changes: dict[str, PolicyChoice] = {}
    pred = params_to_dict(config.predictor.params)
    if config.predictor.name not in ("none", IDEAL_PREDICTOR):
        changes["predictor"] = PolicyChoice.build("predictor", {"name": IDEAL_PREDICTOR, "rank": pred.get("rank", 0)})
    pf = params_to_dict(config.prefetch.params)
    if {"recall", "precision"} <= pf.keys() and (pf["recall"], pf["precision"]) != (1.0, 1.0):
        changes["prefetch"] = PolicyChoice.build("prefetch", {"name": config.prefetch.name, **pf,
                                                              "recall": 1.0, "precision": 1.0})
    return replace(config, **changes) if changes else None
