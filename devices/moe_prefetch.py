"""The accuracy of speculative next-layer expert prefetch, per MoE model family, with its source.

Speculative prefetch applies MoE layer m's router to the hidden state entering layer m - 1 and reads
the experts it picks while layer m - 1 computes. Its accuracy (recall at K: the share of layer m's K
chosen experts that the K predicted contain) is a property of the model family, not of the device: the
published figures live in devices/models/moe/prefetch/speculative_accuracy.yaml, one per family, and a
stated fallback (with why) for families without one. A user's own figure (`--prefetch-accuracy`, e.g.
measured on a captured trace) always wins. Errors' persistence from token to token (`memory`, see
sim/moe/prefetch.py) has no published figure and is 0 unless given.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from devices.errors import FlashsimError
from devices.loading import validate_file

ACCURACY_FILE = Path(__file__).parent / "models" / "moe" / "prefetch" / "speculative_accuracy.yaml"


class _Figure(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    accuracy: float = Field(ge=0, le=1)
    model: str
    cite: str                      # one line for the printed output
    source: str                    # the full citation, conditions and derivation (JSON output)


class _Family(_Figure):
    model_types: list[str] = Field(min_length=1)


class _Fallback(_Figure):
    why: str


class _AccuracyFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    families: dict[str, _Family]
    fallback: _Fallback


@dataclass(frozen=True)
class PrefetchAccuracy:
    """The accuracy and error memory a run uses, and where the accuracy comes from."""

    accuracy: float
    memory: float
    kind: Literal["published", "fallback", "given"]
    cite: str
    source: str

    def line(self) -> str:
        """One line for replay/plan output."""
        return (f"speculative prefetch: accuracy {self.accuracy:.3f} ({self.kind}: {self.cite}), "
                f"error memory {self.memory:g}")


@lru_cache(maxsize=1)
def _figures() -> _AccuracyFile:
    return validate_file(_AccuracyFile, ACCURACY_FILE)


def family_accuracy(model_type: str) -> PrefetchAccuracy:
    """The published figure for a config.json `model_type`, else the stated fallback (memory 0)."""
    f = _figures()
    for fam in f.families.values():
        if model_type in fam.model_types:
            return PrefetchAccuracy(fam.accuracy, 0.0, "published", fam.cite, fam.source)
    fb = f.fallback
    return PrefetchAccuracy(fb.accuracy, 0.0, "fallback", f"no figure for {model_type}; {fb.cite}",
                            f"no figure for {model_type}: {fb.why}. Fallback: {fb.source}")


def resolve_prefetch(model_type: str, *, enabled: bool, accuracy: float | None = None,
                     memory: float | None = None) -> PrefetchAccuracy | None:
    """What a run with speculative prefetch uses: None when it is off (neither `enabled` nor a given
    accuracy); a given accuracy wins over the family's figure."""
    if accuracy is None and not enabled:
        if memory:
            raise FlashsimError("--prefetch-memory needs speculative prefetch: add --prefetch (or "
                                "--prefetch-accuracy P)")
        return None
    mem = 0.0 if memory is None else float(memory)
    if not 0 <= mem < 1:
        raise FlashsimError(f"--prefetch-memory must be in [0, 1), got {mem}")
    if accuracy is not None:
        if not 0 <= accuracy <= 1:
            raise FlashsimError(f"--prefetch-accuracy must be in [0, 1], got {accuracy}")
        return PrefetchAccuracy(float(accuracy), mem, "given", "--prefetch-accuracy", "given by the user")
    fam = family_accuracy(model_type)
    return PrefetchAccuracy(fam.accuracy, mem, fam.kind, fam.cite, fam.source)
