"""The HTML report: one self-contained page (figures embedded as base64 PNG, inline CSS, one inline
script for the what-if panel, no external resource: a Content-Security-Policy forbids any) that opens
from disk in any browser with no server.

`build_report(results, out_dir)` reads a sweep directory (or a results table) and writes
`out_dir/report.html` plus every figure as PNG and SVG under `out_dir/figures/`. Sections: the
provenance (flashsim version, commit, spec and input hashes, seed), the fastest configuration per
device (at any quality, and under the quality floor by each row's rated perplexity ratio:
analysis/report_quality.py), the what-if panel (analysis/report_whatif.py), the figures that the results can make (each one that cannot says why), the device read
curves, the statistics of each replayed trace (window coverage, hot neurons), optional validation
and memory figures, the results table (display units: ms, tok/s, MiB,
GiB), failed points, and the resolved configuration (the sweep spec and each preset's resolved
simulator configuration).
"""

from __future__ import annotations

import base64
import html
import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from analysis import tables as T
from analysis.figures import FIGURES, draw_figure, load_input, trace_statistics, trace_stats_figure
from analysis.figures.common import TooCrowded, save
from analysis.report_quality import EVIDENCE, FLOOR, PPL, meets_floor, with_quality
from analysis.report_whatif import whatif_html
from analysis.tables import ResultSet, load_results
from devices.errors import FlashsimError
from devices.units import format_bytes
from traces.outputs import replace_output

RESULT_FIGURES = ("breakdown", "energy", "budget", "window", "pareto")
MAX_TABLE_ROWS = 500
MAX_PER_DEVICE = 6  # figures redrawn one device at a time when the whole set is too crowded
MAX_TRACES = 4  # traces whose statistics the report draws


@dataclass
class Section:
    title: str
    body: str


def _doc_caption(kind: str) -> str:
    """The first paragraph of the figure module's docstring, as its caption."""
    import importlib

    doc = importlib.import_module(FIGURES[kind][0]).__doc__ or ""
    first = " ".join(doc.strip().split("\n\n")[0].replace("Figure:", "").split())
    return first[:1].upper() + first[1:]


def _img(png: Path, alt: str) -> str:
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _figure_html(kind: str, data: Any, fig_dir: Path, name: str, **options: Any) -> str:
    fig = draw_figure(kind, data, **options)
    png = save(fig, fig_dir, name)[0]
    return f"<figure>{_img(png, name)}<figcaption>{html.escape(_doc_caption(kind))}</figcaption></figure>"


def _results_figure(kind: str, rs: ResultSet, fig_dir: Path) -> str:
    """The figure for all results, or one per device when they do not fit one figure."""
    try:
        return _figure_html(kind, rs, fig_dir, kind)
    except TooCrowded as whole:
        devices = list(dict.fromkeys(rs.table[T.DEVICE])) if T.DEVICE in rs.table else []
        if len(devices) < 2:
            return _not_drawn(kind, whole)
        parts = []
        for i, d in enumerate(devices[:MAX_PER_DEVICE]):
            try:
                parts.append(_figure_html(kind, rs, fig_dir, f"{kind}-{i}", where=[f"device={d}"]))
            except FlashsimError as e:
                parts.append(_not_drawn(f"{kind} ({d})", e))
        if len(devices) > MAX_PER_DEVICE:
            parts.append(f"<p class=note>{len(devices) - MAX_PER_DEVICE} more devices: draw them with "
                         f"<code>flashsim plot {kind} RESULTS --where device=NAME</code>.</p>")
        return "".join(parts)
    except FlashsimError as e:
        return _not_drawn(kind, e)


def _trace_figures(rs: ResultSet, fig_dir: Path) -> str:
    """Window coverage and hot-neuron CDF of each trace the results replayed (when those figures exist)."""
    kinds = [k for k in ("trace-window-coverage", "trace-hot-cdf") if k in FIGURES]
    if not kinds or T.TRACE not in rs.table:
        return ""
    parts = []
    traces = list(dict.fromkeys(rs.table[T.TRACE]))
    for i, trace in enumerate(traces[:MAX_TRACES]):
        parts.append(f"<h3>{html.escape(Path(str(trace)).name)}</h3>")
        try:
            stats = trace_statistics(trace)
        except FlashsimError as e:
            parts.append(_not_drawn(f"trace statistics ({trace})", e))
            continue
        for kind in kinds:
            pngs = [p for p in trace_stats_figure(kind, stats, fig_dir / f"trace-{i}") if p.suffix == ".png"]
            parts += [f"<figure>{_img(p, kind)}</figure>" for p in pngs]
    if len(traces) > MAX_TRACES:
        parts.append(f"<p class=note>{len(traces) - MAX_TRACES} more traces: "
                     "<code>flashsim trace stats TRACE --plot DIR</code>.</p>")
    return "".join(parts)


def _not_drawn(kind: str, err: Exception) -> str:
    return f"<p class=note>Figure <b>{html.escape(kind)}</b> not drawn: {html.escape(str(err))}</p>"


def _table(df: pd.DataFrame, max_rows: int = MAX_TABLE_ROWS) -> str:
    shown = df.head(max_rows)
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in shown.columns)
    rows = []
    for _, r in shown.iterrows():
        cells = "".join(f"<td class=n>{html.escape(_fmt(v))}</td>" if _is_number(v)
                        else f"<td>{html.escape(_fmt(v))}</td>" for v in r)
        rows.append(f"<tr>{cells}</tr>")
    more = (f"<p class=note>{len(df) - max_rows} more rows are in the results files.</p>"
            if len(df) > max_rows else "")
    return f"<div class=scroll><table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>{more}"


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) or hasattr(v, "dtype")


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


DISPLAY = (  # (column, header, scale)
    (T.TOKENS_PER_S, "tok/s", 1.0),
    (T.MS_PER_TOKEN, "ms/token", 1.0),
    (T.IO_MS, "I/O ms", 1.0),
    (T.COMPUTE_MS, "compute ms", 1.0),
    (T.STALL_MS, "stall ms", 1.0),
    (T.MEMORY_MGMT_MS, "mem mgmt ms", 1.0),
    (T.FLASH_BYTES, "flash MiB/token", 2.0**-20),
    (T.FLASH_THROUGHPUT, "flash GB/s", 1e-9),
    (T.DRAM_PEAK, "DRAM peak GiB", 2.0**-30),
    (T.MASS_KEPT, "mass kept", 1.0),
    (T.JOULES_PER_TOKEN, "mJ/token", 1e3),
    (PPL, "ppl ratio", 1.0),
)


def display_table(df: pd.DataFrame, keep_dims: bool = False) -> pd.DataFrame:
    """Results in display units, one row per point: what varies, then the metrics."""
    out = pd.DataFrame(index=df.index)
    if T.TRACE in df:
        out["trace"] = df[T.TRACE].map(lambda p: Path(str(p)).name)
    if T.MODEL in df:
        out["model"] = df[T.MODEL].fillna("(trace's)")
    if T.DEVICE in df:
        out["device"] = df[T.DEVICE].map(lambda p: Path(str(p)).stem)
    if T.BUDGET in df:
        out["DRAM budget"] = df[T.BUDGET].map(lambda b: "device" if pd.isna(b) else format_bytes(b))
    out["configuration"] = df[T.LABEL]
    for col, header, scale in DISPLAY:
        if col in df:
            out[header] = pd.to_numeric(df[col], errors="coerce") * scale
    if EVIDENCE in df:
        out["quality evidence"] = df[EVIDENCE]
    if T.STATUS in df:
        out["status"] = df[T.STATUS]
    if keep_dims:
        return out
    dims = ("trace", "model", "device", "DRAM budget")  # shown only where they vary
    return out[[c for c in out.columns if c not in dims or out[c].astype(str).nunique(dropna=False) > 1]]


def _best(rated: pd.DataFrame, floor: float | None = None) -> str:
    """The fastest row per trace/model/device; with `floor`, among rows whose rated perplexity ratio is
    at most it (the activation mass cannot see quantization error: it is not the test)."""
    ok = rated[rated[T.STATUS] == "ok"] if T.STATUS in rated else rated
    if T.TOKENS_PER_S in ok:
        ok = ok[ok[T.TOKENS_PER_S].notna()]
    if floor is not None:
        ok = ok[meets_floor(ok, floor)]
    if ok.empty or T.TOKENS_PER_S not in ok:
        return "<p class=note>No point ran successfully.</p>" if floor is None else \
            f"<p class=note>No point that ran has a perplexity ratio known to be at most x{floor:g}.</p>"
    keys = [c for c in (T.TRACE, T.MODEL, T.DEVICE) if c in ok]
    by = [ok[k].astype(str) for k in keys]
    best = ok.loc[ok.groupby(by, sort=False, dropna=False)[T.TOKENS_PER_S].idxmax()]
    return _table(display_table(best, keep_dims=True))


def _provenance(rs: ResultSet) -> str:
    m = rs.manifest or {}
    git = m.get("git") or {}
    commit = git.get("commit") or "unknown"
    if git.get("dirty"):
        commit += " (with local changes)"
    t = rs.table
    n_ok = int((t[T.STATUS] == "ok").sum()) if T.STATUS in t else len(t)
    items = [
        ("results", str(rs.source)),
        ("points", f"{len(t)} of {m.get('n_points', len(t))} finished; {n_ok} ran, {len(t) - n_ok} failed"),
    ]
    if m:  # a sweep directory: what produced it
        items += [
            ("flashsim", f"{m.get('flashsim_version', 'unknown')}, commit {commit}"),
            ("seed", str(m.get("seed", ""))),
            ("spec", f"{m.get('spec_path', '')} (sha256 {str(m.get('spec_sha256', ''))[:16]})"),
            ("evaluator", str(m.get("evaluator", ""))),
        ]
    else:
        items.append(("provenance", "a results table without a sweep manifest"))
    for kind, hashes in (m.get("inputs") or {}).items():
        for name, sha in hashes.items():
            items.append((f"input {kind[:-1]}", f"{name} (sha256 {sha[:16]})"))
    return "<dl>" + "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in items) + "</dl>"


def _configuration(rs: ResultSet) -> str:
    parts = []
    if rs.manifest and "spec" in rs.manifest:
        spec = yaml.safe_dump(rs.manifest["spec"], sort_keys=False)
        parts.append(f"<h3>Sweep specification</h3><pre>{html.escape(spec)}</pre>")
    if "config_json" in rs.table:
        seen: dict[str, str] = {}
        for label, cfg in zip(rs.table[T.LABEL], rs.table["config_json"]):
            if isinstance(cfg, str) and label not in seen:
                seen[label] = json.dumps(json.loads(cfg), indent=2, sort_keys=True)
        for label, cfg in list(seen.items())[:40]:
            parts.append(f"<details><summary>Resolved configuration: {html.escape(label)}</summary>"
                         f"<pre>{html.escape(cfg)}</pre></details>")
    return "".join(parts) or "<p class=note>No configuration recorded.</p>"


CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2em auto;max-width:1100px;
color:#222;padding:0 1em;line-height:1.4}
h1{font-size:1.6em;margin-bottom:.2em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.6em}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #eee}figcaption{font-size:.85em;color:#555}
table{border-collapse:collapse;font-size:.8em}th,td{border:1px solid #ddd;padding:2px 6px;text-align:left}td.n{text-align:right}
th{background:#f4f4f4;position:sticky;top:0}
.scroll{max-height:32em;overflow:auto;border:1px solid #eee}.note{color:#8a5a00;font-size:.9em}
dl{display:grid;grid-template-columns:max-content auto;gap:2px 1em;font-size:.9em}dt{font-weight:600}
dd{margin:0;font-family:ui-monospace,monospace;word-break:break-all}
pre{background:#f7f7f7;padding:.6em;overflow:auto;font-size:.8em}
.whatif label{margin-right:1.2em}.best{font-weight:600}
"""


CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'"  # no network
PLAN_KEYS = ("model", "device", "feasible", "best", "configurations", "min_dram_bytes", "trace")


def _plan_section(path: Path) -> Section:
    """The what-if plan (a `flashsim plan --json` file): the verdict, then every configuration."""
    try:
        p = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FlashsimError(f"--plan {path}: file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FlashsimError(f"--plan {path}: not valid JSON ({e}); give the output of `flashsim plan --json`") from None
    missing = [k for k in PLAN_KEYS if not isinstance(p, dict) or k not in p]
    if missing:
        raise FlashsimError(f"--plan {path}: missing {', '.join(missing)}; give the output of `flashsim plan --json`")
    best = p["best"]
    verdict = (f"feasible: best <b>{html.escape(best['label'])}</b>, {best['tokens_per_s']:.2f} tok/s, "
               f"{best['dram_peak_bytes'] / 2**30:.2f} GiB, activation mass kept {best['activation_mass_kept']:.3f}"
               + (f", perplexity x{best['ppl_ratio']:.4f} ({html.escape(_evidence(best))})"
                  if best.get("ppl_ratio") is not None else "")
               if p["feasible"] and best else "infeasible: no configuration meets the constraints")
    floor = ((p.get("quality") or {}).get("floor") or {}).get("rule")
    floor_html = f"<p class=note>quality floor: {html.escape(floor)}</p>" if floor else ""
    min_dram = ("none meets the target" if p["min_dram_bytes"] is None
                else f"{p['min_dram_bytes'] / 2**30:.2f} GiB")
    rows = pd.DataFrame([{
        "configuration": c["label"], "feasible": c["feasible"], "tok/s": c["tokens_per_s"],
        "DRAM GiB": None if c["dram_peak_bytes"] is None else c["dram_peak_bytes"] / 2**30,
        "mass kept": c["activation_mass_kept"], "ppl ratio": c.get("ppl_ratio"),
        "quality evidence": _evidence(c), "binding": c["binding_constraint"],
        "why not": "; ".join(c.get("reasons") or []),
    } for c in p["configurations"]])
    notes = "".join(f"<p class=note>{html.escape(str(n))}</p>" for n in p.get("notes") or [])
    trace = p["trace"].get("description", "") if isinstance(p["trace"], dict) else str(p["trace"])
    body = (f"<p>{verdict}; smallest DRAM meeting the target: {min_dram}.</p>{floor_html}"
            f"<p class=note>trace: {html.escape(trace)}</p>{notes}{_table(rows)}")
    return Section(f"What-if plan: {p['model']} on {p['device']}", body)


def _evidence(row: dict[str, Any]) -> str:
    e = row.get("quality_evidence")
    return e.get("short", "") if isinstance(e, dict) else ""


def build_report(results: str | Path, out_dir: str | Path, *, title: str | None = None,
                 validation: str | Path | None = None, records: str | Path | None = None,
                 plan: str | Path | None = None) -> Path:
    """Write out_dir/report.html (and out_dir/figures/*); return the page's path.

    `plan` is a `flashsim plan --json` output (plan.json) shown as a section of its own."""
    rs = load_results(results)
    plan_section = _plan_section(Path(plan)) if plan is not None else None   # bad input fails before any drawing
    out = Path(out_dir)
    fig_dir = out / "figures"
    out.mkdir(parents=True, exist_ok=True)
    name = title or ((rs.manifest or {}).get("spec") or {}).get("name") or Path(results).name
    rated = with_quality(rs.table)
    floor_note = (f"<p class=note>Quality floor: perplexity at most x{FLOOR:g} the native model's, each row rated "
                  "by the closest evidence for its model (measured on it or a model of its size; exact for native "
                  "weights with every neuron computed; else the published ratio of the model nearest in size). "
                  "A row without evidence is left out.</p>")
    sections = [Section("Provenance", _provenance(rs)),
                Section("Fastest configuration (any quality)", _best(rated)),
                Section(f"Fastest configuration with perplexity <= x{FLOOR:g} of the native model",
                        floor_note + _best(rated, FLOOR)),
                Section("What if: device, budget and quality floor", whatif_html(rated))]
    figs = "".join(_results_figure(k, rs, fig_dir) for k in RESULT_FIGURES)
    sections.append(Section("Figures", figs))
    curves = []
    if T.DEVICE in rs.table:
        for i, d in enumerate(dict.fromkeys(rs.table[T.DEVICE])):
            try:
                curves.append(_figure_html("read-curve", load_input("device", d), fig_dir, f"read-curve-{i}"))
            except FlashsimError as e:
                curves.append(_not_drawn(f"read-curve ({d})", e))
    if curves:
        sections.append(Section("Flash read curves of the devices", "".join(curves)))
    traces = _trace_figures(rs, fig_dir)
    if traces:
        sections.append(Section("Traces", traces))
    if validation is not None:
        sections.append(Section("Simulator vs real backend", _figure_html(
            "sim-vs-real", load_input("validation", validation), fig_dir, "sim-vs-real")))
    if records is not None:
        sections.append(Section("Memory over time", _figure_html(
            "memory", load_input("records", records), fig_dir, "memory")))
    if plan_section is not None:
        sections.append(plan_section)
    sections.append(Section("Results", _table(display_table(rated))))
    failed = rs.table[rs.table[T.STATUS] != "ok"] if T.STATUS in rs.table else rs.table.iloc[:0]
    if len(failed):
        cols = [c for c in (T.LABEL, T.DEVICE, T.BUDGET, T.ERROR) if c in failed]
        sections.append(Section(f"Failed points ({len(failed)})", _table(failed[cols])))
    sections.append(Section("Configuration", _configuration(rs)))
    body = "".join(f"<section><h2>{html.escape(s.title)}</h2>{s.body}</section>" for s in sections)
    page = (f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
            f"<meta name=viewport content='width=device-width,initial-scale=1'>"
            f"<meta http-equiv=Content-Security-Policy content=\"{CSP}\">"
            f"<title>flashsim report: {html.escape(str(name))}</title><style>{CSS}</style></head>"
            f"<body><h1>flashsim report: {html.escape(str(name))}</h1>{body}</body></html>\n")
    path = out / "report.html"
    tmp = out / f".report.html.{uuid.uuid4().hex[:8]}.tmp"
    tmp.write_text(page, encoding="utf-8")
    replace_output(tmp, path)
    return path
