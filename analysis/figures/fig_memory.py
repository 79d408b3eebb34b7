"""Figure: DRAM held over simulated time against the budget in force (a memory records table).

`resident_bytes` (GiB, or MiB below 1 GiB) as a step line over `t_s`, the `budget_bytes` as a dashed step line (it may
change when co-running applications take or release memory); red where the run held more than its
budget. Time in seconds, or milliseconds for runs shorter than a second.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from analysis import tables as T
from analysis.figures import common as C
from devices.units import format_bytes

KIND = "memory"
INPUT = "records"
TITLE = "DRAM held over time, with the budget"


def draw(records: pd.DataFrame) -> Figure:
    t = records[T.T_S].to_numpy(float)
    scale, unit = (1e3, "ms") if t.max() - t.min() < 1.0 else (1.0, "s")
    x = t * scale
    res_b = records[T.RESIDENT_BYTES].to_numpy(float)
    bud_b = records[T.BUDGET_BYTES].to_numpy(float)
    unit_bytes, unit_name = (C.GIB, "GiB") if max(res_b.max(), bud_b.max()) >= C.GIB else (C.MIB, "MiB")
    res, bud = res_b / unit_bytes, bud_b / unit_bytes
    fig = C.new_figure(8.0, 3.8)
    ax = fig.subplots()
    ax.step(x, res, where="post", color="C0", lw=1.4, label="resident in DRAM")
    ax.step(x, bud, where="post", color="black", ls="--", lw=1.2, label="budget")
    # The same steps as explicit segments, so a single over-budget interval is filled too.
    xs, rs, bs = np.repeat(x, 2)[1:], np.repeat(res, 2)[:-1], np.repeat(bud, 2)[:-1]
    over = rs > bs
    if over.any():
        ax.fill_between(xs, bs, rs, where=over, color="C3", alpha=0.35, label="over budget")
    ax.set_xlabel(f"simulated time ({unit})")
    ax.set_ylabel(unit_name)
    top = float(np.nanmax(np.concatenate([res, bud])))
    ax.set_ylim(0, top * 1.1 if top > 0 else 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    budget = (format_bytes(bud_b.min()) if bud_b.min() == bud_b.max()
              else f"{format_bytes(bud_b.min())} to {format_bytes(bud_b.max())}")
    ax.set_title(f"{TITLE}: peak {format_bytes(res_b.max())}, budget {budget}", fontsize=10)
    return fig
