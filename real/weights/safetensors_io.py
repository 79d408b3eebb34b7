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
from devices.safe_load import parse_json

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


MAX_HEADER_BYTES = 100 << 20     # the safetensors library's own limit on the JSON header


def read_header(path: Path) -> tuple[dict[str, dict], dict[str, str], int, int]:
    """(tensors {name: {"dtype", "shape", "data_offsets"}}, metadata, header bytes, file bytes) of a
    safetensors file, every field checked (a mapping of mappings, known dtype, non-negative whole
    shape and offsets, begin <= end, data inside the file, size = dtype x shape); FlashsimError
    names the file and the first bad tensor."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise ValueError("shorter than its 8-byte header length")
            n = struct.unpack("<Q", raw)[0]
            if n > min(size - 8, MAX_HEADER_BYTES):
                raise ValueError(f"header length {n:,} is beyond the file or the {MAX_HEADER_BYTES >> 20} MiB limit")
            text = f.read(n)
    except (OSError, ValueError, struct.error) as e:
        raise FlashsimError(f"{path}: not a readable safetensors file ({e})") from None
    header = parse_json(text, f"{path}: safetensors header")
    if not isinstance(header, dict):
        raise FlashsimError(f"{path}: not a safetensors file (the header is a {type(header).__name__}, not a mapping)")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise FlashsimError(f"{path}: safetensors '__metadata__' must map strings to strings")
    data_bytes = size - 8 - n
    for name, h in header.items():
        bad = _entry_problem(h, data_bytes)
        if bad:
            raise FlashsimError(f"{path}: tensor {name!r}: {bad} (a damaged or hand-edited file?)")
    return header, meta, n, size


def _whole(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _entry_problem(h: object, data_bytes: int) -> str | None:
    if not isinstance(h, dict):
        return f"entry is a {type(h).__name__}, not a mapping"
    dt, shape, offs = h.get("dtype"), h.get("shape"), h.get("data_offsets")
    if not isinstance(dt, str) or dt not in _ITEMSIZE:
        return f"dtype {dt!r} is not one of {', '.join(sorted(_ITEMSIZE))}"
    if not isinstance(shape, list) or not all(_whole(d) for d in shape):
        return f"shape {shape!r} is not a list of non-negative whole numbers"
    if not isinstance(offs, list) or len(offs) != 2 or not all(_whole(o) for o in offs) or offs[0] > offs[1]:
        return f"data_offsets {offs!r} is not [begin, end] with 0 <= begin <= end"
    if offs[1] > data_bytes:
        return f"data_offsets end {offs[1]:,} is past the file's {data_bytes:,} data bytes (truncated?)"
    count = 1
    for d in shape:
        count *= d
    if offs[1] - offs[0] != count * _ITEMSIZE[dt]:
        return f"{offs[1] - offs[0]:,} bytes for shape {shape} of {dt} ({count * _ITEMSIZE[dt]:,} bytes)"
    return None


# Element sizes of every safetensors dtype (the format's list), for checking headers of any checkpoint.
_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8,
             "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def read_safetensors(path: Path) -> tuple[dict[str, tuple[str, np.ndarray]], dict[str, str]]:
    """`({name: (dtype, array)}, metadata)`; arrays are read-only memory maps (bf16 as uint16)."""
    header, meta, n, _ = read_header(path)
    out: dict[str, tuple[str, np.ndarray]] = {}
    for name, h in header.items():
        begin, _end = h["data_offsets"]
        dt = _NUMPY_OF.get(h["dtype"])
        if dt is None:
            raise FlashsimError(f"{path}: tensor {name!r}: dtype {h['dtype']} is not read here "
                                f"({', '.join(sorted(_NUMPY_OF))})")
        shape = tuple(h["shape"])
        if dt.itemsize * int(np.prod(shape, dtype=object)) == 0:
            out[name] = (h["dtype"], np.zeros(shape, dt))
            continue
        arr = np.memmap(path, dtype=dt, mode="r", offset=8 + n + begin, shape=shape or (1,))
        out[name] = (h["dtype"], arr.reshape(shape))
    return out, meta
