"""Count the bad-input batch of issue 52: how many cases, how many handled cleanly.

    python scripts/robustness_batch.py                  # this checkout
    python scripts/robustness_batch.py --tree OLD_DIR   # another checkout (e.g. `git archive` of an older
                                                        # commit): the batch's tests are copied into it

Every case is one pytest item of tests/robustness/test_issue52_*.py (slow tier included). A case
counts as clean when its test passes. Each case gets a time limit (SIGALRM; an old tree may hang on
an alias bomb) and the whole run an address-space limit (RLIMIT_AS), so a hole turns into a failed
case instead of a stuck or swapping machine. Prints one line per hole and the totals.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BATCH = ["tests/robustness/test_issue52_outputs.py", "tests/robustness/test_issue52_inputs.py",
         "tests/robustness/test_issue52_environment.py"]


class _Limits:
    """pytest plugin: a per-case alarm and the outcome of every case."""

    def __init__(self, seconds: int):
        self.seconds, self.outcome = seconds, {}

    def pytest_runtest_setup(self, item) -> None:  # type: ignore[no-untyped-def]
        def alarm(signum, frame):  # type: ignore[no-untyped-def]
            raise TimeoutError(f"case ran past {self.seconds} s")

        signal.signal(signal.SIGALRM, alarm)
        signal.alarm(self.seconds)

    def pytest_runtest_teardown(self, item) -> None:  # type: ignore[no-untyped-def]
        signal.alarm(0)

    def pytest_runtest_logreport(self, report) -> None:  # type: ignore[no-untyped-def]
        if report.when == "call" or report.outcome != "passed":
            prev = self.outcome.get(report.nodeid)
            if prev in (None, "passed"):
                self.outcome[report.nodeid] = report.outcome


def _inner(seconds: int, mem_gib: int) -> int:
    import pytest

    resource.setrlimit(resource.RLIMIT_AS, (mem_gib << 30, mem_gib << 30))
    plugin = _Limits(seconds)
    files = [f for f in BATCH if Path(f).is_file()]
    pytest.main(["-q", "-p", "no:cacheprovider", "-m", "slow or not slow", "--no-header", "-rN", *files],
                plugins=[plugin])
    holes: dict[str, Counter] = {}
    for nodeid, outcome in sorted(plugin.outcome.items()):
        name = nodeid.split("::")[-1]
        hole = re.sub(r"^test_issue52_|\[.*$", "", name)
        holes.setdefault(Path(nodeid.split("::")[0]).stem.removeprefix("test_issue52_") + ": " + hole, Counter())[outcome] += 1
    total = Counter(o for o in plugin.outcome.values())
    for hole, c in holes.items():
        print(f"  {hole:70s} {c['passed']:3d} / {sum(c.values()):3d} clean")
    n = sum(total.values())
    print(f"batch: {n} cases, {total['passed']} clean, {n - total['passed'] - total['skipped']} not clean, "
          f"{total['skipped']} skipped")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, default=REPO, help="source tree to run the batch against")
    ap.add_argument("--timeout", type=int, default=60, help="seconds per case (default 60)")
    ap.add_argument("--mem-gib", type=int, default=8, help="address-space limit of the run (default 8 GiB)")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        return _inner(args.timeout, args.mem_gib)
    tree = args.tree.resolve()
    if tree != REPO:
        for f in [*BATCH, "tests/robustness/conftest.py"]:
            if (REPO / f).is_file():
                (tree / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(REPO / f, tree / f)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.call([sys.executable, str(REPO / "scripts" / "robustness_batch.py"), "--inner",
                            "--timeout", str(args.timeout), "--mem-gib", str(args.mem_gib)], cwd=tree, env=env)


if __name__ == "__main__":
    sys.exit(main())
