"""What a real run leaves behind: per-token records (the simulator's `TokenRecord` schema, Parquet)
and the trace of what it did (the computed set of every step and layer, trace format v1), so the
simulator replays exactly that workload (`sim.engine.simulate` with predictor=oracle on it).

The executed trace has one token per step, all marked decode (phase 1) in one prompt; its
magnitude arrays (top-|a| and sum |a|) are copied from the source trace's token of that step, so the
simulator's quality proxy sees the same activations. Sizes in bytes, times in seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from sim import bitsets
from sim.records import Recorder
from traces.format import PromptInfo, SparsityRule, TraceWriter


def write_executed_trace(out: str | Path, run: Any, view: Any, spec: Any, provenance: dict | None = None,
                         overwrite: bool = True) -> Path:
    """run: RealRun; view: the TraceView the run was planned from (single-token steps)."""
    L, S, _ = run.executed.shape
    N = spec.d_ff
    src = view.trace
    pos, ptr = view.steps.token_positions(0, S)
    if not np.all(np.diff(ptr) == 1):
        raise ValueError("the executed trace needs one token per step (no batched prefill)")
    k = src.top_k
    prompts = [PromptInfo(id="real-run", task="real", n_prompt_tokens=0, n_generated_tokens=S)]
    with TraceWriter(out, spec, S, k, SparsityRule(rule="synthetic"), prompts,
                     provenance={"kind": "real-run executed sets", **(provenance or {})}, overwrite=overwrite) as w:
        w.token_ids[:] = np.asarray(src.token_ids)[pos]
        w.phase[:] = 1
        w.prompt_index[:] = 0
        for layer in range(L):
            bits = bitsets.unpack(run.executed[layer], N)
            w.masks[layer] = np.packbits(bits, axis=-1, bitorder="little")
            idx, mag = src.top(layer)
            w.top_idx[layer] = np.asarray(idx)[pos]
            w.top_mag[layer] = np.asarray(mag)[pos]
            w.abs_sum[layer] = np.asarray(src.abs_sum(layer))[pos]
    return Path(out)


def write_records(path: str | Path, run: Any) -> Path:
    """Per-token records as Parquet, columns `sim.records.TOKEN_COLUMNS` (atomic)."""
    from traces.outputs import write_atomic

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    r = Recorder()
    r.tokens = run.tokens
    frame = r.frame()
    return write_atomic(path, lambda tmp: frame.to_parquet(tmp, index=False), "records")
