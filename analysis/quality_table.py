"""Measured quality for the planner: the quantization-and-sparsity table `flashsim real quant-quality`
writes (shipped: analysis/data/quant_quality.json, measured on the embedded SmolLM2-135M), and published
perplexity ratios of Q8_0 / Q4_0 on larger models.

`QualityTable.lookup(bits, mass_kept)` gives a planner configuration its measured quality: the table's
rows of that weight precision (native, int8, int4) with oracle top-k FFN sparsity form a curve of
(activation mass kept -> next-token agreement with the native model, perplexity ratio); a configuration
that computes every neuron (mass kept 1) takes the dense row, a sparse one is interpolated on the curve
at its simulated activation mass kept (linear in agreement and in log perplexity). Below the smallest
measured mass the lowest row is returned with `bound: true` (quality is at most that: less mass kept never
measured better). So the quality of a sparse configuration is "the measured quality of the embedded model
when an exact predictor keeps the same share of activation mass"; selection rules that choose worse
neurons (SelectInfer's static + voted sets) lose more at the same mass (docs/adapt.md).

The planner's side (`measured_quality`, `quality_key`, `quality_ranking`) lives here too; which evidence
stands for a planned model of another size is analysis/quality_evidence.py's job.

The published numbers are wikitext-2 perplexities from llama.cpp (`perplexity`, context 512) as stated
with each entry; a ratio is the quantized perplexity over the F16 one.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devices.errors import FlashsimError
from sim.metric_names import ACTIVATION_MASS_KEPT, DRAM_PEAK_BYTES, TOKENS_PER_S

DEFAULT_TABLE = Path(__file__).resolve().parent / "data" / "quant_quality.json"
_LLAMA_README = ("llama.cpp README.md, 'Quantization' table (marked outdated; late-2023 versions, "
                 "github.com/ggerganov/llama.cpp): wikitext-2 test, context 512")
# (model, its parameter count, format, F16 ppl, quantized ppl, source): ratio = quantized / F16. Parameter
# counts from the architectures (LLaMA: Touvron et al. 2023, Table 2 shapes; OpenLLaMA-3B-v2: 26 layers,
# d_model 3200, d_ff 8640, vocab 32000, untied embeddings).
PUBLISHED: tuple[dict[str, Any], ...] = (
    {"model": "LLaMA-7B", "family": "llama", "params": 6_738_415_616, "format": "Q8_0", "f16_ppl": 5.9066, "ppl": 5.9070, "source": _LLAMA_README},
    {"model": "LLaMA-7B", "family": "llama", "params": 6_738_415_616, "format": "Q4_0", "f16_ppl": 5.9066, "ppl": 6.1565, "source": _LLAMA_README},
    {"model": "LLaMA-13B", "family": "llama", "params": 13_015_864_320, "format": "Q8_0", "f16_ppl": 5.2543, "ppl": 5.2548, "source": _LLAMA_README},
    {"model": "LLaMA-13B", "family": "llama", "params": 13_015_864_320, "format": "Q4_0", "f16_ppl": 5.2543, "ppl": 5.3860, "source": _LLAMA_README},
    {"model": "OpenLLaMA-3B-v2", "family": "llama", "params": 3_426_473_600, "format": "Q8_0", "f16_ppl": 8.5302, "ppl": 8.5695,
     "source": "ggml-org/ci, llama.cpp commit 4c013bb (2023-07-21), ggml-2-x86-cpu/README.md: the CI's "
               "perplexity run (wikitext-2, its short CI setting)"},
    {"model": "OpenLLaMA-3B-v2", "family": "llama", "params": 3_426_473_600, "format": "Q4_0", "f16_ppl": 8.5302, "ppl": 8.9700,
     "source": "ggml-org/ci, llama.cpp commit 4c013bb (2023-07-21), ggml-2-x86-cpu/README.md: the CI's "
               "perplexity run (wikitext-2, its short CI setting)"},
)
FORMAT_OF_BITS = {8: "Q8_0", 4: "Q4_0"}


def published(bits: int | None) -> list[dict[str, Any]]:
    """Published entries for a precision (8 -> Q8_0, 4 -> Q4_0), each with its ppl_ratio."""
    fmt = FORMAT_OF_BITS.get(bits) if bits else None
    return [{**e, "ppl_ratio": round(e["ppl"] / e["f16_ppl"], 4)} for e in PUBLISHED if e["format"] == fmt]


@dataclass
class QualityTable:
    """The measured rows and their provenance (see `flashsim real quant-quality --out`)."""

    doc: dict[str, Any]
    path: str = ""
    _curves: dict[int | None, list[dict[str, Any]]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for r in self.doc["rows"]:
            self._curves.setdefault(r["bits"], []).append(r)
        for rows in self._curves.values():
            rows.sort(key=lambda r: r["mass_kept"])

    @property
    def model(self) -> str:
        return str(self.doc["model"]["name"])

    def provenance(self) -> dict[str, Any]:
        d = self.doc
        return {"path": self.path, "model": d["model"], "text": d["text"], "command": d.get("command"),
                "date": d.get("date")}

    def lookup(self, bits: int | None, mass_kept: float | None) -> dict[str, Any] | None:
        """{agreement, ppl_ratio, basis, bound} for a precision at a simulated mass kept; None when the
        table has no row of that precision or the mass is unknown."""
        rows = self._curves.get(bits)
        if not rows or mass_kept is None or not math.isfinite(mass_kept):
            return None
        prec = "native" if bits is None else f"int{bits}"
        dense = [r for r in rows if r["keep"] >= 1]
        if mass_kept >= 1 - 1e-9 and dense:
            r = dense[0]
            return {"agreement": r["agreement"], "ppl_ratio": r["ppl_ratio"], "bound": False,
                    "basis": f"measured: {prec}"}
        lo, hi = rows[0], rows[-1]
        if mass_kept <= lo["mass_kept"]:
            return {"agreement": lo["agreement"], "ppl_ratio": lo["ppl_ratio"], "bound": True,
                    "basis": f"at most {prec} + oracle top-{lo['keep']:g} FFN (mass {lo['mass_kept']:.3f}): the "
                             f"configuration keeps less mass ({mass_kept:.3f}) than any measured row"}
        if mass_kept >= hi["mass_kept"]:
            return {"agreement": hi["agreement"], "ppl_ratio": hi["ppl_ratio"], "bound": False,
                    "basis": f"measured: {prec} (mass {hi['mass_kept']:.3f})"}
        for a, b in zip(rows, rows[1:]):
            if a["mass_kept"] <= mass_kept <= b["mass_kept"]:
                t = (mass_kept - a["mass_kept"]) / (b["mass_kept"] - a["mass_kept"]) if b["mass_kept"] > a["mass_kept"] else 0.0
                agree = a["agreement"] + t * (b["agreement"] - a["agreement"])
                la, lb = math.log(a["ppl_ratio"]), math.log(b["ppl_ratio"])
                return {"agreement": agree, "ppl_ratio": math.exp(la + t * (lb - la)), "bound": False,
                        "basis": f"{prec} + oracle top-k FFN at mass {mass_kept:.3f}, interpolated between "
                                 f"top-{a['keep']:g} and top-{b['keep']:g}"}
        return None  # unreachable: the mass lies within the sorted curve


def load_quality_table(path: str | Path | None = None) -> QualityTable:
    """The table at `path` (default: the shipped one). FlashsimError when it is missing or malformed."""
    p = Path(path) if path is not None else DEFAULT_TABLE
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FlashsimError(f"{p}: no quality table (make one with `flashsim real quant-quality --out {p}`)") from None
    except (OSError, ValueError) as e:
        raise FlashsimError(f"{p}: not a readable quality table ({e})") from None
    if doc.get("kind") != "flashsim-quant-quality" or not isinstance(doc.get("rows"), list):
        raise FlashsimError(f"{p}: not a quality table (kind {doc.get('kind')!r}); write one with "
                            "`flashsim real quant-quality --out`")
    need = {"bits", "keep", "agreement", "ppl_ratio", "mass_kept"}
    for i, r in enumerate(doc["rows"]):
        if not need <= set(r):
            raise FlashsimError(f"{p}: row {i} lacks {', '.join(sorted(need - set(r)))}")
    return QualityTable(doc, str(p))


def config_bits(preset: str, overrides: tuple[str, ...] | list[str]) -> int | None:
    """Weight bits of a planner configuration: None (native), 8 or 4 (the quantized precision's default)."""
    quantized = preset == "quantized" or "precision=quantized" in overrides
    if not quantized:
        return None
    for o in overrides:
        if o.startswith("quantized.bits="):
            return int(o.split("=", 1)[1])
    from sim.policies.presets import preset_config

    # the preset's own bits when the overrides do not set them (the quantized preset: 4)
    cfg = preset_config(preset).with_overrides(list(overrides))
    return int(cfg.precision.params.bits)


# ---- the planner's use of the table ------------------------------------------------------------------
def measured_quality(ev: Any, table: QualityTable | None) -> dict[str, Any] | None:
    """The measured quality of a planner Evaluation that ran, or None."""
    if table is None or not ev.ran:
        return None
    return table.lookup(config_bits(ev.preset, ev.overrides), ev.metric(ACTIVATION_MASS_KEPT))


def quality_key(rows: list[dict[str, Any]]) -> str:
    """The quality axis: measured agreement when every row that ran has one; else the perplexity ratio
    (lower is better) where any row has one (the rows without are left off that axis); else the
    mass-kept proxy."""
    ran = [r for r in rows if r["fits"]]
    if ran and all(r.get("agreement") is not None for r in ran):
        return "agreement"
    return "ppl_ratio" if any(r.get("ppl_ratio") is not None for r in ran) else ACTIVATION_MASS_KEPT


def quality_ranking(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The configurations that ran, best measured quality first (agreement, then lower perplexity
    ratio, then tok/s): quantized and sparse configurations on one scale."""
    ran = [r for r in rows if r["fits"] and r.get("agreement") is not None]
    ran.sort(key=lambda r: (-r["agreement"], r["ppl_ratio"], -(r[TOKENS_PER_S] or 0.0)))
    return [{"label": r["label"], "agreement": r["agreement"], "ppl_ratio": r["ppl_ratio"],
             TOKENS_PER_S: r[TOKENS_PER_S], DRAM_PEAK_BYTES: r[DRAM_PEAK_BYTES]} for r in ran]
