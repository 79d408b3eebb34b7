"""The one exception type for bad user input, shared by every flashsim package.

A `FlashsimError` is printed by the CLI as a single line on stderr (what is wrong, where, what to do)
and ends the process with exit code 2. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

from collections.abc import Iterable

from devices.suggest import hint


class FlashsimError(Exception):
    """Bad input from the user: a missing file, an unknown name, an invalid value."""

    exit_code = 2


class BudgetError(FlashsimError):
    """The DRAM budget cannot hold what a run must keep resident (weights, KV cache, the neurons a
    step computes): a property of the configuration at that budget, so a planner reads it as "does
    not fit" rather than as bad input."""


def unknown_name(kind: str, name: str, known: Iterable[str]) -> FlashsimError:
    """An error for an unknown `kind` called `name`: its close matches (devices/suggest.py), then
    every known name."""
    return FlashsimError(f"unknown {kind} {name!r}; {hint(name, sorted(known), 'known')}")
