"""The validation report's figure: the simulated value of every metric against the real one, one
configuration a point (PNG, written atomically). The report it draws is real/validation/validate.py's
(or `flashsim validate --rescore`'s, real/validation/validate_keep.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from real.validation.validate_grid import MODES
from real.validation.validate_score import metrics_of
from traces.outputs import replace_output


def scatter_plot(report: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """sim-vs-real scatter, one panel per metric (PNG, atomic). With repeated real runs each point
    carries the range of its runs as a horizontal bar, and the title each run's score alone (the
    simulator's and the other runs', `validate_score.repeatability`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics = metrics_of(report["configs"])
    fig, axes = plt.subplots(1, len(metrics), figsize=(4 * len(metrics), 4))
    for ax, m in zip(axes, metrics):
        rows = [row for row in report["configs"] if m in row["metrics"]]
        r = [row["metrics"][m]["real"] for row in rows]
        s = [row["metrics"][m]["sim"] for row in rows]
        runs = [row["metrics"][m].get("real_runs") for row in rows]
        for mode, marker in zip(MODES, "o^s"):
            sel = [i for i, row in enumerate(rows) if row.get("mode", "shape") == mode]
            if sel:
                dots = ax.scatter([r[i] for i in sel], [s[i] for i in sel], s=14, marker=marker, label=mode)
                bars = [i for i in sel if runs[i]]
                if bars:     # the real runs' range: how far the host moved between passes
                    ax.errorbar([r[i] for i in bars], [s[i] for i in bars], fmt="none", lw=0.7, alpha=0.5,
                                ecolor=dots.get_facecolor()[0],
                                xerr=[[max(0.0, r[i] - min(runs[i])) for i in bars],
                                      [max(0.0, max(runs[i]) - r[i]) for i in bars]])
        ax.legend(fontsize=7)
        vals = r + s + [x for rr in runs if rr for x in rr]
        hi = max(vals) * 1.05 if vals else 1.0
        lo = min(vals) / 1.05 if vals else 0.0
        if lo > 0 and hi / lo > 10:     # shape and model mode an order of magnitude apart: log axes
            ax.set_xscale("log")
            ax.set_yscale("log")
        else:
            lo = 0.0
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
        ax.set_xlabel(f"real {m}" + (" (bars: the runs' range)" if any(runs) else ""))
        ax.set_ylabel(f"simulated {m}")
        title = f"{m}: median err {report['per_metric'][m]['median']:.0%}"
        alone = (report.get("repeatability") or {}).get(m)
        if alone:
            title += (f"\none run: sim {alone['simulator']['median']:.0%}, "
                      f"other runs {alone['other_passes']['median']:.0%}")
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    path = out_dir / "validate_scatter.png"
    tmp = out_dir / ".validate_scatter.png.tmp.png"
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    replace_output(tmp, path)
    return [path]
