"""Packed neuron sets: rows of little-endian uint64 words, one bit per FFN neuron.

Every set the simulator computes (needed, computed, resident, to-read, prefetched) is an array of
shape [S, W] (S steps, W = ceil(N / 64) words) or [W] for one step. Bit n of a row is bit n % 64 of
word n // 64, which is exactly the trace's `np.packbits(..., bitorder="little")` byte layout read
8 bytes at a time, so trace rows convert without unpacking. Bits at positions >= N are always 0:
every complement is taken against `full(n)` (`andnot`), never with a bare `~`.

Run-length counting (`run_length_counts`) works on the words directly with shifts and popcounts,
so coalescing adjacent neurons into larger reads never unpacks a layer.
"""

from __future__ import annotations

import numpy as np

WORD = np.dtype("<u8")
_ONE = np.uint64(1)
_SH63 = np.uint64(63)


def n_words(n_bits: int) -> int:
    return (n_bits + 63) // 64


def from_packed_bytes(packed: np.ndarray, n_bits: int) -> np.ndarray:
    """uint8 [..., ceil(n/8)] (trace layout) -> words [..., W] (a copy, padded with zero bytes)."""
    packed = np.asarray(packed, dtype=np.uint8)
    w = n_words(n_bits)
    out = np.zeros(packed.shape[:-1] + (w * 8,), np.uint8)
    out[..., : packed.shape[-1]] = packed
    return out.view(WORD)


def pack(mask: np.ndarray) -> np.ndarray:
    """bool [..., N] -> words [..., W]."""
    mask = np.asarray(mask, dtype=bool)
    return from_packed_bytes(np.packbits(mask, axis=-1, bitorder="little"), mask.shape[-1])


def unpack(words: np.ndarray, n_bits: int) -> np.ndarray:
    """words [..., W] -> bool [..., N]."""
    b = np.ascontiguousarray(words, dtype=WORD).view(np.uint8)
    return np.unpackbits(b, axis=-1, count=n_bits, bitorder="little").view(bool)   # 0/1 bytes are bools


def full(n_bits: int) -> np.ndarray:
    """words [W] with bits 0..n-1 set."""
    return pack(np.ones(n_bits, bool))


def zeros(shape: tuple[int, ...] | int, n_bits: int) -> np.ndarray:
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return np.zeros(shape + (n_words(n_bits),), WORD)


def count(words: np.ndarray) -> np.ndarray:
    """Set bits per row: words [..., W] -> int64 [...]."""
    return np.bitwise_count(words).sum(axis=-1, dtype=np.int64)


def andnot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a \\ b (b's padding bits are irrelevant: a has none)."""
    return a & ~b


def window_union(rows: np.ndarray, history: np.ndarray, k: int) -> np.ndarray:
    """OR of each row with the k-1 rows before it; `history` [h, W] precedes rows [S, W].

    Returns [S, W]: out[s] = rows[s] | rows[s-1] | ... | rows[s-k+1] (reaching into history).
    k = 0 gives empty sets; k >= 1 as described."""
    S = rows.shape[0]
    if k <= 0:
        return np.zeros_like(rows)
    full_rows = np.concatenate([history[max(0, len(history) - (k - 1)):], rows]) if k > 1 else rows
    h = full_rows.shape[0] - S
    out = rows.copy()
    for j in range(1, min(k, h + S)):  # rows further back than the history reaches add nothing
        lo = h - j
        if lo >= 0:
            out |= full_rows[lo: lo + S]
        elif lo + S > 0:
            out[-lo:] |= full_rows[: lo + S]
    return out


def cumulative_union(rows: np.ndarray, initial: np.ndarray) -> np.ndarray:
    """out[s] = initial | rows[0] | ... | rows[s]."""
    out = np.bitwise_or.accumulate(rows, axis=0)
    return out | initial


def shift_down(words: np.ndarray) -> np.ndarray:
    """Bit i of the result = bit i+1 of the input (carry across words; top bit becomes 0)."""
    out = words >> _ONE
    out[..., :-1] |= words[..., 1:] << _SH63
    return out


def shift_up(words: np.ndarray) -> np.ndarray:
    """Bit i of the result = bit i-1 of the input (bit 0 becomes 0)."""
    out = words << _ONE
    out[..., 1:] |= words[..., :-1] >> _SH63
    return out


def run_starts(words: np.ndarray) -> np.ndarray:
    """Bits that are set with their lower neighbour clear: one bit per run of consecutive set bits."""
    return words & ~shift_up(words)


def shift_down_by(words: np.ndarray, k: int) -> np.ndarray:
    """Bit i of the result = bit i+k of the input (zeros shifted in at the top)."""
    q, r = divmod(int(k), 64)
    out = np.zeros_like(words)
    W = words.shape[-1]
    if q >= W:
        return out
    src = words[..., q:]
    if r == 0:
        out[..., : W - q] = src
        return out
    out[..., : W - q] = src >> np.uint64(r)
    out[..., : W - q - 1] |= src[..., 1:] << np.uint64(64 - r)
    return out


def all_set_from(words: np.ndarray, m: int) -> np.ndarray:
    """Bit i set iff bits i..i+m-1 are all set (m >= 1), by binary doubling of shifts."""
    acc = None            # covers `have` consecutive bits
    have = 0
    block, size = words, 1  # block covers `size` consecutive bits
    while m:
        if m & 1:
            acc = block.copy() if acc is None else acc & shift_down_by(block, have)
            have += size
        m >>= 1
        if m:
            block = block & shift_down_by(block, size)
            size *= 2
    assert acc is not None
    return acc


def run_positions(words: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, start, length) of every run of consecutive set bits, rows in order."""
    words = np.atleast_2d(words)
    starts = run_starts(words)
    ends = words & ~shift_down(words)
    r0, p0 = _bit_positions(starts)
    _, p1 = _bit_positions(ends)
    return r0, p0, p1 - p0 + 1


def _bit_positions(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r, c = np.nonzero(b)
    if len(r) == 0:
        return r, r
    bits = np.unpackbits(np.ascontiguousarray(b[r, c]).view(np.uint8).reshape(-1, 8), axis=1, bitorder="little")
    i, k = np.nonzero(bits)
    return r[i], c[i] * 64 + k


def run_length_counts(words: np.ndarray, max_len: int, probe: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """Histogram of runs of consecutive set bits per row, each run split into pieces of <= max_len.

    Returns (counts int64 [S, max_len], long_rows bool [S]): counts[s, j-1] = number of pieces of
    length j in row s. A run of length r becomes r // max_len pieces of max_len plus one piece of
    r % max_len (split from its start: how a reader issues a long contiguous read).

    Method (no positions for ordinary rows): x_{j+1} = x_j & (x_j >> 1) keeps bit i iff bits
    i..i+j are all set, and popcount(x_j) = sum over runs of max(0, r - j + 1); so the number of
    runs of length exactly j is c_j - 2 c_{j+1} + c_{j+2} with c_j = popcount(x_j). Rows that
    still have runs longer than `probe` (or than max_len) after those few passes, typically dense
    rows, are finished from their runs' positions (`run_positions`, cost per run); `long_rows`
    marks them.
    """
    words = np.atleast_2d(words)
    S = words.shape[0]
    counts = np.zeros((S, max_len), np.int64)
    J = min(probe, max_len)
    c = [count(words)]                       # c[j-1] = popcount(x_j)
    x = words
    for _ in range(J + 1):
        if not c[-1].any():
            c.append(c[-1])
            continue
        x = x & shift_down(x)
        c.append(count(x))
    zero = np.zeros(S, np.int64)
    c += [zero] * 2
    for j in range(1, J + 1):
        counts[:, j - 1] = c[j - 1] - 2 * c[j] + c[j + 1]
    long_rows = c[J] > 0                     # some run has length > J
    if long_rows.any():
        li = np.flatnonzero(long_rows)
        counts[li] = 0
        r, _, length = run_positions(words[li])
        full, rem = length // max_len, length % max_len
        np.add.at(counts, (li[r], np.full(len(r), max_len - 1)), full)
        k = rem > 0
        np.add.at(counts, (li[r[k]], rem[k] - 1), 1)
    return counts, long_rows


def permute(words: np.ndarray, perm: np.ndarray, n_bits: int) -> np.ndarray:
    """Reorder bits: bit i of the result = bit perm[i] of the input (neuron order on flash)."""
    return pack(unpack(words, n_bits)[..., perm])
