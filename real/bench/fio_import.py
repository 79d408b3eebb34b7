"""Import fio's JSON output (`fio --output-format=json`) as a flash read table (bytes, bytes/s, s).

Every `randread` job becomes one table point: chunk = its block size (`bs`, fio's binary k/m/g),
reads in flight = numjobs x iodepth (iodepth counts only for asynchronous engines; psync/sync
jobs have one read in flight each). Jobs reported separately under the same name (numjobs
without group_reporting) are summed. The points must form a full grid (every chunk at every
in-flight count), as the profile's table requires. `read` (sequential) jobs give the sequential
bandwidth (the best one); the 4 KiB random read at one in flight gives the latency (fio's mean
total latency, `lat_ns`). Jobs without direct=1 are refused: buffered reads measure the page cache.

`fio_jobfile(...)` writes a job file that produces exactly such a grid.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from devices.errors import FlashsimError

SYNC_ENGINES = {"sync", "psync", "vsync", "pvsync", "pvsync2", "mmap"}
_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)


def _fio_bytes(text: str, where: str) -> int:
    first = str(text).split(",")[0].split(":")[0]
    m = _SIZE.match(first)
    if not m:
        raise FlashsimError(f"{where}: cannot read block size {text!r}")
    return int(m.group(1)) * 1024 ** "_kmgt".index((m.group(2) or "_").lower())


def import_fio(path: Path) -> dict[str, Any]:
    """A bench-flash-shaped result dict from a fio JSON file; FlashsimError on anything unusable."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise FlashsimError(f"--import-fio {path}: cannot read ({e.strerror})") from None
    start = text.find("{")  # fio may print warnings before the JSON
    try:
        data = json.loads(text[start:] if start >= 0 else text)
    except json.JSONDecodeError as e:
        raise FlashsimError(f"{path}: not fio JSON output (line {e.lineno}: {e.msg}); run fio with --output-format=json") from None
    jobs = data.get("jobs") if isinstance(data, dict) else None
    if not jobs:
        raise FlashsimError(f"{path}: no 'jobs' in the fio output; run fio with --output-format=json")
    glob = data.get("global options", {}) or {}
    rand: dict[tuple[str, int, int], float] = defaultdict(float)
    lat: dict[tuple[int, int], float] = {}
    seq: list[float] = []
    for k, job in enumerate(jobs):
        opts = {**glob, **(job.get("job options") or {})}
        name = str(job.get("jobname", k))
        where = f"{path}: job {name!r}"
        rw = str(opts.get("rw", opts.get("readwrite", "read")))
        if rw not in ("randread", "read"):
            continue
        if str(opts.get("direct", "0")) != "1":
            raise FlashsimError(f"{where}: ran without direct=1, so it measured the page cache; rerun with --direct=1")
        if job.get("error"):
            raise FlashsimError(f"{where}: fio reported error {job['error']}")
        bs = _fio_bytes(opts.get("bs", opts.get("blocksize", "4k")), where)
        engine = str(opts.get("ioengine", "psync"))
        depth = 1 if engine in SYNC_ENGINES else int(opts.get("iodepth", 1))
        q = int(opts.get("numjobs", 1)) * depth
        read = job.get("read") or {}
        bw = read.get("bw_bytes")
        if bw is None and "bw" in read:
            bw = float(read["bw"]) * 1024  # older fio: KiB/s
        if not bw or bw <= 0:
            raise FlashsimError(f"{where}: no read bandwidth in the output")
        if rw == "read":
            seq.append(float(bw))
            continue
        rand[(name, bs, q)] += float(bw)
        lat_ns = (read.get("lat_ns") or read.get("clat_ns") or {}).get("mean")
        if lat_ns:
            lat[(bs, q)] = float(lat_ns) * 1e-9
    if not rand:
        raise FlashsimError(f"{path}: no randread jobs; the read table needs random reads over chunk sizes and in-flight counts")
    points: dict[tuple[int, int], float] = {}
    for (_, bs, q), bw in rand.items():
        points[(bs, q)] = max(points.get((bs, q), 0.0), bw)
    chunks = sorted({c for c, _ in points})
    depths = sorted({q for _, q in points})
    for c in chunks:
        for q in depths:
            if (c, q) not in points:
                raise FlashsimError(f"{path}: no randread job with bs={c} at {q} reads in flight; the table needs "
                                    f"every chunk ({', '.join(map(str, chunks))}) at every in-flight count "
                                    f"({', '.join(map(str, depths))})")
    grid = [[points[(c, q)] for q in depths] for c in chunks]
    notes = []
    if seq:
        seq_bw = max(seq)
    else:
        seq_bw = max(max(r) for r in grid)
        notes.append("no sequential 'read' job: sequential bandwidth taken as the table's maximum")
    c0 = chunks[0]
    if (c0, 1) in lat:
        latency = lat[(c0, 1)]
    else:
        latency = c0 / points.get((c0, depths[0]), grid[0][0]) * depths[0]
        notes.append(f"latency from the {c0}-byte throughput at {depths[0]} in flight")
    return {
        "path": str(path), "direct_io": True, "method": f"fio {data.get('fio version', '?')} (imported)",
        "note": "; ".join(notes),
        "grid": {"chunk_bytes": chunks, "in_flight": depths, "bytes_per_s": grid},
        "sequential": {"bytes_per_s": seq_bw},
        "latency_4k_qd1": {"mean_s": latency},
    }


def fio_jobfile(filename: str, chunks: list[int], in_flight: list[int], runtime_s: float = 2.0,
                size: str = "2g") -> str:
    """A fio job file measuring the full grid (psync engine: one thread per read in flight, like
    flashsim's reader) plus one sequential read job; run with `fio FILE --output-format=json`."""
    lines = ["[global]", f"filename={filename}", f"size={size}", "direct=1", "ioengine=psync",
             "time_based=1", f"runtime={max(1, round(runtime_s * 1000))}ms", "group_reporting=1", "stonewall", ""]
    for c in chunks:
        for q in in_flight:
            lines += [f"[rand-{c}-{q}]", "rw=randread", f"bs={c}", f"numjobs={q}", ""]
    lines += ["[seq]", "rw=read", f"bs={max(max(chunks), 1 << 20)}", "numjobs=1", ""]
    return "\n".join(lines)
