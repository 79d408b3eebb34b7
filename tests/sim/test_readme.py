"""The README's worked example is real output of today's code: its command runs and prints exactly
the block the README shows (a change detector that guards the README: a change to the simulator that
moves the example's numbers fails here until the block is pasted from a new run).

The example is a simulated replay of a shipped trace on a bundled profile, deterministic to the
last digit, so the comparison is exact."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from flashsim.main import main

README = Path(__file__).resolve().parents[2] / "README.md"


def worked_example() -> tuple[list[str], str]:
    """(the example's flashsim arguments, the output block that follows it) from the README."""
    text = README.read_text()
    m = re.search(r"## A worked example.*?```bash\n(.*?)```\n```\n(.*?)```", text, flags=re.S)
    assert m, "README.md: no '## A worked example' section with a bash block and an output block"
    command = m.group(1).replace("\\\n", " ")
    argv = shlex.split(command)
    assert argv[0].endswith("flashsim"), command
    return argv[1:], m.group(2)


def test_readme_worked_example_prints_what_the_readme_shows(capsys) -> None:
    argv, shown = worked_example()
    assert argv[0] == "replay"
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert printed == shown, (
        "README.md's worked example is out of date: run `" + " ".join(["flashsim", *argv]) + "` and paste its output "
        "into the block\n--- README\n" + shown + "--- printed\n" + printed)
