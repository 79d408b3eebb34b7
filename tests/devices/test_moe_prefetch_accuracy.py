"""The speculative-prefetch accuracy per MoE family (devices/moe_prefetch.py): the published figure with its
derivation, the stated fallback, and the user's figure winning over both."""

from __future__ import annotations

import pytest

from devices.errors import FlashsimError
from devices.moe_prefetch import family_accuracy, resolve_prefetch
from devices.moe_spec import load_moe_model


def test_published_figures_and_their_derivation() -> None:
    # arXiv 2511.10676's abstract: 94.69% (Qwen3-30B) and 93.03% (DeepSeek-V2-Lite), ~15 points above FATE
    q = family_accuracy(load_moe_model("qwen3-30b-a3b").family)
    assert q.kind == "published" and q.accuracy == pytest.approx(0.9469 - 0.15, abs=5e-4)
    assert "2511.10676" in q.cite and "Qwen3-30B-A3B" in q.source
    d = family_accuracy(load_moe_model("deepseek-v3").family)
    assert d.kind == "published" and d.accuracy == pytest.approx(0.9303 - 0.15, abs=5e-4)
    # every Qwen MoE generation shares the figure (same router design: softmax top-k over a linear gate)
    for name in ("qwen3.5-397b-a17b", "qwen3-coder-next", "qwen3.6-35b-a3b"):
        assert family_accuracy(load_moe_model(name).family) == q


@pytest.mark.parametrize("name", ["mixtral-8x7b", "olmoe-1b-7b", "gpt-oss-20b"])
def test_families_without_a_figure_take_the_stated_fallback(name) -> None:
    f = family_accuracy(load_moe_model(name).family)
    assert f.kind == "fallback" and f.accuracy == 0.79          # FATE's strict top-k figure
    assert "no figure for" in f.cite and "2312.17238" in f.source and "2502.12224" in f.source


def test_given_accuracy_wins_and_off_is_none() -> None:
    assert resolve_prefetch("qwen3_moe", enabled=False) is None
    g = resolve_prefetch("qwen3_moe", enabled=False, accuracy=0.5, memory=0.3)
    assert (g.accuracy, g.memory, g.kind) == (0.5, 0.3, "given")
    on = resolve_prefetch("mixtral", enabled=True)
    assert (on.accuracy, on.memory, on.kind) == (0.79, 0.0, "fallback")
    assert "speculative prefetch: accuracy 0.790 (fallback" in on.line()
    with pytest.raises(FlashsimError, match="needs speculative prefetch"):
        resolve_prefetch("qwen3_moe", enabled=False, memory=0.5)
    with pytest.raises(FlashsimError, match="prefetch-accuracy must be in"):
        resolve_prefetch("qwen3_moe", enabled=True, accuracy=1.2)

