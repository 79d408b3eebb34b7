"""Conversion into a weight store: a real Hugging Face model (model mode) or random weights of any
ModelSpec's size (shape mode).

Model mode reads the model's state dict (torch tensors or NumPy arrays, HF names): each layer's FFN
matrices become neuron bundles / rows in the store; every other tensor (attention, norms,
embeddings, lm_head unless tied, FFN biases) goes to resident.safetensors under its own name.
FFN naming conventions understood (the `traces.capture.hooks` families):

    llama, mistral, qwen2/3, gemma  mlp.gate_proj / mlp.up_proj / mlp.down_proj  (Linear [out, in])
    phi3                            mlp.gate_up_proj (gate rows, then up rows) / mlp.down_proj
    opt                             fc1 / fc2;  phi: mlp.fc1 / mlp.fc2
    falcon                          mlp.dense_h_to_4h / mlp.dense_4h_to_h
    gpt2                            mlp.c_fc / mlp.c_proj (Conv1D: weight is [in, out])

Shape mode fills the FFN with uniform random values of standard deviation 0.02 (the usual
initializer scale; finite, never denormal, so compute timings are those of real weights), drawn
per (seed, layer, slot) from `np.random.SeedSequence(seed)`; it stores only small resident tensors
(norm weights, FFN biases), since timing runs keep the attention and embeddings resident anyway.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from devices.errors import FlashsimError
from devices.model_spec import ModelSpec
from devices.progress import phase, quiet_third_party, track
from real.weights.dtypes import SAFETENSORS_NAME, check_dtype, encode
from real.weights.store import LAYOUTS, OrderInfo, sha256_file
from real.weights.store_writer import BLOCK_ROWS, StoreWriter

LAYER_PREFIXES = ("model.layers", "model.decoder.layers", "transformer.h", "transformer.layers")
# (gate, up, down, up/down stored as Conv1D [in, out]); the first match per layer wins.
FFN_NAMES = (
    ("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight", False),
    (None, "fc1.weight", "fc2.weight", False),
    (None, "mlp.fc1.weight", "mlp.fc2.weight", False),
    (None, "mlp.dense_h_to_4h.weight", "mlp.dense_4h_to_h.weight", False),
    (None, "mlp.c_fc.weight", "mlp.c_proj.weight", True),
)
FUSED_GATE_UP = "mlp.gate_up_proj.weight"
SHAPE_STD = 0.02


def layouts_of(choice: str) -> list[str]:
    if choice == "both":
        return list(LAYOUTS)
    if choice not in LAYOUTS:
        raise FlashsimError(f"--layout {choice}: choose bundled, unbundled or both")
    return [choice]


def neuron_order(spec: ModelSpec, order: str, profile: str | Path | None, task: str | None) -> tuple[np.ndarray, OrderInfo]:
    """slot -> neuron [L, N] for 'original' or 'hot-first' (a traces.profiler .npz ranking)."""
    L, N = spec.n_layers, spec.d_ff
    if order == "original":
        if profile is not None:
            raise FlashsimError("--profile is only used with --order hot-first")
        return np.broadcast_to(np.arange(N, dtype=np.int32), (L, N)).copy(), OrderInfo(kind="original")
    if order != "hot-first":
        raise FlashsimError(f"--order {order}: choose original or hot-first")
    if profile is None:
        raise FlashsimError("--order hot-first needs --profile PROFILE.npz (from `flashsim trace profile`)")
    from traces.profiler import load_neuron_profile

    prof = load_neuron_profile(profile)
    if (prof.n_layers, prof.n_neurons) != (L, N):
        raise FlashsimError(f"{profile}: the profile has {prof.n_layers} layers x {prof.n_neurons} neurons, "
                            f"the model {L} x {N}; profile a trace of this model")
    rank = prof.base_ranking(task) if task else prof.secondary_ranking()
    info = OrderInfo(kind="hot-first", profile=str(profile), profile_sha256=sha256_file(Path(profile)),
                     ranking=f"base:{task}" if task else "secondary")
    return np.ascontiguousarray(rank, dtype=np.int32), info


# ---- model mode ------------------------------------------------------------------------------------
def load_model_for_store(model: str | Path) -> tuple[Mapping[str, Any], ModelSpec, str]:
    """(state dict, spec, source path) of `smollm2-135m`, an HF folder or a .gguf.

    A Hugging Face folder is loaded here with transformers alone (conversion needs the weights,
    not the tokenizer); embedded names and GGUF files go through traces.capture's
    `load_hf_model`, which locates and caches them. Any object with a torch `state_dict()` and a
    ModelSpec can also be converted with `convert_state_dict` directly."""
    import os

    folder = Path(model).expanduser()
    if folder.is_dir():
        from devices.model_spec import load_model

        spec = load_model(folder)
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            import torch
            from transformers import AutoConfig, AutoModelForCausalLM

            quiet_third_party()
            from real.weights.checkpoint_check import check_checkpoint

            check_checkpoint(folder, AutoConfig.from_pretrained(folder))   # before any weight is loaded
            hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        except ImportError:
            raise FlashsimError("converting a model needs torch and transformers: install flashsim[real]") from None
        except (OSError, ValueError, KeyError) as e:
            raise FlashsimError(f"{folder}: cannot load the model ({str(e).strip().splitlines()[0]})") from None
        return hf.state_dict(), spec, str(folder)
    from traces.capture.models import load_hf_model

    loaded = load_hf_model(model)
    return loaded.model.state_dict(), loaded.spec, loaded.source


def _to_numpy(t: Any) -> np.ndarray:
    if isinstance(t, np.ndarray):
        return t
    t = t.detach().cpu()
    if t.is_floating_point():
        t = t.float()
    return t.numpy()


def _ffn_matrices(sd: Mapping[str, Any], prefix: str, spec: ModelSpec) -> tuple[list[np.ndarray], set[str]]:
    """[gate?, up, down columns] as fp32 [N, d] for one layer, and the keys they used."""
    N, d = spec.d_ff, spec.d_model
    for gate_k, up_k, down_k, conv1d in FFN_NAMES:
        up_name, down_name = f"{prefix}.{up_k}", f"{prefix}.{down_k}"
        fused = f"{prefix}.{FUSED_GATE_UP}"
        if down_name not in sd or (up_name not in sd and fused not in sd):
            continue
        used = {down_name}
        down = _to_numpy(sd[down_name]).astype(np.float32, copy=False)
        down_cols = down if conv1d else down.T  # Linear [d, N] -> columns [N, d]; Conv1D is [N, d]
        if fused in sd and up_name not in sd:
            gu = _to_numpy(sd[fused]).astype(np.float32, copy=False)
            mats, used = [gu[:N], gu[N:], down_cols], used | {fused}
        else:
            up = _to_numpy(sd[up_name]).astype(np.float32, copy=False)
            mats = [up.T if conv1d else up, down_cols]
            used.add(up_name)
            if gate_k is not None and f"{prefix}.{gate_k}" in sd:
                mats.insert(0, _to_numpy(sd[f"{prefix}.{gate_k}"]).astype(np.float32, copy=False))
                used.add(f"{prefix}.{gate_k}")
        if len(mats) != spec.ffn_matrices:
            raise FlashsimError(f"{prefix}: found {len(mats)} FFN matrices but the config says {spec.ffn_kind} "
                                f"({spec.ffn_matrices}); the checkpoint does not match its config.json")
        for m in mats:
            if m.shape != (N, d):
                raise FlashsimError(f"{prefix}: an FFN matrix has shape {list(m.shape)}, expected [{N}, {d}] per neuron")
        return [np.ascontiguousarray(m) for m in mats], used
    raise FlashsimError(f"{prefix}: no FFN weights found (looked for {', '.join(u for _, u, _, _ in FFN_NAMES)}); "
                        "this architecture is not supported")


def _layer_prefix(sd: Mapping[str, Any]) -> str:
    for p in LAYER_PREFIXES:
        if any(k.startswith(f"{p}.0.") for k in sd):
            return p
    raise FlashsimError(f"no decoder layers found in the state dict (looked for {', '.join(LAYER_PREFIXES)})")


def _resident_entry(name: str, t: Any, dtype: str) -> tuple[str, np.ndarray] | None:
    a = _to_numpy(t)
    if a.dtype.kind == "f":
        return SAFETENSORS_NAME[dtype], encode(a, dtype, name)
    if a.dtype == np.bool_:
        return "U8", a.astype(np.uint8)
    if a.dtype.kind in "iu":
        return "I64", a.astype(np.int64)
    return None


def convert_state_dict(sd: Mapping[str, Any], spec: ModelSpec, out: str | Path, *, dtype: str = "fp32",
                       layout: str = "bundled", alignment: str = "padded", file_mode: str = "per-layer",
                       order: str = "original", profile: str | Path | None = None, task: str | None = None,
                       overwrite: bool = False, source: dict[str, Any] | None = None,
                       progress: bool = False) -> Path:
    """Write a store from a model's state dict (HF tensor names; torch tensors or NumPy arrays)."""
    check_dtype(dtype)
    neuron_at, order_info = neuron_order(spec, order, profile, task)
    prefix = _layer_prefix(sd)
    resident_estimate = spec.with_dtype(dtype).non_ffn_bytes
    writer = StoreWriter(out, spec, dtype, layouts=layouts_of(layout), neuron_at=neuron_at, order=order_info,
                         alignment=alignment, file_mode=file_mode, overwrite=overwrite,
                         resident_bytes_estimate=resident_estimate)
    with writer:
        used: set[str] = set()
        for layer in track(range(spec.n_layers), "convert FFN weights", "layers", enabled=progress):
            mats, keys = _ffn_matrices(sd, f"{prefix}.{layer}", spec)
            writer.write_layer(layer, mats)
            used |= keys
        resident = {}
        for name in sorted(set(sd) - used):
            if name == "lm_head.weight" and spec.tied_embeddings:
                continue  # the same bytes as the input embedding
            entry = _resident_entry(name, sd[name], dtype)
            if entry is not None:
                resident[name] = entry
        writer.write_resident(resident, complete=True,
                              note="every tensor but the FFN weights" + (" (lm_head tied to the embedding)"
                                                                          if spec.tied_embeddings else ""))
        return writer.commit("model", {**(source or {}), "command": _command()})


def convert_model(model: str | Path, out: str | Path, **kw: Any) -> Path:
    """`flashsim real convert --model ...`: load (via traces.capture) and convert."""
    with phase(f"loading {model}", enabled=bool(kw.get("progress"))):
        sd, spec, where = load_model_for_store(model)
    return convert_state_dict(sd, spec, out, source={"model": str(model), "weights": where}, **kw)


# ---- shape mode ------------------------------------------------------------------------------------
def write_shape_store(spec: ModelSpec, out: str | Path, *, seed: int, dtype: str = "fp16",
                      layout: str = "bundled", alignment: str = "padded", file_mode: str = "per-layer",
                      order: str = "original", profile: str | Path | None = None, task: str | None = None,
                      overwrite: bool = False, progress: bool = False) -> Path:
    """Random FFN weights of `spec`'s exact size, streamed block by block (RAM stays ~BLOCK_ROWS rows)."""
    check_dtype(dtype)
    neuron_at, order_info = neuron_order(spec, order, profile, task)
    L, N, d = spec.n_layers, spec.d_ff, spec.d_model
    n_seg = spec.ffn_matrices
    half_width = SHAPE_STD * np.sqrt(3.0)  # U(-a, a) has std a / sqrt(3)
    layer_seeds, resident_seed = np.random.SeedSequence(seed).spawn(2)
    layer_rngs = [np.random.default_rng(s) for s in layer_seeds.spawn(L)]
    writer = StoreWriter(out, spec, dtype, layouts=layouts_of(layout), neuron_at=neuron_at, order=order_info,
                         alignment=alignment, file_mode=file_mode, overwrite=overwrite)
    with writer:
        for layer in track(range(L), "write random FFN weights", "layers", enabled=progress):
            rng = layer_rngs[layer]

            def blocks(rng: np.random.Generator = rng, layer: int = layer):
                for s in range(0, N, BLOCK_ROWS):
                    b = min(BLOCK_ROWS, N - s)
                    yield [encode((rng.random((b, d), dtype=np.float32) * 2 - 1) * half_width, dtype,
                                  f"layer {layer}") for _ in range(n_seg)]

            writer.write_layer_blocks(layer, blocks())
        writer.write_resident(_shape_resident(spec, dtype, np.random.default_rng(resident_seed)), complete=False,
                              note="shape mode: norm weights and FFN biases only (random); attention, "
                                   "embeddings and lm_head are not stored")
        return writer.commit("shape", {"seed": int(seed), "spec": spec.name, "command": _command()})


def _shape_resident(spec: ModelSpec, dtype: str, rng: np.random.Generator) -> dict[str, tuple[str, np.ndarray]]:
    st = SAFETENSORS_NAME[dtype]
    d, N = spec.d_model, spec.d_ff
    out: dict[str, tuple[str, np.ndarray]] = {}

    def norm() -> np.ndarray:
        return encode(1.0 + SHAPE_STD * rng.standard_normal(d, dtype=np.float32), dtype)

    for i in range(spec.n_layers):
        for k in range(spec.norms_per_layer):
            out[f"model.layers.{i}.norm_{k}.weight"] = (st, norm())
        if spec.ffn_bias:
            for name in (("gate", "up") if spec.gated else ("up",)):
                out[f"model.layers.{i}.mlp.{name}_proj.bias"] = (st, encode(SHAPE_STD * rng.standard_normal(N, dtype=np.float32), dtype))
            out[f"model.layers.{i}.mlp.down_proj.bias"] = (st, encode(SHAPE_STD * rng.standard_normal(d, dtype=np.float32), dtype))
    out["model.norm.weight"] = (st, norm())
    return out


def _command() -> str:
    return "flashsim " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv and "flashsim" in sys.argv[0] else ""
