"""`flashsim plan`: the what-if planner (analysis.planner) on the command line: feasibility of every
preset and parameter grid point, the recommended configuration, the Pareto front, the smallest DRAM
that meets a tok/s target (and an energy limit, --max-joules-per-token) and the binding constraint. Human output: tok/s, GiB, ms; --json: one object.

Every row gives three speeds: expected (the presets' realistic predictors and prefetch, achievable device
numbers), the device peak-bound (datasheet ceiling) and the ideal-policy bound (oracle predictor, perfect
prefetch). Progress goes to stderr: a bar on a terminal, one line per stage otherwise. The printed time is
the whole command, interpreter start included. Heavy modules are imported when the command runs, so
`flashsim plan --help` answers before NumPy is loaded."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from analysis.planner import Plan

DEFAULT_PLAN_TOKENS = 128        # = analysis.plan_setup.DEFAULT_PLAN_TOKENS (tests/test_cli_startup.py)
DEFAULT_MAX_PPL_RATIO = 1.05     # = analysis.quality_evidence.DEFAULT_MAX_PPL_RATIO (tests/test_cli_startup.py)
# metric names from where they are produced (sim/metric_names.py imports nothing: --help stays light)
from sim.metric_names import (  # noqa: E402
    ACTIVATION_MASS_KEPT,
    COMPUTE_MS_PER_TOKEN,
    DRAM_PEAK_BYTES,
    JOULES_PER_TOKEN,
    MEMORY_MGMT_MS_PER_TOKEN,
    STALL_MS_PER_TOKEN,
    TOKENS_PER_S,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="what-if: feasibility, best policy, minimum DRAM for a target")
    p.add_argument("--model", required=True, help="bundled model name or a local HF model folder / config.json")
    p.add_argument("--device", required=True, help="device profile name or file")
    p.add_argument("--dram-free", default=None, help="DRAM the model may use, e.g. 3GiB (default: the device's "
                   "capacity minus its reserved memory)")
    p.add_argument("--target-tps", type=float, default=None, help="required decode tokens per second")
    p.add_argument("--min-quality", type=float, default=None,
                   help="required activation mass kept, 0..1 (the quality proxy)")
    p.add_argument("--max-joules-per-token", type=float, default=None, dest="max_jpt",
                   help="energy limit: joules per decode token (from the device profile's energy numbers)")
    p.add_argument("--min-agreement", type=float, default=None,
                   help="required next-token agreement with the native model, 0..1 (measured on the embedded model: "
                   "analysis/data/quant_quality.json)")
    p.add_argument("--max-ppl-ratio", default=str(DEFAULT_MAX_PPL_RATIO), metavar="X",
                   help=f"quality floor: perplexity at most X times the native model's, by the closest evidence "
                   f"for the model (default {DEFAULT_MAX_PPL_RATIO:g}; none: no floor)")
    p.add_argument("--quality-table", default=None, metavar="FILE.json",
                   help="quality measured on your model (`flashsim real quant-quality --model LOCAL --out FILE.json`); "
                   "default: the shipped SmolLM2-135M table, used only for models of its size")
    p.add_argument("--trace", default=None, help="trace to replay (default: synthesize one of the model's shape)")
    p.add_argument("--tokens", type=int, default=DEFAULT_PLAN_TOKENS,
                   help=f"decode tokens of the synthetic trace (default {DEFAULT_PLAN_TOKENS})")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic trace and noisy predictors")
    p.add_argument("--native-only", action="store_true",
                   help="leave out quantized configurations (a filter: their quality is measured like the others')")
    p.add_argument("--bound", choices=("achievable", "peak"), default="achievable",
                   help="device numbers: achievable (published/measured, the default; each speed is shown with its "
                        "peak-bound figure beside it) or peak (datasheet ceiling only)")
    p.add_argument("--runtime", default=None, help="the inference runtime every configuration is priced with "
                                                  "(devices/runtimes/: llama.cpp, the default, compiled-graph, eager-pytorch)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    from flashsim.commands.moe_plan import add_arguments

    add_arguments(p)
    p.set_defaults(func=_plan)


def command_seconds() -> float:
    """Wall seconds since this process started (Linux: /proc; elsewhere since flashsim.main was imported)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime_s = float(f.read().split()[0])
        import os

        return max(uptime_s - start_ticks / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        from flashsim.main import STARTED_S

        return time.perf_counter() - STARTED_S


class StageProgress:
    """Progress on stderr: a bar on a terminal; otherwise one line per stage as it ends (its seconds
    and simulated runs), so logs show where the time goes and bad input still prints one line."""

    def __init__(self, stream: Any = None):
        from devices.progress import is_terminal

        self.stream = stream or sys.stderr
        self.stage, self.runs, self.t0 = "", 0, time.perf_counter()
        self.bar = None
        if is_terminal(self.stream):
            from tqdm import tqdm

            self.bar = tqdm(total=None, unit="run", file=self.stream, leave=False)

    def __call__(self, stage: str | None) -> None:
        if stage is None:
            self.runs += 1
            if self.bar is not None:
                self.bar.update(1)
            return
        if self.bar is not None:
            self.bar.set_description(stage)
            return
        now = time.perf_counter()
        if self.stage:
            from devices.progress import note

            note(f"plan: {self.stage}: {now - self.t0:.1f} s" + (f", {self.runs} simulated runs" if self.runs else ""),
                 self.stream)
        self.stage, self.runs, self.t0 = stage, 0, now

    def close(self, ok: bool = True) -> None:
        """End the progress: the bar goes; in a log the last stage's line (not after an error: the
        error is the one line)."""
        if self.bar is not None:
            self.bar.close()
        elif self.stage and ok:
            self("")


def run_plan(args: argparse.Namespace) -> Plan:
    """Parse the sizes and plan, with progress on stderr."""
    from analysis.plan_setup import plan_model
    from analysis.planner import SHIPPED
    from analysis.quality_evidence import parse_max_ppl_ratio
    from analysis.quality_table import load_quality_table
    from devices.errors import FlashsimError
    from devices.units import parse_bytes

    budget = None
    if args.dram_free is not None:
        if str(args.dram_free).strip().startswith("-"):
            raise FlashsimError(f"--dram-free {args.dram_free}: must be a positive size such as 3GiB")
        budget = parse_bytes(args.dram_free, "--dram-free")
        if budget <= 0:
            raise FlashsimError(f"--dram-free {args.dram_free}: must be > 0 bytes")
    max_ppl = parse_max_ppl_ratio(getattr(args, "max_ppl_ratio", str(DEFAULT_MAX_PPL_RATIO)))
    quality = SHIPPED if getattr(args, "quality_table", None) is None else load_quality_table(args.quality_table)
    progress = StageProgress()
    try:
        result = plan_model(args.model, args.device, budget_bytes=budget, target_tps=args.target_tps,
                            min_quality=args.min_quality, trace=args.trace, tokens=args.tokens, seed=args.seed,
                            native_only=args.native_only, progress=progress, max_jpt=args.max_jpt,
                            min_agreement=args.min_agreement, bound=getattr(args, "bound", "achievable"),
                            max_ppl_ratio=max_ppl, quality=quality, runtime=getattr(args, "runtime", None))
    except BaseException:
        progress.close(ok=False)
        raise
    progress.close()
    return result


def _plan(args: argparse.Namespace) -> int:
    from devices.moe_spec import is_moe_model
    from flashsim.output import print_json

    if is_moe_model(args.model):
        from flashsim.commands.moe_plan import plan_moe

        return plan_moe(args)
    result = run_plan(args)
    result.seconds = command_seconds()     # the whole command
    if args.json:
        print_json(result.to_json())
    else:
        print_plan(result)
    return 0


def _tps(v: float | None) -> str:
    return "inf" if v is None else f"{v:.2f}"


def _mj(j: float | None) -> str:
    return "?" if j is None else f"{1e3 * j:.2f}"


def _gib(v: int | None) -> str:
    return "" if v is None else f"{v / 2**30:.2f}"


def _q(v: float | None, bound: bool | None, digits: int = 3, mark: str = "<=") -> str:
    """A measured quality figure; `mark` flags a bound (less mass kept than any measured row: agreement
    at most, perplexity ratio at least the lowest row's)."""
    return "" if v is None else (mark if bound else "") + f"{v:.{digits}f}"


def _evidence(r: dict) -> str:
    """The short name of the quality evidence a row used (its source is a note)."""
    e = r.get("quality_evidence")
    return "" if not e else e["short"]


def print_plan(p: Plan, *, full: bool = True) -> None:
    """The plan as text: trace, constraints, table, best, Pareto front, minimum DRAM."""
    from devices.units import UNITS_NOTE, format_bytes
    from flashsim.output import print_table
    targets = []
    if p.target_tps is not None:
        targets.append(f">= {p.target_tps:g} tok/s")
    if p.min_quality is not None:
        targets.append(f"activation mass kept >= {p.min_quality:g}")
    if p.max_jpt is not None:
        targets.append(f"<= {p.max_jpt:g} J/token")
    if p.min_agreement is not None:
        targets.append(f"measured agreement >= {p.min_agreement:g}")
    mode = f" in power mode {p.power_mode}" if p.power_mode else ""
    print(f"plan: {p.model} on {p.device}{mode} ({p.bound} device numbers), runtime {p.runtime}, "
          f"DRAM budget {format_bytes(p.budget_bytes)}"
          + (f", target {' and '.join(targets)}" if targets else ", no target (fastest that fits)"))
    print(UNITS_NOTE)
    print(f"trace: {p.trace.get('description', p.trace.get('path'))}")
    floor = (p.quality or {}).get("floor")
    if floor:
        print(f"quality floor: {floor['rule']}")
    if full:
        rows = []
        peaks = (p.peak_bound or {}).get("configurations", {})
        for r in p.rows:
            status = "ok" if r["feasible"] else "; ".join(x.split(":")[0] for x in r["reasons"])
            ideal = r.get("ideal_policy_tokens_per_s")
            rows.append([r["label"], _tps(r[TOKENS_PER_S]) if r["fits"] else "-",
                         _tps(peaks[r["label"]]) if r["label"] in peaks else "-",
                         _tps(ideal) if ideal is not None or r["fits"] else "-", _gib(r[DRAM_PEAK_BYTES]),
                         "" if r[ACTIVATION_MASS_KEPT] is None else f"{r[ACTIVATION_MASS_KEPT]:.3f}",
                         _q(r.get("agreement"), r.get("quality_bound")), _q(r.get("ppl_ratio"), r.get("quality_bound"), 3, ">="),
                         _evidence(r), _mj(r.get(JOULES_PER_TOKEN)), r["binding_constraint"], status])
        print()
        print_table(["configuration", "tok/s", "peak-bound", "ideal-policy", "DRAM GiB", "mass kept", "agree", "ppl x",
                     "quality evidence", "mJ/token", "binding", "feasible"], rows, align="lrrrrrrrlrll")
        print("(tok/s: expected, the presets' realistic predictors and prefetch on achievable device numbers; "
              "peak-bound: the same at the datasheet ceiling; ideal-policy: an oracle predictor and perfect "
              "prefetch on the achievable numbers)")
    print()
    if p.best is not None:
        b = p.best
        pb = (p.peak_bound or {}).get("best")
        ib = b.get("ideal_policy_tokens_per_s")
        bounds = ([f"{_tps(pb)} peak-bound"] if pb is not None else []) + \
            ([f"{_tps(ib)} ideal-policy bound"] if ib is not None else [])
        beside = f" expected ({', '.join(bounds)})" if bounds else ""
        print(f"best: {b['label']}: {_tps(b[TOKENS_PER_S])} tok/s{beside}, DRAM {format_bytes(b[DRAM_PEAK_BYTES])}, "
              f"mass kept {b[ACTIVATION_MASS_KEPT]:.3f}, "
              + (f"ppl x{b['ppl_ratio']:.4f} ({_evidence(b)}), " if b.get("ppl_ratio") is not None else "")
              + f"energy {_mj(b.get(JOULES_PER_TOKEN))} mJ/token; "
              f"bound by {b['binding_constraint']} "
              f"(per token: flash stall {b[STALL_MS_PER_TOKEN]:.1f} ms, compute {b[COMPUTE_MS_PER_TOKEN]:.1f} ms, "
              f"memory mgmt {b[MEMORY_MGMT_MS_PER_TOKEN]:.1f} ms)")
    else:
        why = f"closest: {p.closest['label']} ({'; '.join(p.closest['reasons'])})" if p.closest else \
            "nothing fits the budget"
        print(f"infeasible: no configuration meets the constraints; {why}; bound by {p.binding}")
    qk = (p.quality or {}).get("axis", ACTIVATION_MASS_KEPT)
    front = ", ".join(f"{r['label']} ({_tps(r[TOKENS_PER_S])} tok/s, {_gib(r[DRAM_PEAK_BYTES])} GiB, "
                      f"{r[qk]:.3f}, {_mj(r.get(JOULES_PER_TOKEN))} mJ)" for r in p.pareto)
    axis = {"agreement": "measured agreement", "ppl_ratio": "perplexity ratio (rows with quality evidence)"}.get(
        qk, "mass kept")
    axes = f"tok/s x DRAM x {axis}" + (" x energy" if any(r.get(JOULES_PER_TOKEN) is not None for r in p.rows) else "")
    print(f"Pareto front ({axes}): {front or 'empty'}")
    for c in p.comparisons:
        print(f"{c['name']}: " + "; ".join(
            f"{r['label']}: {_tps(r[TOKENS_PER_S]) if r['fits'] else 'does not fit'}"
            + (f" tok/s, {_gib(r[DRAM_PEAK_BYTES])} GiB, agreement {_q(r.get('agreement'), r.get('quality_bound')) or '?'}, "
               f"ppl x{_q(r.get('ppl_ratio'), r.get('quality_bound'), 3, '>=') or '?'} ({_evidence(r)})" if r["fits"] else "")
            for r in c["rows"]))
    m = p.min_dram
    what = "the target" if p.target_tps is not None else "the constraints (best configuration only: no --target-tps)"
    if m.get("bytes") is not None:
        print(f"smallest DRAM meeting {what}: {format_bytes(m['bytes'])} with {m['configuration']} "
              f"(bisection to {format_bytes(m['tolerance_bytes'])}; families tried: "
              + ", ".join(f"{f['label']} -> {format_bytes(f['min_dram_bytes']) if f['min_dram_bytes'] else 'none'}"
                          for f in m["families"]) + ")")
    else:
        print(f"smallest DRAM meeting {what}: none ({m.get('reason', 'no budget up to the device DRAM works')})")
    if p.device_inputs:
        from flashsim.commands.replay import inputs_line

        print(inputs_line(p.device_inputs))
    for n in p.notes:
        print(f"note: {n}")
    print(f"({len(p.rows)} configurations, {p.runs} simulated runs with the bisection and bounds, {p.seconds:.1f} s "
          f"in all: {p.run_seconds:.1f} s in simulated runs, {max(p.seconds - p.run_seconds, 0.0):.1f} s outside them)")
