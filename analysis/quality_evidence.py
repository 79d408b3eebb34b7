"""Which quality evidence stands for the planned model, and the planner's quality floor.

A configuration loses quality in two ways: the rounding of its weight precision (int8 / int4) and the
neurons it leaves out (a sparse policy keeps less than all of the activation mass). How much a model
loses to both depends on its size: SmolLM2-135M loses +21% perplexity to Q4_0, LLaMA 7B-13B +2.5-4% and
OpenLLaMA-3B +5% (docs/quant-quality.md). So a configuration of model M is rated by the closest
evidence, in this order:

1. **measured** on M or a model of its size: a `flashsim real quant-quality` table (the shipped one is
   SmolLM2-135M's; `plan --quality-table FILE` gives another) whose model has M's name or a parameter
   count within `SIZE_CLASS` (2x) of M's. It rates precision and sparsity together (QualityTable.lookup).
2. **exact**: native weights with every FFN neuron computed (activation mass kept 1) lose nothing.
3. **published**, for a weight precision with every neuron computed: the llama.cpp wikitext-2 perplexity
   ratio (quality_table.PUBLISHED, cited per entry) of the model nearest to M in log parameter count,
   M's family first. Only a perplexity ratio was published, no next-token agreement.
4. **none**: a sparse configuration of a model with no measurement of its size. Its quality is unknown
   and it cannot be shown to meet a quality floor.

The planner's default floor (`DEFAULT_MAX_PPL_RATIO`): perplexity at most 1.05x the native model's, the
issue's and llama.cpp's own yardstick for a usable 4-bit model (LLaMA-7B Q4_0: x1.042). Every row carries
`quality_evidence` ({kind, short, source}); `floor_rule` states the rule in words.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from analysis.quality_table import QualityTable, measured_quality, published
from devices.errors import FlashsimError

DEFAULT_MAX_PPL_RATIO = 1.05
SIZE_CLASS = 2.0   # a measurement stands for models within this factor of its parameter count
EXACT = {"kind": "exact", "short": "exact (native, dense)",
         "source": "native weights with every FFN neuron computed: nothing approximated"}


def _size(params: int | None) -> str:
    if params is None:
        return "size unknown"
    return f"{params / 1e9:.2f}B" if params >= 1e9 else f"{params / 1e6:.0f}M"


def table_params(table: QualityTable) -> int | None:
    """Parameter count of the model a table was measured on: recorded by `real quant-quality`, else
    that of the bundled model of the same name, else None."""
    n = table.doc.get("model", {}).get("total_params")
    if n:
        return int(n)
    from devices import load_model

    try:
        return load_model(table.model).total_params
    except (FlashsimError, OSError, ValueError):
        return None


@dataclass(frozen=True)
class QualityEvidence:
    """The evidence that rates configurations of one planned model (see the module doc)."""

    model: str
    params: int
    family: str
    table: QualityTable | None = None   # measured on this model or one of its size
    skipped: str | None = None          # why a given table does not stand for this model

    @property
    def measured_on(self) -> str | None:
        return self.table.model if self.table is not None else None

    def nearest_published(self, bits: int) -> dict[str, Any] | None:
        """The published entry of that precision nearest in size, the model's family first."""
        entries = published(bits)
        if not entries:
            return None
        return min(entries, key=lambda e: (e["family"] != self.family, abs(math.log(e["params"] / self.params))))

    def _measured(self) -> dict[str, Any]:
        t = self.table
        assert t is not None
        own = " (this model)" if t.model == self.model else f" ({_size(table_params(t))}, the size of {self.model})"
        return {"kind": "measured", "short": f"measured: {t.model}",
                "source": f"measured on {t.model}{own} by `{t.doc.get('command') or 'flashsim real quant-quality'}`"
                          f" ({t.doc.get('text', {}).get('n_tokens', '?')} tokens, {t.doc.get('date', 'undated')})"}

    def lookup(self, bits: int | None, mass_kept: float | None) -> dict[str, Any] | None:
        """{agreement (None when unpublished), ppl_ratio, bound, basis, evidence} for a configuration of
        that precision at that simulated mass kept; None when no evidence rates it."""
        if mass_kept is None or not math.isfinite(mass_kept):
            return None
        dense = mass_kept >= 1 - 1e-9
        if dense and bits is None:
            return {"agreement": 1.0, "ppl_ratio": 1.0, "bound": False, "basis": "exact", "evidence": EXACT}
        if self.table is not None:
            q = self.table.lookup(bits, mass_kept)
            if q is not None:
                return {**q, "evidence": self._measured()}
        if not dense or bits is None:
            return None
        e = self.nearest_published(bits)
        if e is None:
            return None
        ev = {"kind": "published", "short": f"published: {e['model']} {e['format']}",
              "source": f"{e['model']} ({_size(e['params'])} parameters, nearest in size to {self.model}'s "
                        f"{_size(self.params)}) {e['format']}: wikitext-2 perplexity {e['ppl']} vs F16 "
                        f"{e['f16_ppl']} (x{e['ppl_ratio']:.4f}); {e['source']}"}
        return {"agreement": None, "ppl_ratio": e["ppl_ratio"], "bound": False,
                "basis": f"published: {e['model']} {e['format']}", "evidence": ev}

    def unknown(self) -> dict[str, Any]:
        """The evidence entry of a configuration nothing rates (a sparse one at a size never measured)."""
        why = self.skipped or f"no quality table measured on a model of {self.model}'s size"
        return {"kind": "none", "short": "none at this size",
                "source": f"no measurement of FFN sparsity on {self.model} or a model within {SIZE_CLASS:g}x of its "
                          f"{_size(self.params)} parameters ({why}); measure it with `flashsim real quant-quality "
                          "--model LOCAL_MODEL --out FILE.json` and plan with --quality-table FILE.json"}

    def info(self) -> dict[str, Any]:
        """The plan's `quality` object (JSON): what evidence stands for the model."""
        out: dict[str, Any] = {**(self.table.provenance() if self.table is not None else {}),
                               "measured_on": self.measured_on, "plan_model": self.model,
                               "plan_model_params": self.params, "size_class": SIZE_CLASS}
        if self.skipped:
            out["table_not_used"] = self.skipped
        return out


def quality_evidence(spec: Any, table: QualityTable | None) -> QualityEvidence:
    """The evidence for a ModelSpec, given the measured table at hand (None: published and exact only)."""
    params = int(spec.total_params)
    ev = QualityEvidence(spec.name, params, spec.family)
    if table is None:
        return ev
    tp = table_params(table)
    if table.model == spec.name or (tp is not None and 1 / SIZE_CLASS <= tp / params <= SIZE_CLASS):
        return QualityEvidence(spec.name, params, spec.family, table)
    return QualityEvidence(spec.name, params, spec.family, None,
                           f"{table.model}'s measurement ({_size(tp)} parameters) is not used for a "
                           f"{_size(params)} model: how much a model loses to quantization and sparsity depends "
                           "on its size")


def check_max_ppl_ratio(x: float | None) -> None:
    if x is not None and not (math.isfinite(x) and x >= 1.0):
        raise FlashsimError(f"--max-ppl-ratio {x}: must be a number >= 1 (perplexity over the native model's), "
                            "or none for no quality floor")


def parse_max_ppl_ratio(text: str) -> float | None:
    """The CLI's --max-ppl-ratio: a number >= 1, or none/off."""
    if str(text).strip().lower() in ("none", "off"):
        return None
    try:
        x = float(text)
    except ValueError:
        raise FlashsimError(f"--max-ppl-ratio {text!r}: give a number >= 1 such as 1.05, or none") from None
    check_max_ppl_ratio(x)
    return x


def floor_rule(max_ppl_ratio: float | None, evidence: QualityEvidence | None) -> dict[str, Any]:
    """The rule `best` follows, in words (the plan's quality.floor)."""
    if evidence is None:
        return {"max_ppl_ratio": None, "rule": "no quality floor: no quality evidence (the activation-mass proxy only)"}
    if max_ppl_ratio is None:
        return {"max_ppl_ratio": None, "rule": "no quality floor (--max-ppl-ratio none): best is the fastest "
                "configuration that meets the other constraints, whatever its quality"}
    return {"max_ppl_ratio": max_ppl_ratio, "rule": (
        f"best is the fastest configuration whose perplexity is at most {max_ppl_ratio:g}x the native model's "
        f"(+{(max_ppl_ratio - 1) * 100:.0f}%), rated by the closest evidence for {evidence.model}: measured on it "
        "or a model of its size, else exact (native and dense), else the published ratio of the model nearest "
        f"in size; a configuration without evidence at {evidence.model}'s size cannot meet it. Change it with "
        "--max-ppl-ratio X (e.g. 1.25), or --max-ppl-ratio none")}


# ---- the planner's rows ------------------------------------------------------------------------------
def row_quality(ev: Any, evidence: QualityEvidence | None) -> dict[str, Any]:
    """The quality fields of a planner row (an Evaluation): agreement, ppl_ratio, basis, bound, evidence."""
    q = measured_quality(ev, evidence)
    out: dict[str, Any] = {"agreement": None, "ppl_ratio": None, "quality_basis": None, "quality_bound": None,
                           "quality_evidence": None}
    if q is not None:
        out.update(agreement=None if q["agreement"] is None else round(q["agreement"], 4),
                   ppl_ratio=round(q["ppl_ratio"], 4), quality_basis=q["basis"], quality_bound=q["bound"],
                   quality_evidence=q["evidence"])
    elif evidence is not None and ev.ran:
        out["quality_evidence"] = evidence.unknown()
    return out


def quality_reasons(ev: Any, evidence: QualityEvidence | None, min_agreement: float | None,
                    max_ppl_ratio: float | None) -> list[str]:
    """Why a configuration that ran misses a quality floor (empty: it meets them)."""
    if evidence is None or (min_agreement is None and max_ppl_ratio is None):
        return []
    q = measured_quality(ev, evidence)
    out = []
    if min_agreement is not None:
        if q is None or q["agreement"] is None:
            what = "no evidence" if q is None else f"{q['evidence']['short']} has no agreement"
            out.append(f"quality too low: no measured agreement for this configuration ({what})")
        elif q["agreement"] < min_agreement:
            out.append(f"quality too low: measured agreement {q['agreement']:.3f} < {min_agreement:g}")
    if max_ppl_ratio is not None:
        if q is None:
            out.append(f"quality unknown: no evidence for this configuration at {evidence.model}'s size")
        elif q["ppl_ratio"] > max_ppl_ratio:
            out.append(f"quality too low: perplexity x{q['ppl_ratio']:.4f} > {max_ppl_ratio:g} ({q['evidence']['short']})")
        elif q["bound"]:
            out.append(f"quality unknown: it keeps less activation mass than any measured row (x{q['ppl_ratio']:.3f} "
                       "or worse)")
    return out


def evidence_notes(rows: list[dict[str, Any]]) -> list[str]:
    """One note per distinct evidence the rows used, with its source."""
    seen: dict[str, str] = {}
    for r in rows:
        e = r.get("quality_evidence")
        if e and e["kind"] != "exact":
            seen.setdefault(e["short"], e["source"])
    return [f"quality evidence '{k}': {v}" for k, v in seen.items()]

