"""Workload: which trace tokens each simulation step processes, and the trace as the run sees it.

A run is a sequence of **steps**. With a prompt, step 0 is the prefill: every prompt token of every
sequence processed as one batched step, so its FFN needs the union of their active sets. Each
following step decodes one token per sequence (batch B): the union across sequences.

Mapping trace tokens to sequences (the trace's `phase` array says which tokens are prompt (0) and
generated (1); `prompt_index` groups them into prompts):

* the decode stream is every generated token of the trace, prompt by prompt, in trace order;
* sequence b replays prompt p_b = b mod P (P prompts): its prefill is that prompt's prompt tokens
  (the first `prompt_tokens` of them when set); its decode tokens are the decode stream read
  cyclically from prompt p_b's first generated token, shifted by (b // P) * D / (P * ceil(B / P))
  positions so that sequences replaying the same prompt generate different tokens (copies are spread
  over the prompt's share of the stream);
* `tokens` decode steps (default: D, the number of generated tokens in the trace; at most D).

KV cache: sequence b with an n_b-token prompt holds n_b + j + 1 entries while decoding step j.

`TraceView` gives policies the trace through this mapping (and through `rescale`, which replays a
trace on a model of another shape: model layer l uses trace layer l * L_trace // L_model and
model neuron n uses trace neuron n mod N_trace, i.e. the trace's neurons tiled across the wider
layer. That keeps each token's active fraction and the overlap between consecutive tokens; the
co-activation across tiles is artificial. Results say `rescaled: true`.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from devices.errors import FlashsimError
from sim import bitsets
from traces.format import DECODE, PREFILL, Trace


@dataclass(frozen=True)
class StepSlice:
    """A range [start, stop) of simulation steps (step 0 may be the batched prefill)."""

    start: int
    stop: int
    phase: np.ndarray        # uint8 [S]: 0 prefill, 1 decode
    n_tokens: np.ndarray     # int64 [S]: tokens processed together in each step (prompt or batch)

    @property
    def size(self) -> int:
        return self.stop - self.start

    def __post_init__(self) -> None:
        if self.stop < self.start or len(self.phase) != self.size or len(self.n_tokens) != self.size:
            raise ValueError(f"inconsistent StepSlice [{self.start}, {self.stop})")


@dataclass(frozen=True)
class Steps:
    """The resolved workload: per-step token lists (CSR into trace positions) and KV sizes."""

    phase: np.ndarray            # uint8 [S]
    indptr: np.ndarray           # int64 [S+1]
    positions: np.ndarray        # int64 [indptr[-1]]: trace positions, step by step
    attn_ctx_sum: np.ndarray     # int64 [S]: sum over the step's tokens of the context each attends over
    kv_tokens: np.ndarray        # int64 [S]: KV entries resident during the step (all sequences)
    batch: int
    prompt_lengths: tuple[int, ...]
    sequence_prompts: tuple[int, ...]

    @property
    def n(self) -> int:
        return len(self.phase)

    @cached_property
    def n_tokens(self) -> np.ndarray:
        return np.diff(self.indptr)

    @cached_property
    def single_token(self) -> bool:
        return bool(np.all(self.n_tokens == 1))

    def slice(self, start: int, stop: int) -> StepSlice:
        return StepSlice(start, stop, self.phase[start:stop], self.n_tokens[start:stop])

    def token_positions(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """(positions, local indptr) of the tokens of steps [start, stop)."""
        a, b = self.indptr[start], self.indptr[stop]
        return self.positions[a:b], self.indptr[start:stop + 1] - a

    @cached_property
    def step_of_token(self) -> np.ndarray:
        return np.repeat(np.arange(self.n), self.n_tokens)

    @property
    def n_decode(self) -> int:
        return int(np.sum(self.phase == DECODE))


def build_steps(trace: Trace, prompt_tokens: int | None, tokens: int | None, batch: int) -> Steps:
    """Resolve the workload against a trace; FlashsimError for impossible requests."""
    if batch < 1:
        raise FlashsimError(f"workload.batch must be >= 1, got {batch}")
    phase = np.asarray(trace.phase)
    pidx = np.asarray(trace.prompt_index)
    prompts = sorted(set(pidx.tolist()))
    prefill = {p: np.flatnonzero((pidx == p) & (phase == PREFILL)) for p in prompts}
    decode = [np.flatnonzero((pidx == p) & (phase == DECODE)) for p in prompts]
    stream = np.concatenate(decode) if decode else np.zeros(0, np.int64)
    D = len(stream)
    if D == 0:
        raise FlashsimError(f"{trace.path}: the trace has no generated (decode, phase 1) tokens to replay")
    n_dec = D if tokens is None else tokens
    if not 1 <= n_dec <= D:
        raise FlashsimError(f"workload.tokens must be in [1, {D}] (the trace's generated tokens), got {n_dec}")
    P = len(prompts)
    starts = np.cumsum([0] + [len(d) for d in decode])[:-1]
    copies = math.ceil(batch / P)
    seq_prompts, prefill_pos, offsets = [], [], []
    for b in range(batch):
        pi = b % P
        pre = prefill[prompts[pi]]
        if prompt_tokens is not None:
            if prompt_tokens > len(pre):
                raise FlashsimError(f"workload.prompt_tokens={prompt_tokens}, but prompt {prompts[pi]} of the "
                                    f"trace has only {len(pre)} prompt tokens")
            pre = pre[:prompt_tokens]
        seq_prompts.append(prompts[pi])
        prefill_pos.append(pre)
        offsets.append((starts[pi] + (b // P) * max(1, D // (P * copies))) % D)
    lengths = np.array([len(p) for p in prefill_pos], np.int64)
    phases, groups, ctx_sum, kv = [], [], [], []
    if lengths.sum() > 0:
        phases.append(PREFILL)
        groups.append(np.concatenate(prefill_pos))
        ctx_sum.append(int(np.sum(lengths * (lengths + 1) // 2)))
        kv.append(int(lengths.sum()))
    off = np.array(offsets, np.int64)
    for j in range(n_dec):
        phases.append(DECODE)
        groups.append(stream[(off + j) % D])
        ctx_sum.append(int(np.sum(lengths + j + 1)))
        kv.append(int(np.sum(lengths + j + 1)))
    indptr = np.concatenate([[0], np.cumsum([len(g) for g in groups])]).astype(np.int64)
    return Steps(phase=np.array(phases, np.uint8), indptr=indptr,
                 positions=np.concatenate(groups).astype(np.int64), attn_ctx_sum=np.array(ctx_sum, np.int64),
                 kv_tokens=np.array(kv, np.int64), batch=batch, prompt_lengths=tuple(int(x) for x in lengths),
                 sequence_prompts=tuple(seq_prompts))


# Converted top-K arrays a view keeps (see TraceView._full_top): the 7B-shape planning trace (32
# layers x 128 tokens, K = 7,532) takes ~250 MB; a 70B shape's (80 x 128, K ~ 14,000) is not kept.
TOP_CACHE_BYTES = 256 << 20


def _rows(positions: np.ndarray) -> slice | np.ndarray:
    """A slice when the positions are one run of consecutive tokens (memmap slicing is much cheaper
    than fancy indexing), else the positions themselves."""
    n = len(positions)
    if n and positions[-1] - positions[0] == n - 1 and np.all(np.diff(positions) == 1):
        return slice(int(positions[0]), int(positions[-1]) + 1)
    return positions


# A layer's needed sets are computed once for all steps and kept (44 MB for a 7B model over 1,000
# steps); longer workloads compute each requested range instead.
NEEDED_CACHE_BYTES_PER_LAYER = 8 << 20


class TraceView:
    """A trace seen through the workload's steps and (optionally) rescaled to a model's shape."""

    def __init__(self, trace: Trace, steps: Steps, n_layers: int, n_neurons: int, rescale: bool = False):
        if (n_layers, n_neurons) != (trace.n_layers, trace.n_neurons) and not rescale:
            raise FlashsimError(
                f"trace {trace.path} has {trace.n_layers} layers x {trace.n_neurons} FFN neurons but the model has "
                f"{n_layers} x {n_neurons}; replay it with the trace's own model (omit --model), or pass "
                "--rescale to tile the trace onto the model (see docs/replay.md)")
        self.trace, self.steps = trace, steps
        self.n_layers, self.n_neurons = n_layers, n_neurons
        self.rescaled = (n_layers, n_neurons) != (trace.n_layers, trace.n_neurons)
        self._needed: dict[int, np.ndarray] = {}
        self._neuron_map = (np.arange(n_neurons) % trace.n_neurons) if n_neurons != trace.n_neurons else None

    def with_trace(self, other: Trace) -> TraceView:
        return TraceView(other, self.steps, self.n_layers, self.n_neurons, self.rescaled)

    def trace_layer(self, layer: int) -> int:
        return layer * self.trace.n_layers // self.n_layers

    @property
    def W(self) -> int:
        return bitsets.n_words(self.n_neurons)

    # ---- per-token data, mapped ---------------------------------------------------------------
    def token_words(self, layer: int, positions: np.ndarray) -> np.ndarray:
        """words [t, W]: active sets of the given trace positions in the model's neuron space."""
        packed = np.asarray(self.trace.packed_masks(self.trace_layer(layer))[_rows(positions)])
        if self._neuron_map is None:
            if packed.shape[-1] % 8 == 0 and packed.flags.c_contiguous:
                return packed.view(bitsets.WORD)                             # already word-aligned
            return bitsets.from_packed_bytes(packed, self.n_neurons)
        full = np.unpackbits(packed, axis=-1, count=self.trace.n_neurons, bitorder="little").astype(bool)
        return bitsets.pack(full[:, self._neuron_map])

    def token_active(self, layer: int, positions: np.ndarray) -> np.ndarray:
        return bitsets.unpack(self.token_words(layer, positions), self.n_neurons)

    def token_top(self, layer: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(idx int32 [t, K'], |a| float32 [t, K'], abs_sum float32 [t]) in model neuron space.

        Rescaled traces repeat each stored neuron once per tile (and the sums scale with it);
        entries beyond the model's width have idx -1 and |a| 0."""
        tl = self.trace_layer(layer)
        rows = _rows(positions)
        full = self._full_top(tl)
        if full is not None:
            idx, mag, tot = (x[rows] for x in full[:3])
        else:
            idx, mag = self.trace.top(tl)
            idx = np.asarray(idx[rows]).astype(np.int32)
            mag = np.asarray(mag[rows]).astype(np.float32)
            tot = np.asarray(self.trace.abs_sum(tl)[rows]).astype(np.float32)
        if self._neuron_map is not None:
            Nt = self.trace.n_neurons
            reps = -(-self.n_neurons // Nt)
            idx = np.concatenate([idx + r * Nt for r in range(reps)], axis=1)
            mag = np.concatenate([mag] * reps, axis=1)
            valid = idx < self.n_neurons
            mag = np.where(valid, mag, 0.0).astype(np.float32)
            idx = np.where(valid, idx, -1)
            tot = tot * (self.n_neurons / Nt)
        return idx, mag, tot

    def _full_top(self, tl: int) -> tuple[np.ndarray, ...] | None:
        """Trace layer `tl`'s top-K (idx int32, |a| float32, abs_sum float32, stored sum float64) over
        all its tokens, kept on the view when the whole trace's fit in TOP_CACHE_BYTES (else None):
        the quality proxy of every run of a sweep or plan reads them, and converting the stored
        dtypes is most of its cost."""
        c = self.__dict__.get("_top")
        if c is None:
            t = self.trace
            fits = t.n_layers * t.n_tokens * (8 * t.top_k + 12) <= TOP_CACHE_BYTES
            c = self.__dict__["_top"] = {} if fits else False
        if c is False:
            return None
        if tl not in c:
            idx, mag = self.trace.top(tl)
            mag32 = np.asarray(mag).astype(np.float32)
            c[tl] = (np.asarray(idx).astype(np.int32), mag32, np.asarray(self.trace.abs_sum(tl)).astype(np.float32),
                     mag32.sum(axis=1, dtype=np.float64))
        return c[tl]

    def token_stored_sum(self, layer: int, positions: np.ndarray) -> np.ndarray | None:
        """float64 [t]: the sum of the stored |a| of each token (None: not kept, see _full_top);
        only for a view that is not rescaled."""
        full = None if self._neuron_map is not None else self._full_top(self.trace_layer(layer))
        return None if full is None else full[3][_rows(positions)]

    def token_magnitudes(self, layer: int, positions: np.ndarray) -> np.ndarray:
        """float32 [t, N]: |a| where stored (top K), 0 elsewhere."""
        idx, mag, _ = self.token_top(layer, positions)
        out = np.zeros((len(positions), self.n_neurons), np.float32)
        if idx.shape[1]:
            ok = idx >= 0
            rows = np.broadcast_to(np.arange(len(positions))[:, None], idx.shape)
            np.maximum.at(out, (rows[ok], idx[ok]), mag[ok])
        return out

    # ---- per-step data ------------------------------------------------------------------------
    def needed(self, layer: int, start: int, stop: int) -> np.ndarray:
        """words [stop-start, W]: union of the active sets of each step's tokens."""
        full = self._needed.get(layer)
        if full is not None:
            return full[start:stop]
        if self.steps.n * self.W * 8 <= NEEDED_CACHE_BYTES_PER_LAYER:
            full = self._needed[layer] = self._compute_needed(layer, 0, self.steps.n)
            return full[start:stop]
        return self._compute_needed(layer, start, stop)

    def _compute_needed(self, layer: int, start: int, stop: int) -> np.ndarray:
        pos, ptr = self.steps.token_positions(start, stop)
        rows = self.token_words(layer, pos)
        if np.all(np.diff(ptr) == 1):
            return rows
        return np.bitwise_or.reduceat(rows, ptr[:-1], axis=0)

    def activation_counts(self, layer: int) -> np.ndarray:
        """int64 [N]: how many of the trace's tokens activate each neuron (all tokens)."""
        key = ("counts", layer)
        cache = self.__dict__.setdefault("_counts", {})
        if key not in cache:
            masks = np.asarray(self.trace.packed_masks(self.trace_layer(layer)))
            bits = np.unpackbits(masks, axis=-1, count=self.trace.n_neurons, bitorder="little")
            c = bits.sum(axis=0, dtype=np.int64)
            cache[key] = c[self._neuron_map] if self._neuron_map is not None else c
        return cache[key]

    def tasks_of_steps(self, start: int, stop: int) -> list[str]:
        """Task label of every token of the steps, in order."""
        pos, _ = self.steps.token_positions(start, stop)
        return [str(t) for t in self.trace.task_of_token[pos]]
