"""The one-line verdict of `flashsim calibrate` and the next step a device owner takes.

`calibration_verdict(report, quick, profile_path)` reads a validation report (real/validation/validate.py:
its `floor`, the pass rule against the host's own repeat spread, and the load and drift warnings) and
returns what the profile records (devices/section_base.py Calibration: mode, verdict, detail,
next_step) and what calibrate prints last. The verdict is validate's pass rule, nothing looser: PASS
when the simulator's error per metric (total per token, I/O, compute) is within max(5%, repeat
median) and max(10%, 1.25 x repeat p90); FAIL otherwise; `not validated` when no metric was scored.
"""

from __future__ import annotations

from typing import Any

NAMES = {"latency_s": "total per token", "io_s": "I/O", "compute_s": "compute"}
DOC = "docs/calibrate-and-validate.md"


def _metric_line(name: str, v: dict[str, Any]) -> str:
    return (f"{NAMES.get(name, name)} sim {v['sim_error_p50']:.1%} / {v['sim_error_p90']:.1%} vs limit "
            f"{v['limit_p50']:.1%} / {v['limit_p90']:.1%}")


def warnings_of(report: dict[str, Any]) -> list[str]:
    """The validation's warnings (host load at the start, the host's drift during the runs)."""
    return [w for w in (report.get("load_warning"), report.get("drift_warning")) if w]


def calibration_verdict(report: dict[str, Any], quick: bool, profile_path: str) -> dict[str, Any]:
    """{mode, verdict, detail, next_step, warnings} of one calibration (module docstring)."""
    mode = "quick" if quick else "full"
    floor = report.get("floor") or {}
    metrics = floor.get("metrics") or {}
    warnings = warnings_of(report)
    use = f"flashsim replay --device {profile_path} ... / flashsim plan --device {profile_path} ..."
    if not metrics:
        return {"mode": mode, "verdict": "not validated", "detail": "validation scored no configuration",
                "next_step": f"rerun flashsim calibrate (see {DOC})", "warnings": warnings}
    failed = {m: v for m, v in metrics.items() if not v["pass"]}
    shown = failed or metrics
    detail = ("; ".join(_metric_line(m, v) for m, v in shown.items())
              + f" (p50 / p90 over {floor.get('n_configs', 0)} configurations)")
    if not failed:
        verdict = "PASS"
        step = (f"use it: {use}; quick grids measure less: for figures to quote, run flashsim calibrate without "
                "--quick" if quick else f"use it: {use}")
    else:
        verdict = "FAIL"
        if warnings:
            step = ("the host was busy or drifted while validating (warnings above): rerun flashsim calibrate on an "
                    f"idle host; until then read replay/plan on {profile_path} as estimates off by about the "
                    "figures above")
        elif quick:
            step = ("rerun without --quick (a 2 GiB bench file, the full grids); if it still fails, read replay/plan "
                    f"on {profile_path} as estimates off by about the figures above ({DOC}, 'What holds today')")
        else:
            step = (f"read replay/plan on {profile_path} as estimates off by about the figures above; "
                    f"{DOC} ('What holds today') says where the model misses a host")
    return {"mode": mode, "verdict": verdict, "detail": detail, "next_step": step, "warnings": warnings}


def verdict_line(v: dict[str, Any]) -> str:
    """The last line calibrate prints: the verdict, its figures and the next step."""
    return f"verdict: {v['verdict']} ({v['mode']} calibration): {v['detail']}. Next: {v['next_step']}"
