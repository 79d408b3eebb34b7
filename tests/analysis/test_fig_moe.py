"""MoE figures: they draw what the tables say (one line per policy / device, the table's points)."""

from __future__ import annotations

import numpy as np

from analysis.figures import fig_moe_dram, fig_moe_hit_rate
from analysis.moe_curves import budget_grid, hit_rate_curve, tps_vs_dram
from devices.moe_spec import moe_spec_from_hf_config
from sim.moe.run import MoERunConfig
from tests.sim.moe.routing_fixture import zipf_routing

TINY = {"model_type": "qwen3_moe", "hidden_size": 256, "moe_intermediate_size": 512, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 1000,
        "num_experts": 12, "num_experts_per_tok": 2}


def _routing():
    e, w = zipf_routing(16, 3, 12, 2, seed=4)
    return {"experts": e, "weights": w, "phase": np.ones(16, np.uint8)}


def test_hit_rate_figure_draws_each_policy_and_belady_on_top() -> None:
    spec = moe_spec_from_hf_config(TINY, "tiny")
    df = hit_rate_curve(spec, _routing(), ["lru", "lfu", "belady"], [0, 2, 4, 8, 12])
    for _cap, g in df.groupby("capacity"):
        assert g.set_index("policy")["hit_rate"]["belady"] >= g["hit_rate"].max() - 1e-12
    fig = fig_moe_hit_rate.draw(df)
    lines = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}
    assert set(lines) == {"lru", "lfu", "belady"}
    lru = df[df.policy == "lru"].sort_values("cache_share")
    np.testing.assert_allclose(lines["lru"].get_ydata(), lru["hit_rate"])
    np.testing.assert_allclose(lines["lru"].get_xdata(), lru["cache_share"] * 100)
    assert lines["belady"].get_linestyle() == "--"


def test_dram_figure_draws_expected_and_peak_per_device() -> None:
    spec = moe_spec_from_hf_config(TINY, "tiny")
    cfg = MoERunConfig(policy="lru", dtype="int4")
    df = tps_vs_dram(spec, _routing(), ["rtx4090-nvme", "apple-m1-max"], budget_grid(spec, cfg, 4), cfg)
    assert len(df) == 8 and (df["peak_tokens_per_s"] >= df["tokens_per_s"] * 0.999).all()
    fig = fig_moe_dram.draw(df)
    labels = [ln.get_label() for ln in fig.axes[0].get_lines()]
    assert labels == ["apple-m1-max (expected)", "apple-m1-max (peak-bound)",
                      "rtx4090-nvme (expected)", "rtx4090-nvme (peak-bound)"]
    g = df[df.device == "rtx4090-nvme"].sort_values("dram_bytes")
    np.testing.assert_allclose(fig.axes[0].get_lines()[2].get_ydata(), g["tokens_per_s"])
