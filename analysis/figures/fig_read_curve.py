"""Figure: a device's flash read throughput as a heatmap over chunk size x reads in flight.

Cells are the profile's own read model (`DeviceProfile.flash.bytes_per_s(chunk, in_flight)`: the
measured table, interpolated, or the datasheet closed form) in decimal GB/s, for chunks of 4 KiB to
16 MiB and 1 to the device's queue depth in flight (powers of two). Dots mark the measured table
points when the profile has a table.
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from analysis.figures import common as C
from devices.schema import DeviceProfile
from devices.units import format_bytes

KIND = "read-curve"
INPUT = "device"
TITLE = "Flash read throughput"
CHUNKS = tuple(2**i for i in range(12, 25))  # 4 KiB .. 16 MiB


def in_flight_grid(profile: DeviceProfile) -> list[int]:
    q_max = profile.flash.max_in_flight
    if profile.flash.read_table is not None:
        q_max = max(q_max, max(profile.flash.read_table.in_flight))
    grid = [2**i for i in range(int(np.log2(q_max)) + 1)]
    return grid if grid[-1] == q_max else [*grid, q_max]


def draw(profile: DeviceProfile) -> Figure:
    qs = in_flight_grid(profile)
    gbs = np.array([[profile.flash.curve.bytes_per_s(c, q) / 1e9 for q in qs] for c in CHUNKS])
    fig = C.new_figure(max(6.5, 2.2 + 0.62 * len(qs)), 6.4)
    ax = fig.subplots()
    im = ax.imshow(gbs, origin="lower", aspect="auto", cmap="magma")
    for i in range(len(CHUNKS)):
        for j in range(len(qs)):
            v = gbs[i, j]
            ax.text(j, i, f"{v:.2f}" if v < 10 else f"{v:.1f}", ha="center", va="center", fontsize=7,
                    color="white" if v < 0.6 * gbs.max() else "black")
    table = profile.flash.read_table
    if table is not None:  # measured points, at their (fractional) positions on the display grid
        pts = [(np.interp(q, qs, np.arange(len(qs))), np.interp(np.log2(c), np.log2(CHUNKS), np.arange(len(CHUNKS))))
               for c in table.chunk_bytes if CHUNKS[0] <= c <= CHUNKS[-1] for q in table.in_flight if q <= qs[-1]]
        if pts:
            xs, ys = zip(*pts)
            ax.plot(np.add(xs, 0.32), np.subtract(ys, 0.3), ".", color="cyan", ms=3)
    ax.set_xticks(range(len(qs)), [str(q) for q in qs])
    ax.set_yticks(range(len(CHUNKS)), [format_bytes(c).replace(".00", "") for c in CHUNKS])
    ax.set_xlabel("reads in flight")
    ax.set_ylabel("chunk size")
    model = ("measured table, interpolated (dots: measured points)" if table is not None
             else "closed form from datasheet numbers")
    ax.set_title(f"{TITLE}: {profile.name}\n{model}\nsequential read "
                 f"{profile.flash.sequential_read_bytes_per_s / 1e9:.2f} GB/s", fontsize=9)
    fig.colorbar(im, ax=ax, label="GB/s (decimal)")
    return fig
