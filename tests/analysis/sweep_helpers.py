"""Test-only sweep evaluators and inputs. NOT the simulator: these compute stand-in numbers from the
point's own fields so the sweep machinery (expansion, workers, resume, storage) can be tested
exactly, independently of the simulator. Imported by name in worker processes."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.sweep_spec import SweepPoint
from devices.errors import FlashsimError
from devices.model_spec import ModelSpec
from traces.build import write_dense_trace
from traces.format import PromptInfo

CHECKED: list[int] = []


def _u(point: SweepPoint) -> float:
    """A number in [0, 1) that depends only on the point's identity."""
    return int(hashlib.sha256(point.point_id.encode()).hexdigest()[:8], 16) / 2**32


def fake_point(point: SweepPoint) -> dict:
    """Deterministic stand-in metrics (a function of the point's fields only)."""
    k = float(point.overrides.get("k", 1))
    budget = point.dram_budget_bytes or 8 * 2**30
    return {"ms_per_token": 10.0 / k + 1.0 + _u(point), "flash_bytes_per_token": int(1e6 / k),
            "dram_peak_bytes": min(budget, int(k * 2**28)), "tokens_per_s": 1e3 / (10.0 / k + 1.0 + _u(point)),
            "label_text": point.label()}


def slow_point(point: SweepPoint) -> dict:
    """fake_point after a pause (FLASHSIM_TEST_POINT_S seconds, default 0.05): long enough to kill."""
    time.sleep(float(os.environ.get("FLASHSIM_TEST_POINT_S", "0.05")))
    return fake_point(point)


def failing_point(point: SweepPoint) -> dict:
    """A user-level failure for k == 3 (recorded as a failed point), fake numbers otherwise."""
    if point.overrides.get("k") == 3:
        raise FlashsimError(f"budget too small for k=3 on {point.device}")
    return fake_point(point)


def buggy_point(point: SweepPoint) -> dict:
    """A bug (not a FlashsimError) at k == 2: the sweep must stop and say so."""
    if point.overrides.get("k") == 2:
        raise ZeroDivisionError("bug")
    return fake_point(point)


def tiny_spec() -> ModelSpec:
    return ModelSpec.from_hf_config(
        {"model_type": "llama", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128}, "tiny-llama")


def write_tiny_trace(out: Path, seed: int = 0, n_tokens: int = 12) -> Path:
    """A 2-layer, 96-neuron trace from seeded random activations (top-25% active)."""
    spec = tiny_spec()
    rng = np.random.default_rng(seed)
    acts = rng.standard_normal((spec.n_layers, n_tokens, spec.d_ff)).astype(np.float32)
    prompts = [PromptInfo(id="p0", task="qa", n_prompt_tokens=4, n_generated_tokens=n_tokens - 4)]
    phase = np.array([0] * 4 + [1] * (n_tokens - 4), np.uint8)
    return write_dense_trace(out, spec, acts, np.arange(n_tokens, dtype=np.int32), phase,
                             np.zeros(n_tokens, np.int32), prompts, rule="topk", target_fraction=0.25)


def results_table() -> pd.DataFrame:
    """A hand-made results table with round numbers (the shape a sweep writes), for figure tests."""
    rows = []
    gib = 2**30

    def add(preset, overrides, budget, ms, io, comp, stall, mm, flash_mib, peak_gib, mass, status="ok"):
        i = len(rows)
        rows.append({
            "point_id": f"p{i:03d}", "point_index": i, "trace": "/t/tiny", "trace_sha256": "0" * 64,
            "model": None, "device": "apple-m1-max", "dram_budget_bytes": budget, "preset": preset,
            "overrides_json": json.dumps(overrides, sort_keys=True), "seed": 0, "status": status,
            "error": None if status == "ok" else "does not fit",
            "ms_per_token": ms, "tokens_per_s": None if ms is None else 1e3 / ms, "io_ms_per_token": io,
            "compute_ms_per_token": comp, "stall_ms_per_token": stall, "memory_mgmt_ms_per_token": mm,
            "flash_bytes_per_token": None if flash_mib is None else flash_mib * 2**20,
            "dram_peak_bytes": None if peak_gib is None else peak_gib * gib, "activation_mass_kept": mass,
        })

    for budget in (2 * gib, 4 * gib):
        add("naive", {}, budget, 100.0, 90.0, 10.0, 90.0, 0.0, 400.0, 1.5, 1.0)
        add("hybrid", {}, budget, 50.0, 45.0, 5.0, 45.0, 0.0, 200.0, budget / gib * 0.9, 1.0)
        for k, (ms, mib) in {1: (20.0, 40.0), 2: (16.0, 30.0), 4: (12.0, 20.0), 8: (10.0, 15.0)}.items():
            add("llm-in-a-flash", {"window.k": k}, budget, ms, ms - 4.0, 2.0, ms - 5.0, 1.0, mib,
                1.0 + 0.1 * k, 0.95)
        add("dense", {}, budget, None, None, None, None, None, None, None, None, status="error")
    return pd.DataFrame(rows)
