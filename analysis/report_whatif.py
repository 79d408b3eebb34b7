"""The report's what-if panel: the sweep's rows embedded as JSON and a plain script (no library, no
network) that shows, for a chosen trace/model, device, DRAM budget and quality floor, the fastest
configuration that meets the floor and the Pareto front of those that do (max tok/s, min peak DRAM, min
perplexity ratio).

Each embedded row: `scope` (trace and model), `device`, `budget` (its text, the device default with its
size), `budget_bytes`, `label`, `ok` (the point ran), `tps` (tok/s), `dram` (peak DRAM bytes), `ppl`
(perplexity ratio to the native model, analysis/report_quality.py; null when unknown), `bound` (the ppl is
a lower bound), `evidence`, `mass` (activation mass kept), `error`. A floor admits a row only when its
ppl is known and at most the floor; "none" admits every row that ran. Element ids (`whatif-device`,
`whatif-budget`, `whatif-floor`, `whatif-scope`, `whatif-best`, `whatif-front`, `whatif-summary`) are
the panel's interface: the browser test drives them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from analysis import tables as T
from analysis.figures.common import budget_text, device_available_bytes
from analysis.report_quality import EVIDENCE, FLOOR, PPL

FLOORS = (1.01, 1.02, 1.05, 1.1, 1.25, 1.5, 2.0)


def _num(v: Any) -> float | None:
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def scope_of(row: pd.Series) -> str:
    """The trace (folder name) and model a row replayed."""
    trace = Path(str(row.get(T.TRACE) or "")).name or "trace"
    model = row.get(T.MODEL)
    return trace + ("" if model is None or pd.isna(model) else f" on {model}")


def whatif_rows(df: pd.DataFrame) -> list[dict[str, Any]]:
    """The rows the panel chooses from (every point, failed ones too: they say what does not fit)."""
    out = []
    for _, r in df.iterrows():
        device = Path(str(r.get(T.DEVICE))).stem
        b = r.get(T.BUDGET)
        b_bytes = _num(b) if not pd.isna(b) else device_available_bytes(str(r.get(T.DEVICE)))
        ok = str(r.get(T.STATUS, "ok")) == "ok"
        evidence = r.get(EVIDENCE)
        out.append({
            "scope": scope_of(r), "device": device, "budget": budget_text(b, r.get(T.DEVICE)),
            "budget_bytes": b_bytes, "label": str(r[T.LABEL]), "ok": ok,
            "tps": _num(r.get(T.TOKENS_PER_S)) if ok else None, "dram": _num(r.get(T.DRAM_PEAK)) if ok else None,
            "ppl": _num(r.get(PPL)), "bound": str(evidence or "").endswith("(bound)"),
            "evidence": None if evidence is None else str(evidence), "mass": _num(r.get(T.MASS_KEPT)),
            "error": None if ok else str(r.get(T.ERROR) or "")[:160],
        })
    return out


def whatif_html(df: pd.DataFrame) -> str:
    """The panel: controls, the result elements, the data and the script."""
    data = {"rows": whatif_rows(df), "floors": list(FLOORS), "default_floor": FLOOR}
    blob = json.dumps(data, separators=(",", ":")).replace("<", "\\u003c").replace(">", "\\u003e")
    return (
        "<p>Pick a trace/model, device, DRAM budget and quality floor: the fastest configuration that "
        "meets the floor and the Pareto front of those that do (more tok/s, less peak DRAM, lower perplexity "
        "ratio) are computed in this page from the results embedded in it. Quality is the perplexity "
        "ratio to the native model from the closest evidence (column <i>quality evidence</i>); a "
        "configuration without evidence meets no floor but <i>none</i>.</p>"
        "<form id=whatif-form class=whatif onsubmit='return false'>"
        "<label id=whatif-scope-label>trace / model <select id=whatif-scope></select></label>"
        "<label>device <select id=whatif-device></select></label>"
        "<label>DRAM budget <select id=whatif-budget></select></label>"
        "<label>quality floor <select id=whatif-floor></select></label></form>"
        "<p id=whatif-best class=best>Needs JavaScript.</p><p id=whatif-summary class=note></p>"
        "<div class=scroll><table id=whatif-front><thead><tr><th>Pareto front: configuration</th><th>tok/s</th>"
        "<th>DRAM peak GiB</th><th>ppl ratio</th><th>quality evidence</th></tr></thead><tbody></tbody></table></div>"
        "<noscript><p class=note>The what-if panel needs JavaScript; the tables of this report hold the same "
        "results.</p></noscript>"
        f"<script type=application/json id=whatif-data>{blob}</script><script>{SCRIPT}</script>")


SCRIPT = r"""
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("whatif-data").textContent);
  function el(id) { return document.getElementById(id); }
  function uniq(a) { return a.filter(function (v, i) { return a.indexOf(v) === i; }); }
  function fill(sel, values, texts, pick) {
    var keep = sel.value;
    sel.textContent = "";
    values.forEach(function (v, i) {
      var o = document.createElement("option");
      o.value = v; o.textContent = texts[i]; sel.appendChild(o);
    });
    sel.value = values.indexOf(keep) >= 0 ? keep : pick;
  }
  function fmt(v, d) { return v === null ? "?" : v.toFixed(d); }
  function gib(b) { return b === null ? "?" : (b / 1073741824).toFixed(2); }
  function floorValue() { var v = el("whatif-floor").value; return v === "none" ? null : parseFloat(v); }
  function meets(r, floor) {
    if (!r.ok || r.tps === null) { return false; }
    return floor === null || (r.ppl !== null && !r.bound && r.ppl <= floor + 1e-12);
  }
  function pplKey(r) { return r.ppl === null ? Infinity : r.ppl; }
  function dominates(a, b) {
    var ge = a.tps >= b.tps && a.dram <= b.dram && pplKey(a) <= pplKey(b);
    return ge && (a.tps > b.tps || a.dram < b.dram || pplKey(a) < pplKey(b));
  }
  function faster(a, b) { return b.tps - a.tps || a.dram - b.dram; }
  function here() {
    var s = el("whatif-scope").value, d = el("whatif-device").value;
    return data.rows.filter(function (r) { return r.scope === s && r.device === d; });
  }
  function fillDevices() {
    var s = el("whatif-scope").value;
    var ds = uniq(data.rows.filter(function (r) { return r.scope === s; }).map(function (r) { return r.device; }));
    fill(el("whatif-device"), ds, ds, ds[0]);
  }
  function fillBudgets() {
    var rows = here().slice().sort(function (a, b) { return a.budget_bytes - b.budget_bytes; });
    var bs = uniq(rows.map(function (r) { return r.budget; }));
    fill(el("whatif-budget"), bs, bs, bs[bs.length - 1]);
  }
  function update() {
    var floor = floorValue(), budget = el("whatif-budget").value;
    var rows = here().filter(function (r) { return r.budget === budget; });
    var ran = rows.filter(function (r) { return r.ok; });
    var ok = ran.filter(function (r) { return meets(r, floor); }).sort(faster);
    var best = ok.length ? ok[0] : null;
    var out = el("whatif-best");
    out.dataset.label = best ? best.label : "";
    out.textContent = best
      ? "Best: " + best.label + ": " + fmt(best.tps, 2) + " tok/s, DRAM peak " + gib(best.dram) +
        " GiB, perplexity x" + fmt(best.ppl, 4) + " (" + best.evidence + ")"
      : "No configuration meets the quality floor at this budget.";
    el("whatif-summary").textContent = rows.length + " configurations at " + budget + ": " + ran.length +
      " ran, " + ok.length + " meet the floor (" + (floor === null ? "none" : "perplexity <= x" + floor) +
      "), " + (rows.length - ran.length) + " did not fit.";
    var front = ok.filter(function (a) { return !ok.some(function (b) { return dominates(b, a); }); });
    var body = el("whatif-front").tBodies[0];
    body.textContent = "";
    front.forEach(function (r) {
      var tr = document.createElement("tr");
      [r.label, fmt(r.tps, 2), gib(r.dram), fmt(r.ppl, 4), r.evidence || ""].forEach(function (v, i) {
        var td = document.createElement("td");
        td.textContent = v;
        if (i > 0 && i < 4) { td.className = "n"; }
        tr.appendChild(td);
      });
      body.appendChild(tr);
    });
  }
  var scopes = uniq(data.rows.map(function (r) { return r.scope; }));
  fill(el("whatif-scope"), scopes, scopes, scopes[0]);
  el("whatif-scope-label").hidden = scopes.length < 2;
  var fv = data.floors.map(String).concat(["none"]);
  fill(el("whatif-floor"), fv, data.floors.map(function (f) { return "perplexity <= x" + f; }).concat(["none"]),
       String(data.default_floor));
  fillDevices(); fillBudgets(); update();
  el("whatif-scope").addEventListener("change", function () { fillDevices(); fillBudgets(); update(); });
  el("whatif-device").addEventListener("change", function () { fillBudgets(); update(); });
  el("whatif-budget").addEventListener("change", update);
  el("whatif-floor").addEventListener("change", update);
})();
"""
