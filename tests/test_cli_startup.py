"""Lazy start-up of the command line (flashsim/main.py): `flashsim --help` lists every verb without
importing its module, and the one-line help it shows is what each module registers."""

from __future__ import annotations

import subprocess
import sys

from flashsim.main import COMMAND_MODULES, VERBS, build_parser


def test_verb_table_matches_what_the_modules_register() -> None:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    registered = {c.dest: c.help for c in sub._choices_actions}
    assert registered == {verb: text for verb, (_, text) in VERBS.items()}
    assert {module for module, _ in VERBS.values()} == set(COMMAND_MODULES)


def test_help_imports_no_heavy_module() -> None:
    """`flashsim --help` and `flashsim plan --help` answer before NumPy is imported."""
    code = ("import sys; from flashsim.main import main\n"
            "for argv in (['--help'], ['plan', '--help']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "print(sorted(m for m in ('numpy', 'pandas', 'matplotlib', 'analysis.planner') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"
    assert "what-if" in out and "--dram-free" in out


def test_plan_command_constants_match_the_library() -> None:
    """flashsim/commands/plan.py spells a few library constants to keep --help light: they agree."""
    from analysis.plan_setup import DEFAULT_PLAN_TOKENS
    from analysis.quality_evidence import DEFAULT_MAX_PPL_RATIO
    from flashsim.commands import plan as cmd
    from sim import metric_names

    assert (cmd.DEFAULT_PLAN_TOKENS, cmd.DEFAULT_MAX_PPL_RATIO) == (DEFAULT_PLAN_TOKENS, DEFAULT_MAX_PPL_RATIO)
    for name in ("ACTIVATION_MASS_KEPT", "COMPUTE_MS_PER_TOKEN", "DRAM_PEAK_BYTES", "JOULES_PER_TOKEN",
                 "MEMORY_MGMT_MS_PER_TOKEN", "STALL_MS_PER_TOKEN", "TOKENS_PER_S"):
        assert getattr(cmd, name) == getattr(metric_names, name)
