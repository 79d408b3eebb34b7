"""Ablation of the simulator's machine-model terms, scored out of sample on kept validation grids.

Every term of the machine model is switched off in turn (a clean switch: its profile keys dropped,
a run-config flag, or a structural choice in the code), and the simulator is then scored on kept
grids (`flashsim validate --keep`) of different boots: each grid's real runs against the simulator
run with *another* grid's calibration (its profile.yaml, what `calibrate` measured on that boot).
A term earns its place when removing it makes the held-out latency error worse by at least one
point (median or p90).

Two figures per direction: the raw error (|sim - real| / real, the mean over the grid's passes)
and `level_removed` (real.validation.validate_score.level_removed: one factor per mode taken out). Between
boots the host's speed moves (the same disk read 0.40-0.64x as fast on one boot as on another), so
the raw held-out error is mostly that level difference, which a term can offset by chance (any
term that adds time "helps" on a slower boot). The decision therefore uses `level_removed`: the
model's error from configuration to configuration, the part a machine-model term is for. The raw
figures are printed beside it.

    python scripts/ablation.py [GRID ...] [--json OUT] [--terms a,b,a+b] [--in-sample]

A term joined with `+` (`--terms reader_planning+batch_overhead`) switches those terms off together,
for a joint check: removing one term changes what the others carry.

The terms listed are the model's; the ones the ablation removed (the compute penalties after a read
wait and after a layer's streaming, the cache index work; then the fitted row moves and the
framework overhead; then the host-CPU interference curves over a batch's reads; then the batch
overhead's table by reads per thread and the reader's planning) are gone from it (`REMOVED`), and their rows in
docs/model-reference.md come from this script at the commit before their removal (71ad0b4,
7c609d4, e90eadf, c6997e7).

Default grids: tests/real/data/grids/{25a,29b,31a} where they exist, else docs/measured/grids/
(the same three: Intel VM, EPYC VM, EPYC after a new boot). Every ordered pair (fit on A, score on
B) is one direction. Deterministic: the simulator is; the real runs are the grids'.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEFAULT_NAMES = ("25a", "29b", "31a")
DEFAULT_DIRS = (ROOT / "tests/real/data/grids", ROOT / "docs/measured/grids")
THRESHOLD = 0.01    # a term must improve the held-out median or p90 by this much (one point)

HOST_CPU_KEYS = ("host_cpu_s_per_read", "compute_lost_s_per_read", "read_delay_s_per_read", "compute_lost_s_per_batch",
                 "read_delay_s_per_batch", "framework_compute_lost_s_per_read", "framework_compute_lost_s_per_batch",
                 "framework_read_delay_s_per_read", "framework_read_delay_s_per_batch", "framework_probe_op_s",
                 "kernel_probe_op_s", "long_kernel_probe_op_s", "long_kernel_compute_lost_s_per_read",
                 "long_kernel_compute_lost_s_per_batch", "long_kernel_read_delay_s_per_read",
                 "long_kernel_read_delay_s_per_batch")
LOOP_PROBE_KEYS = ("framework_probe_op_s", "kernel_probe_op_s", "long_kernel_probe_op_s",
                   "long_kernel_compute_lost_s_per_read", "long_kernel_compute_lost_s_per_batch",
                   "long_kernel_read_delay_s_per_read", "long_kernel_read_delay_s_per_batch")


def _drop(section: str, *keys: str):
    def f(p: dict) -> None:
        for k in keys:
            p[section].pop(k, None)
    return f


# name -> (what it is, profile transform or None, run-config overrides)
TERMS: dict[str, tuple[str, Any, tuple[str, ...]]] = {
    "batch_overhead": ("per-batch read overhead (flash.batch_overhead_s)", _drop("flash", "batch_overhead_s"), ()),
    "host_cpu": ("host CPU shared by reads and compute (flash.host_cpu_* and interference terms)",
                 _drop("flash", *HOST_CPU_KEYS), ()),
    "loop_probes": ("Python-loop probes by seconds per torch call (flash.*_probe_op_s, long_kernel_*)",
                    _drop("flash", *LOOP_PROBE_KEYS), ()),
    "staged_segments": ("staged reads and destination segments (flash.staged_s_per_read, segment_s)",
                        _drop("flash", "staged_s_per_read", "segment_s"), ()),
    "sparse_ffn": ("sparse-FFN kernel tables (compute.sparse_ffn)", _drop("compute", "sparse_ffn"), ()),
    "dense_gemv": ("dense GEMV tables (compute.dense_gemv)", _drop("compute", "dense_gemv"), ()),
    "dma_contention": ("DRAM contention by flash DMA (sim.contention)", None, ("sim.contention=false",)),
    "transpose": ("transposed down copy (compute.transpose_bytes_per_s)",
                  _drop("compute", "transpose_bytes_per_s"), ()),
    "gemv_row": ("per-output-row GEMV cost (compute.gemv_row_s)", _drop("compute", "gemv_row_s"), ()),
}


# Terms the ablation removed (held-out level-removed gain under one point), with their profile keys
# (devices/schema.py RETIRED_*_KEYS drops them on load): listed, not ablatable.
REMOVED = {
    "cold_compute": "compute penalty after a demand read's wait (flash.cold_*)",
    "evict": "penalty after a layer's streaming (compute.evict_*)",
    "cache_index": "cache index work (flash.cache_index_*)",
    "row_move": "fitted row-move cost (compute.row_move_*)",
    "framework_overhead": "framework overhead per layer and step (compute.framework_layer_s, _token_s)",
    "host_cpu_curves": "host-CPU interference curves over a batch's reads (flash.host_cpu_curves)",
    "batch_overhead_by_ratio": "batch overhead by reads per thread (flash.batch_overhead_by_ratio_s; one value per "
                               "depth, the median over them, stays)",
    "reader_planning": "reader's planning per batch / neuron (flash.plan_s_per_batch, plan_s_per_neuron)",
}


def default_grids() -> list[Path]:
    for d in DEFAULT_DIRS:
        paths = [d / n for n in DEFAULT_NAMES]
        if all((p / "grid.json").is_file() for p in paths):
            return paths
    raise SystemExit(f"error: no default grids {', '.join(DEFAULT_NAMES)} under {' or '.join(map(str, DEFAULT_DIRS))};"
                     " give grid folders")


class Grid:
    """A kept grid loaded once: its configurations, real runs, traces and calibration (as a dict)."""

    def __init__(self, path: Path):
        import yaml

        from devices.model_spec import ModelSpec
        from real.validation.validate_keep import ROW_KEYS, kept_runs, load_kept_grid
        from sim.config import RunConfig

        self.path, self.name = path, path.name
        doc = load_kept_grid(path)
        self.runs = kept_runs(path, doc)
        self.configs = [(c, {k: c[k] for k in ROW_KEYS}, RunConfig.from_dict(c["run_config"]),
                         ModelSpec.model_validate(c["spec"]), path / c["trace"]) for c in doc["configs"]]
        self.profile_doc = yaml.safe_load((path / "profile.yaml").read_text())


def parts(term: str) -> list[str]:
    """The terms a (possibly joint, `a+b`) switch turns off."""
    return term.split("+")


def switch_off(doc: dict, term: str) -> dict:
    """A copy of the calibration `doc` with every part of `term` switched off, in the order given."""
    d = copy.deepcopy(doc)
    for t in parts(term):
        if TERMS[t][1] is not None:
            TERMS[t][1](d)
    return d


def overrides_of(term: str) -> tuple[str, ...]:
    return tuple(o for t in parts(term) for o in TERMS[t][2])


def describe(term: str) -> str:
    return " + ".join(TERMS[t][0] for t in parts(term))


def profile_for(doc: dict, term: str | None) -> Any:
    from devices.schema import DeviceProfile

    return DeviceProfile.model_validate(switch_off(doc, term) if term is not None else copy.deepcopy(doc))


def score(grid: Grid, profile: Any, overrides: tuple[str, ...]) -> dict[str, float]:
    """The grid's real runs against the simulator on `profile`: latency error median / p90, raw and
    with one factor per mode out."""
    from real.validation.validate_score import compare, level_removed, summarize
    from sim.engine import simulate
    from traces.format import open_trace

    rows = []
    for (_c, row, cfg, spec, trace), runs in zip(grid.configs, grid.runs, strict=True):
        if overrides:
            cfg = cfg.with_overrides(list(overrides))
        sim = simulate(open_trace(trace), spec, profile, cfg, fast=False)
        rows.append({**row, "metrics": compare(runs[0], sim.tokens, runs[1:])})
    s = summarize(rows)
    lv = level_removed(rows)     # in sample: compares terms on one grid, never a score to quote
    return {"median": s["latency_error_median"], "p90": s["latency_error_p90"],
            "level_median": lv["median"], "level_p90": lv["p90"]}


def applies(doc: dict, term: str) -> bool:
    """Whether switching `term` off changes anything in this calibration."""
    if overrides_of(term):
        return True
    return switch_off(doc, term) != doc


def run(grids: list[Grid], terms: list[str], in_sample: bool, say: Any) -> dict[str, Any]:
    pairs = [(a, b) for a in grids for b in grids if a is not b]
    if in_sample:
        pairs += [(g, g) for g in grids]
    out: dict[str, Any] = {"grids": [str(g.path) for g in grids], "threshold": THRESHOLD, "terms": {}}
    for term in [None, *terms]:
        name = term or "baseline"
        res = []
        for fit, test in pairs:
            if term is not None and not applies(fit.profile_doc, term):
                res.append({"fit": fit.name, "test": test.name, "applies": False})
                continue
            t = time.perf_counter()
            overrides = overrides_of(term) if term else ()
            sc = score(test, profile_for(fit.profile_doc, term), overrides)
            res.append({"fit": fit.name, "test": test.name, "applies": True, **sc})
            say(f"{name:24s} fit {fit.name} -> {test.name}: {sc['median']:.2%} / {sc['p90']:.2%}, level removed "
                f"{sc['level_median']:.2%} / {sc['level_p90']:.2%} ({time.perf_counter() - t:.0f} s)")
        out["terms"][name] = {"description": describe(term) if term else "every term on", "directions": res}
    decide(out)
    return out


def decide(out: dict[str, Any]) -> None:
    """Per term: the mean over held-out directions (fit != test) where it applies of (error without
    it - error with it), raw and level removed; positive = the term helps. Kept when the
    level-removed median or p90 improves by THRESHOLD or more."""
    base = {(d["fit"], d["test"]): d for d in out["terms"]["baseline"]["directions"]}
    for name, t in out["terms"].items():
        if name == "baseline":
            continue
        gains: dict[str, list[float]] = {k: [] for k in ("median", "p90", "level_median", "level_p90")}
        for d in t["directions"]:
            if d["fit"] == d["test"]:
                continue
            if not d["applies"]:
                continue
            b = base[(d["fit"], d["test"])]
            for k in gains:
                gains[k].append(d[k] - b[k])
        t["gain"] = {k: float(np.mean(v)) if v else 0.0 for k, v in gains.items()}
        t["applies"] = any(d["applies"] for d in t["directions"])
        t["kept"] = t["gain"]["level_median"] >= THRESHOLD or t["gain"]["level_p90"] >= THRESHOLD


def markdown(out: dict[str, Any]) -> str:
    dirs = [d for d in out["terms"]["baseline"]["directions"] if d["fit"] != d["test"]]
    head = "| term | " + " | ".join(f"{d['fit']}→{d['test']}" for d in dirs) + \
        " | gain raw p50 / p90 | gain level-removed p50 / p90 | verdict |"
    lines = [head, "|" + "---|" * (len(dirs) + 4)]
    for name, t in out["terms"].items():
        cells = []
        for d in t["directions"]:
            if d["fit"] == d["test"]:
                continue
            cells.append("n/a" if not d["applies"] else
                         f"{d['median']:.1%} / {d['p90']:.1%} ({d['level_median']:.1%} / {d['level_p90']:.1%})")
        if name == "baseline":
            lines.append("| all terms on | " + " | ".join(cells) + " | | | |")
            continue
        g = t["gain"]
        verdict = "kept" if t["kept"] else "removed" if t["applies"] else "n/a"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {g['median']:+.1%} / {g['p90']:+.1%} | "
                     f"{g['level_median']:+.1%} / {g['level_p90']:+.1%} | {verdict} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("grids", nargs="*", help="kept grid folders (default: 25a, 29b, 31a)")
    ap.add_argument("--terms", help="comma-separated subset of: " + ", ".join(TERMS) +
                    "; join terms with + to switch them off together")
    ap.add_argument("--in-sample", action="store_true", help="also score each grid on its own calibration")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args(argv)
    terms = list(TERMS) if not a.terms else [t.strip() for t in a.terms.split(",") if t.strip()]
    gone = [p for t in terms for p in parts(t) if p in REMOVED]
    if gone:
        print(f"error: --terms: {', '.join(gone)} already removed from the model ({REMOVED[gone[0]]}); use some "
              f"of {', '.join(TERMS)}", file=sys.stderr)
        return 2
    bad = [p for t in terms for p in parts(t) if p not in TERMS]
    if bad:
        print(f"error: --terms: unknown {', '.join(bad)}; use some of {', '.join(TERMS)}", file=sys.stderr)
        return 2
    paths = [Path(g) for g in a.grids] or default_grids()
    if len(paths) < 2:
        print("error: give two or more grids (one to fit on, another to score on)", file=sys.stderr)
        return 2
    from devices.errors import FlashsimError

    try:
        grids = [Grid(p) for p in paths]
    except FlashsimError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = run(grids, terms, a.in_sample, lambda s: print(s, file=sys.stderr, flush=True))
    if a.json:
        tmp = Path(a.json + ".tmp")
        tmp.write_text(json.dumps(out, indent=1))
        tmp.replace(a.json)
    print(markdown(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
