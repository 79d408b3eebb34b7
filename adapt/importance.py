"""The GSI file format (schema_version 1) and the block importance vector controllers see.

Owns: reading, validating and writing GSI files (`read_gsi_file`, `validate_gsi`, `write_gsi_file`,
`make_gsi_document`), which `real/studies/gsi.py` produces (`flashsim adapt gsi`), and turning one into a
per-block importance (`removal_order`, `importance_vector`). This lives in `sim` so the simulator and
the controllers can read GSI files without importing `real` (imports flow real -> sim, never back).

File (JSON, written atomically: temporary name then os.replace), schema_version 1:
  schema_version: 1
  model:          {name: "smollm2-135m", n_layers: 30}
  text:           {source: "builtin" | path, sha256: hex digest of the UTF-8 text, n_tokens: tokens scored}
  dense_ppl:      perplexity with no block dropped
  gsi:            [{block: "ffn:12", ppl_after: float}, ...] in removal order; ppl_after is the
                  perplexity with this block and all earlier ones dropped (a prefix of the full
                  greedy order when run with --steps N < 2L)
  one_shot:       [{block, ppl_alone: float}, ...] every block, sorted ascending by ppl_alone (ties
                  in block order)
A non-finite perplexity (the model diverged) is written as null. The file holds no timings, so the
same model, text and settings give a byte-identical file.

Importance (higher = more important), a rank scaled to (0, 1]: the blocks GSI removed come first
(removed first = least important), then the blocks GSI did not reach, ascending by their one-shot
perplexity (null = infinite = most important; ties in block order mha:0, ffn:0, mha:1, ...). Block i
gets (rank_i + 1) / 2L. A rank, not a perplexity, because GSI perplexities are conditional on the
earlier removals and are not comparable across blocks; the order is what RAP's controllers use.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from devices.errors import FlashsimError
from sim.blocks import block_names
from traces.outputs import replace_output

SCHEMA_VERSION = 1


def _num(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def make_gsi_document(*, dense_ppl: float, gsi: Sequence[tuple[str, float]],
                      one_shot: Sequence[tuple[str, float]], model_name: str, n_layers: int,
                      text_sha256: str, text_source: str, n_tokens: int) -> dict[str, Any]:
    """The schema_version 1 document (non-finite perplexities become null)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "model": {"name": model_name, "n_layers": n_layers},
        "text": {"source": text_source, "sha256": text_sha256, "n_tokens": n_tokens},
        "dense_ppl": _num(dense_ppl),
        "gsi": [{"block": b, "ppl_after": _num(p)} for b, p in gsi],
        "one_shot": [{"block": b, "ppl_alone": _num(p)} for b, p in one_shot],
    }


def write_gsi_file(path: str | Path, doc: dict[str, Any]) -> None:
    """Write `doc` as JSON atomically (a temporary name in the same folder, then os.replace)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n", encoding="utf-8")
        replace_output(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def gsi_path_for(model_name: str, given: str | None = None) -> Path:
    """`given` as a path, or the GSI file shipped for `model_name` (adapt/data/<model>.gsi.json);
    FlashsimError naming the command that computes one when none is shipped."""
    if given:
        return Path(given)
    shipped = Path(__file__).resolve().parent / "data" / f"{model_name}.gsi.json"
    if not shipped.is_file():
        raise FlashsimError(f"--gsi: no GSI file shipped for model {model_name!r} ({shipped}); compute one with "
                            f"`flashsim adapt gsi --model {model_name} --steps all --out FILE.json` and pass "
                            "--gsi FILE.json")
    return shipped


def read_gsi_file(path: str | Path) -> dict[str, Any]:
    """Load and check a GSI file; FlashsimError naming the file and field if it is not one."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FlashsimError(f"{path}: no such GSI file") from None
    except IsADirectoryError:
        raise FlashsimError(f"{path}: is a directory, not a GSI file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FlashsimError(f"{path}: not a GSI JSON file ({e})") from None
    validate_gsi(doc, where=str(path))
    return doc


def _is_ppl(x: object) -> bool:
    return x is None or (isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0)


def validate_gsi(doc: Any, where: str = "GSI document") -> None:
    """FlashsimError naming the field when `doc` is not a schema_version 1 GSI document."""
    if not isinstance(doc, dict) or doc.get("schema_version") != SCHEMA_VERSION:
        raise FlashsimError(f"{where}: schema_version must be {SCHEMA_VERSION}")
    for key, field_name in (("gsi", "ppl_after"), ("one_shot", "ppl_alone")):
        rows = doc.get(key)
        if not isinstance(rows, list) or not all(
                isinstance(r, dict) and isinstance(r.get("block"), str) and field_name in r for r in rows):
            raise FlashsimError(f"{where}: field {key!r} must be a list of {{block, {field_name}}}")
        for i, r in enumerate(rows):
            if not _is_ppl(r[field_name]):
                raise FlashsimError(f"{where}: {key}[{i}].{field_name} = {r[field_name]!r}: expected a "
                                    "positive finite number or null")
    model = doc.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("n_layers"), int) or model["n_layers"] < 1:
        raise FlashsimError(f"{where}: field 'model' must be {{name, n_layers >= 1}}")
    if not _is_ppl(doc.get("dense_ppl")) or doc.get("dense_ppl") is None:
        raise FlashsimError(f"{where}: field 'dense_ppl' must be a positive finite number")
    names = block_names(model["n_layers"])
    valid = set(names)
    gsi = [r["block"] for r in doc["gsi"]]
    for key in ("gsi", "one_shot"):
        for i, r in enumerate(doc[key]):
            if r["block"] not in valid:
                raise FlashsimError(f"{where}: {key}[{i}].block {r['block']!r}: expected mha:I or ffn:I "
                                    f"with 0 <= I < {model['n_layers']} (model.n_layers)")
    if len(set(gsi)) != len(gsi):
        raise FlashsimError(f"{where}: field 'gsi' lists a block twice")
    one = [r["block"] for r in doc["one_shot"]]
    if sorted(one) != sorted(names):
        raise FlashsimError(f"{where}: field 'one_shot' must list each of the {len(names)} blocks once")


def check_names(doc: dict[str, Any], names: Sequence[str], where: str = "GSI file") -> None:
    """FlashsimError when the GSI file is for a model with another block list."""
    n = doc["model"]["n_layers"]
    if tuple(names) != block_names(n):
        raise FlashsimError(f"{where}: computed for {doc['model'].get('name')!r} with {n} layers "
                            f"({2 * n} blocks), but the model has {len(names)} blocks; run "
                            "`flashsim adapt gsi` on this model")


def removal_order(doc: dict[str, Any], names: Sequence[str]) -> np.ndarray:
    """int64 [2L] block indices, least important first (GSI order, then the rest by one-shot ppl)."""
    check_names(doc, names)
    index = {b: i for i, b in enumerate(names)}
    gsi = [index[r["block"]] for r in doc["gsi"]]
    seen = set(gsi)
    rest = sorted((index[r["block"]] for r in doc["one_shot"] if index[r["block"]] not in seen),
                  key=lambda i: (_alone(doc)[i], i))
    return np.array(gsi + rest, np.int64)


def _alone(doc: dict[str, Any]) -> dict[int, float]:
    names = block_names(doc["model"]["n_layers"])
    index = {b: i for i, b in enumerate(names)}
    return {index[r["block"]]: math.inf if r["ppl_alone"] is None else float(r["ppl_alone"])
            for r in doc["one_shot"]}


def importance_vector(doc: dict[str, Any], names: Sequence[str]) -> np.ndarray:
    """float64 [2L]: (rank + 1) / 2L with rank 0 = the least important block (see the docstring)."""
    order = removal_order(doc, names)
    out = np.empty(len(order), np.float64)
    out[order] = (np.arange(len(order)) + 1) / len(order)
    return out
