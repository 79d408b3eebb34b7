"""A Hugging Face model folder's checkpoint checked against its config.json before any weights load.

transformers builds the model from config.json and then fills it from the checkpoint: a tensor
the config implies but the checkpoint lacks is left at its random initialisation (a config of 4
layers with weights for 2 would give a "model" whose layers 2-3 are noise), and a checkpoint
tensor the config does not imply is dropped. Here every tensor of the model the config describes
(built on the `meta` device: names and shapes, no memory) must be in the checkpoint's safetensors
headers with the same shape, and no checkpoint tensor may be left over; otherwise the first
mismatch is named. Only safetensors are read: a pickled `pytorch_model.bin` can run code when
loaded, so it is refused with how to convert it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from devices.errors import FlashsimError
from real.weights.safetensors_io import read_header


def checkpoint_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} over every *.safetensors file in `folder` (headers only)."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        pickled = sorted(p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
        if pickled:
            raise FlashsimError(f"{folder}: only a pickled checkpoint ({pickled[0]}); flashsim reads safetensors "
                                "only (a pickle can run code): save the model with safe_serialization=True")
        raise FlashsimError(f"{folder}: no *.safetensors weights in this folder")
    out: dict[str, tuple[int, ...]] = {}
    for f in files:
        header, _meta, _n, _size = read_header(f)
        for name, h in header.items():
            if name in out:
                raise FlashsimError(f"{f}: tensor {name!r} is also in another checkpoint file")
            out[name] = tuple(h["shape"])
    return out


def expected_shapes(config: Any) -> tuple[dict[str, tuple[int, ...]], set[str]]:
    """({name: shape} of the model `config` describes, names that may be absent because they are
    tied to another tensor), built on the meta device (no weights allocated)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    tied = set()
    keys = getattr(model, "_tied_weights_keys", None) or []
    if isinstance(keys, dict):
        keys = list(keys)
    if getattr(config, "tie_word_embeddings", False):
        tied |= {k for k in shapes if k in keys or k.endswith("lm_head.weight")}
    return shapes, tied


def check_checkpoint(folder: Path, config: Any) -> None:
    """FlashsimError naming the first tensor missing, left over or of another shape than config.json implies."""
    have = checkpoint_shapes(folder)
    want, tied = expected_shapes(config)
    for name in sorted(want, key=_natural):
        if name not in have:
            if name in tied:
                continue
            raise FlashsimError(f"{folder}: tensor {name!r} (shape {list(want[name])}) that config.json implies is "
                                "not in the checkpoint; the checkpoint does not match its config.json")
        if have[name] != want[name]:
            raise FlashsimError(f"{folder}: tensor {name!r} has shape {list(have[name])} in the checkpoint but "
                                f"config.json implies {list(want[name])}; the checkpoint does not match its config.json")
    extra = sorted(set(have) - set(want), key=_natural)
    if extra:
        raise FlashsimError(f"{folder}: tensor {extra[0]!r} in the checkpoint is not part of the model config.json "
                            f"describes ({len(extra)} left over); the checkpoint does not match its config.json")


def _natural(name: str) -> tuple:
    """model.layers.10 after model.layers.9."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in name.split("."))
