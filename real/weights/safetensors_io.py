"""A minimal safetensors writer and reader on NumPy alone (bf16 carried as uint16 bit patterns).

The format (https://github.com/huggingface/safetensors, "Format"): an 8-byte little-endian header
length N, N bytes of JSON `{name: {"dtype": "F32"|"F16"|"BF16"|..., "shape": [...],
"data_offsets": [begin, end]}, "__metadata__": {str: str}}` padded with spaces to a multiple of 8,
then the tensors' bytes back to back (offsets relative to the end of the header). Files written
here load with `safetensors.torch.load_file` / `safetensors.numpy.load_file` (tested), so the real
backend's model mode can use torch while shape mode and the tests need only NumPy.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from devices.errors import FlashsimError

_NUMPY_OF = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
             "F64": np.dtype("<f8"), "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "U8": np.dtype("u1")}


def write_safetensors(path: Path, tensors: Mapping[str, tuple[str, np.ndarray]],
                      metadata: Mapping[str, str] | None = None) -> int:
    """Write `{name: (safetensors dtype, array of its storage dtype)}`; returns bytes written."""
    header: dict[str, object] = {}
    offset = 0
    names = sorted(tensors)
    for name in names:
        st_dtype, arr = tensors[name]
        if _NUMPY_OF[st_dtype].itemsize != arr.dtype.itemsize:
            raise ValueError(f"{name}: {st_dtype} does not match array dtype {arr.dtype}")
        header[name] = {"dtype": st_dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name in names:
            f.write(np.ascontiguousarray(tensors[name][1]).tobytes())
    return 8 + len(text) + offset


def read_safetensors(path: Path) -> tuple[dict[str, tuple[str, np.ndarray]], dict[str, str]]:
    """`({name: (dtype, array)}, metadata)`; arrays are read-only memory maps (bf16 as uint16)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            if n > size - 8:
                raise ValueError("header longer than the file")
            header = json.loads(f.read(n))
    except (OSError, ValueError, struct.error) as e:
        raise FlashsimError(f"{path}: not a readable safetensors file ({e})") from None
    meta = header.pop("__metadata__", {}) or {}
    out: dict[str, tuple[str, np.ndarray]] = {}
    for name, h in header.items():
        begin, end = h["data_offsets"]
        dt = _NUMPY_OF.get(h["dtype"])
        if dt is None or 8 + n + end > size or (end - begin) != dt.itemsize * int(np.prod(h["shape"])):
            raise FlashsimError(f"{path}: tensor {name!r} has a bad dtype, shape or offsets (truncated file?)")
        arr = np.memmap(path, dtype=dt, mode="r", offset=8 + n + begin, shape=tuple(h["shape"]) or (1,))
        out[name] = (h["dtype"], arr.reshape(h["shape"]))
    return out, meta
