"""Import published routing records (JSON lines, one record per token, sequence and MoE layer) into a
routing trace (traces/routing.py).

Accepted record fields (the spellings public loggers use; first present wins):

    sequence   "problem_id" | "req_id" | "request_id" | "sequence" | "prompt"  (with "dataset" prefixed
               when present, so two datasets' problem 0 stay apart)
    layer      "layer" | "layer_idx" | "layer_id"
    token      "token_idx" | "token_id" | "token" | "position"
    experts    "experts" | "expert_ids" | "topk_ids" | "topk_experts"
    weights    "gating_probs" | "topk_weights" | "weights" | "scores"          (optional)

Records of one sequence are aligned by token index; a token missing in any layer is dropped (loggers
lose a record at a prefill/decode boundary), and the count is reported. Rows are reordered by weight,
largest first, as the format stores them. The records say nothing of phase: the caller names it
(`phase="decode"` for a decode-only logger). Provenance (repository, commit, file, license, sha256 of
each input) goes into the manifest's source.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from devices.errors import FlashsimError
from traces.routing import DECODE, PREFILL, order_by_weight, write_routing_trace

SEQ_KEYS = ("problem_id", "req_id", "request_id", "sequence", "prompt")
LAYER_KEYS = ("layer", "layer_idx", "layer_id")
TOKEN_KEYS = ("token_idx", "token_id", "token", "position")
EXPERT_KEYS = ("experts", "expert_ids", "topk_ids", "topk_experts")
WEIGHT_KEYS = ("gating_probs", "topk_weights", "weights", "scores")
MAX_RECORD_BYTES = 1 << 20


def _pick(rec: dict, keys: Iterable[str], what: str, where: str, required: bool = True) -> Any:
    for k in keys:
        if k in rec:
            return rec[k]
    if required:
        raise FlashsimError(f"{where}: record has no {what} field (one of {', '.join(keys)})")
    return None


def read_records(paths: list[Path]) -> tuple[dict[tuple, dict[int, dict[int, tuple]]], int, list[dict]]:
    """{sequence key: {layer: {token: (experts, weights)}}}, top_k, and per-file provenance."""
    seqs: dict[tuple, dict[int, dict[int, tuple]]] = {}
    top_k = None
    files = []
    for path in paths:
        if not path.is_file():
            raise FlashsimError(f"{path}: routing records file not found")
        h = hashlib.sha256()
        n = 0
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                h.update(raw)
                if not raw.strip():
                    continue
                where = f"{path}:{lineno}"
                if len(raw) > MAX_RECORD_BYTES:
                    raise FlashsimError(f"{where}: record longer than {MAX_RECORD_BYTES} bytes; not a routing record")
                try:
                    rec = json.loads(raw)
                except (json.JSONDecodeError, UnicodeDecodeError) as e:
                    raise FlashsimError(f"{where}: invalid JSON ({e})") from None
                if not isinstance(rec, dict) or rec.get("type") == "meta":
                    continue
                seq = (rec.get("dataset", ""), str(_pick(rec, SEQ_KEYS, "sequence id", where)))
                layer = _pick(rec, LAYER_KEYS, "layer", where)
                tok = _pick(rec, TOKEN_KEYS, "token index", where)
                ex = _pick(rec, EXPERT_KEYS, "experts", where)
                w = _pick(rec, WEIGHT_KEYS, "weights", where, required=False)
                if not isinstance(layer, int) or not isinstance(tok, int) or layer < 0 or tok < 0:
                    raise FlashsimError(f"{where}: layer and token index must be whole numbers >= 0")
                if not isinstance(ex, list) or not ex or not all(isinstance(e, int) for e in ex):
                    raise FlashsimError(f"{where}: experts must be a non-empty list of expert ids")
                if w is not None and (not isinstance(w, list) or len(w) != len(ex)):
                    raise FlashsimError(f"{where}: weights must be a list as long as experts ({len(ex)})")
                if top_k is None:
                    top_k = len(ex)
                elif len(ex) != top_k:
                    raise FlashsimError(f"{where}: {len(ex)} experts, earlier records had {top_k} (top-k must be fixed)")
                seqs.setdefault(seq, {}).setdefault(layer, {})[tok] = (ex, w)
                n += 1
        files.append({"file": path.name, "sha256": h.hexdigest(), "records": n})
    if not seqs:
        raise FlashsimError(f"{', '.join(map(str, paths))}: no routing records found")
    return seqs, int(top_k), files


def assemble(seqs: dict[tuple, dict[int, dict[int, tuple]]], top_k: int) -> dict[str, Any]:
    """Arrays [T, M, K] over the layers every sequence has, tokens present in all of them."""
    layers = sorted(set.intersection(*(set(s) for s in seqs.values())))
    if not layers:
        raise FlashsimError("routing records: no MoE layer is present in every sequence")
    ex_rows, w_rows, seq_ids, dropped, has_w = [], [], [], 0, True
    for si, key in enumerate(sorted(seqs)):
        by_layer = seqs[key]
        toks = sorted(set.intersection(*(set(by_layer[lay]) for lay in layers)))
        dropped += len(set().union(*(set(by_layer[lay]) for lay in layers))) - len(toks)
        for t in toks:
            recs = [by_layer[lay][t] for lay in layers]
            ex_rows.append([r[0] for r in recs])
            if any(r[1] is None for r in recs):
                has_w = False
            w_rows.append([r[1] if r[1] is not None else [1.0 / top_k] * top_k for r in recs])
            seq_ids.append(si)
    if not ex_rows:
        raise FlashsimError("routing records: no token has a record in every MoE layer")
    experts = np.array(ex_rows, np.int64)
    weights = np.array(w_rows, np.float64) if has_w else np.full(experts.shape, 1.0 / top_k)
    experts, weights = order_by_weight(experts, weights)
    return {"experts": experts, "weights": weights, "sequence": np.array(seq_ids, np.int32),
            "layers": layers, "dropped_tokens": dropped, "has_weights": has_w,
            "sequences": ["/".join(x for x in k if x) for k in sorted(seqs)]}


def import_routing_jsonl(paths: list[str | Path], out: str | Path, *, model: str, n_layers: int | None = None,
                         n_experts: int | None = None, phase: str = "decode", provenance: dict | None = None,
                         overwrite: bool = False) -> Path:
    """Write a routing trace from JSON-lines routing records; see the module docstring."""
    if phase not in ("decode", "prefill"):
        raise FlashsimError(f"--phase must be decode or prefill, got {phase!r}")
    paths = [Path(p) for p in paths]
    seqs, top_k, files = read_records(paths)
    a = assemble(seqs, top_k)
    max_id = int(a["experts"].max())
    if n_experts is None:
        n_experts = max_id + 1
    elif max_id >= n_experts:
        raise FlashsimError(f"routing records name expert {max_id}, but --n-experts is {n_experts}")
    if n_layers is None:
        n_layers = a["layers"][-1] + 1
    elif a["layers"][-1] >= n_layers:
        raise FlashsimError(f"routing records have layer {a['layers'][-1]}, but --n-layers is {n_layers}")
    T = a["experts"].shape[0]
    source = {"kind": "imported", **(provenance or {}), "inputs": files, "sequences": a["sequences"],
              "dropped_tokens": a["dropped_tokens"],
              "weights": "as recorded" if a["has_weights"] else "absent in the records: stored as 1/K",
              "n_experts": "given" if n_experts != max_id + 1 else "largest id + 1 (or given)"}
    return write_routing_trace(out, model=model, n_layers=n_layers, moe_layers=a["layers"], n_experts=n_experts,
                               top_k=top_k, experts=a["experts"], weights=a["weights"],
                               phase=np.full(T, DECODE if phase == "decode" else PREFILL, np.uint8),
                               sequence=a["sequence"], source=source, overwrite=overwrite)
