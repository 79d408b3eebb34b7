"""Element types of a weight store: fp32, fp16 and bf16, encoded and decoded with NumPy alone.

NumPy has no bfloat16, so bf16 values are carried as their uint16 bit patterns: the upper half of
the fp32 pattern, rounded to nearest-even exactly as torch's `.to(torch.bfloat16)` does (NaN stays
NaN). `encode` returns the array whose bytes go to disk; `decode` turns stored bytes back to fp32.
"""

from __future__ import annotations

import numpy as np

from devices.errors import FlashsimError

STORE_DTYPES = ("fp32", "fp16", "bf16")
ELEMENT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
# The NumPy dtype that holds the stored bit patterns of each store dtype.
STORAGE_NUMPY = {"fp32": np.dtype("<f4"), "fp16": np.dtype("<f2"), "bf16": np.dtype("<u2")}
SAFETENSORS_NAME = {"fp32": "F32", "fp16": "F16", "bf16": "BF16"}


def check_dtype(dtype: str) -> str:
    if dtype not in STORE_DTYPES:
        raise FlashsimError(
            f"--dtype {dtype}: a weight store holds {', '.join(STORE_DTYPES)} "
            "(int8/int4 are simulated as byte counts only)"
        )
    return dtype


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bit patterns (uint16), round to nearest even; NaN -> a quiet NaN."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    out = rounded.astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        out[nan] = np.uint16(0x7FC0)
    return out


def encode(x: np.ndarray, dtype: str, what: str = "tensor") -> np.ndarray:
    """fp32 (or any float) values -> the array stored for `dtype`; FlashsimError on overflow."""
    x = np.asarray(x, dtype=np.float32)
    if dtype == "fp32":
        out = x
    elif dtype == "fp16":
        with np.errstate(over="ignore"):
            out = x.astype(np.float16)
        if not np.all(np.isfinite(out)) and np.all(np.isfinite(x)):
            raise FlashsimError(
                f"{what}: values exceed the fp16 range (max {float(np.abs(x).max()):.3g}); "
                "convert with --dtype bf16 or fp32"
            )
    elif dtype == "bf16":
        out = bf16_bits(x)
    else:
        check_dtype(dtype)
        raise AssertionError("unreachable")
    return np.ascontiguousarray(out)


def decode(raw: np.ndarray, dtype: str) -> np.ndarray:
    """Stored bytes (uint8, any shape with the last axis in bytes) or stored elements -> fp32."""
    a = np.ascontiguousarray(raw)
    if a.dtype == np.uint8:
        a = a.view(STORAGE_NUMPY[dtype])
    if dtype == "bf16":
        return (a.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return a.astype(np.float32)
