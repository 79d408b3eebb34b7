"""One calibration of this host: `bench flash` then `bench compute` into a profile file, and the
recalibrations spread over a long validation (`flashsim validate --recalibrate-every S`).

`calibrate` is steps 1-3 of `flashsim calibrate` (flashsim/commands/calibrate.py): the direct-I/O read
grid on a file in a folder of the disk to measure, the compute benches at the runs' thread count,
both sections written into the profile with their provenance (real.validation.profile_writer). Units:
bytes, seconds, bytes/s.

`Recalibrator`: a validation of an hour meets a shared host's states in proportion, while one
calibration is a few minutes of one state. It calibrates at the validation's start, again between
real runs once `every_s` seconds of runs have passed since the last calibration ended, and at the
end (unless the last one came after the last run), each in a fresh Python process, so the
calibrations bracket the runs and are spread over them; `merged()` is their mean
(real/validation/profile_merge.py), the profile the runs are then scored with.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import sys
import time
from pathlib import Path
from typing import Any

from devices.errors import FlashsimError
from devices.units import format_bytes

QUICK_BENCH_BYTES = 64 << 20
FULL_BENCH_BYTES = 2 << 30


@dataclasses.dataclass
class Calibration:
    """One calibration's outputs: the profile written, the raw bench results, the commands."""

    profile: Any
    flash: dict[str, Any]
    compute: dict[str, Any]
    flash_command: str
    compute_command: str


def calibrate(folder: Path, target: Path, name: str, *, threads: int = 1, seed: int = 0, quick: bool = False,
              size_bytes: int | None = None, bench_file: Path | None = None, keep_file: bool = False,
              say: Any = None) -> Calibration:
    """bench flash on `bench_file` (default: a new file in `folder`, removed afterwards unless
    `keep_file`; an existing file is only read) and bench compute at `threads`, both written into
    the profile at `target` (created from the bundled profile `name` if missing, else updated)."""
    from devices.schema import load_profile
    from real.bench import bench_compute, bench_flash
    from real.validation.profile_writer import MEASURED_PREFIX, write_profile

    if threads < 1:
        raise FlashsimError(f"--threads {threads}: must be >= 1")
    size = size_bytes if size_bytes is not None else QUICK_BENCH_BYTES if quick else FULL_BENCH_BYTES
    today = dt.date.today().isoformat()
    cfg = bench_flash.FlashBenchConfig(
        chunks=tuple(bench_flash.QUICK_CHUNKS if quick else bench_flash.DEFAULT_CHUNKS),
        in_flight=tuple(bench_flash.QUICK_IN_FLIGHT if quick else bench_flash.DEFAULT_IN_FLIGHT),
        duration_s=0.2 if quick else 1.0, seed=seed, direct=None, passes=1 if quick else 3, compute_threads=threads)
    if bench_file is None:
        bench_file = folder / f"flashsim-calibrate-{os.getpid()}.dat"
        if bench_file.exists():
            raise FlashsimError(f"{bench_file}: already exists; remove it or choose another --path")
    flash_cmd = (f"flashsim bench flash --path {bench_file} --size {size} --chunks "
                 + ",".join(str(c) for c in cfg.chunks) + " --in-flight " + ",".join(map(str, cfg.in_flight))
                 + f" --duration-s {cfg.duration_s:g} --passes {cfg.passes} --seed {cfg.seed} --compute-threads "
                 f"{threads} (via flashsim calibrate)")
    if say:
        say(f"bench flash: {len(cfg.chunks)} chunk sizes x {len(cfg.in_flight)} reads in flight on "
            f"{format_bytes(size)} in {bench_file.parent}")
    flash = bench_flash.run_flash_bench(path=bench_file, size_bytes=size, cfg=cfg, keep_file=keep_file, progress=None)
    how = (f"{'direct I/O' if flash['direct_io'] else 'BUFFERED reads, page cache dropped per point'}, python threads + "
           f"os.preadv, {format_bytes(flash['file_bytes'])} file, {cfg.duration_s:g} s per point")
    section = bench_flash.flash_section(result=flash, source=f"{MEASURED_PREFIX} flash ({today}): {how}; `{flash_cmd}`")
    write_profile(path=target, name=name, flash=section, command=flash_cmd)

    if say:
        say(f"bench compute ({'quick, ' if quick else ''}{threads} thread(s))")
    comp = bench_compute.run_compute_bench(quick=quick, framework="auto", seed=seed, threads=threads)
    comp_cmd = (f"flashsim bench compute --framework auto --seed {seed}" + (" --quick" if quick else "")
                + f" --threads {threads} (via flashsim calibrate)")
    base = load_profile(target)
    compute, memory = bench_compute.compute_sections(result=comp, date=today, command=comp_cmd,
                                                     old_memory_source=base.memory.source)
    profile = write_profile(path=target, name=name, compute=compute, memory=memory, command=comp_cmd)
    return Calibration(profile, flash, comp, flash_cmd, comp_cmd)


def calibration_points(profile: Any, grid_configs: list[str]) -> dict[str, Any]:
    """What fitted `profile`, for a validation's report: `measured`, each section's provenance (the
    bench commands and what they timed: the read grid of chunk sizes x reads in flight, the kernel
    tables, the probes), and `grid_configs`, the validation configurations (labels in
    `grid_configs`) among them, which the score leaves out. `calibrate` times its own bench file,
    kernels and probe layers, never a validation configuration, so a profile it wrote names none; a
    section whose provenance names a configuration's label (one fitted on validation runs) has it
    listed."""
    measured = {name: getattr(profile, name).source for name in ("flash", "compute", "memory")}
    text = "\n".join(measured.values())
    return {"measured": measured, "grid_configs": [c for c in grid_configs if c in text]}


class Recalibrator:
    """Calibrations spread over a validation (module docstring), each the full benches (a few
    minutes; the quick benches' small grids and short probes measure too little of the host to
    score a grid against). `folder`: where the bench file (created once, read by every
    calibration, removed with the folder) and the profiles cal-0.yaml, cal-1.yaml, ... go; `base`:
    the profile each calibration starts from (its unmeasured fields: memory capacity, description);
    `every_s` > 0 (run_validation checks it before any work)."""

    def __init__(self, folder: Path, base: Any, every_s: float, *, threads: int, seed: int, say: Any = None):
        from real.validation.profile_writer import profile_yaml

        self.folder, self.base, self.every_s = folder, base, every_s
        self.threads, self.seed, self.say = threads, seed, say
        self.folder.mkdir(parents=True, exist_ok=True)
        self.bench_file = folder / "bench.dat"
        self.base_text = profile_yaml(base, "the validation's profile, the base of each recalibration")
        self.calibrations: list[Path] = []            # each calibration's profile file
        self.times: list[tuple[float, float]] = []     # perf_counter (start, end) of each calibration
        self.runs_since = 0                           # real runs since the last calibration

    def run(self) -> Path:
        k = len(self.calibrations)
        target = self.folder / f"cal-{k}.yaml"
        target.write_text(self.base_text)
        if self.say:
            self.say(f"calibration {k + 1}")
        t = time.perf_counter()
        self._calibrate(target)
        self.calibrations.append(target)
        self.times.append((t, time.perf_counter()))
        self.runs_since = 0
        return target

    def _calibrate(self, target: Path) -> None:
        """One calibration into `target`, in a fresh Python process (`python -m real.validation.calibration`),
        as `flashsim bench` runs: it measures the host, not the validating process, whose heap,
        mappings and framework state after the real runs slow small reads and kernels timed inside
        it."""
        import subprocess

        cmd = [sys.executable, "-m", "real.validation.calibration", str(self.folder), str(target), self.base.name,
               str(self.threads), str(self.seed), str(self.bench_file)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
            raise FlashsimError(f"--recalibrate-every: calibration {len(self.calibrations) + 1} failed: {why}")

    def maybe_run(self) -> None:
        """After a real run: calibrates when `every_s` seconds have passed since the last calibration
        ended."""
        self.runs_since += 1
        if not self.times or time.perf_counter() - self.times[-1][1] >= self.every_s:
            self.run()

    def finish(self) -> None:
        """The end's calibration, unless the last one came after the last real run (it was due
        then: a second one right after it would weigh that moment twice)."""
        if self.runs_since or not self.calibrations:
            self.run()

    def merged(self) -> Any:
        """The mean of the calibrations (real.validation.profile_merge), named as the base profile; the only
        calibration's profile when there is one."""
        from devices.schema import load_profile
        from real.validation.profile_merge import merge_profiles

        if len(self.calibrations) == 1:
            return load_profile(self.calibrations[0])
        return merge_profiles(self.calibrations, self.base.name)

    def summary(self, t0: float) -> list[dict[str, Any]]:
        """Each calibration's start and end (seconds into the validation) and its wall time."""
        return [{"start_s": round(a - t0, 1), "end_s": round(b - t0, 1), "wall_s": round(b - a, 1)}
                for a, b in self.times]


def _main(argv: list[str]) -> int:
    """`python -m real.validation.calibration FOLDER TARGET NAME THREADS SEED BENCH_FILE`: one full calibration
    (Recalibrator._calibrate's child process); a FlashsimError is one line on stderr, exit 2."""
    folder, target, name, threads, seed, bench_file = argv
    try:
        calibrate(Path(folder), Path(target), name, threads=int(threads), seed=int(seed), quick=False,
                  bench_file=Path(bench_file), keep_file=True)
    except FlashsimError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
