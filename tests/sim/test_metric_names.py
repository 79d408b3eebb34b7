"""Summary metric names are defined once, in sim/metric_names.py, where the simulator produces them:
the summary carries exactly those keys, and no other module binds a constant to one of the names."""

from __future__ import annotations

import ast
from pathlib import Path

from sim import metric_names
from sim.results import SUMMARY_KEYS

ROOT = Path(__file__).resolve().parents[2]
READERS = ("adapt", "real", "analysis", "flashsim")   # the packages above the simulator read its summary
NAMES = {v for k, v in vars(metric_names).items() if k.isupper() and isinstance(v, str)}


def test_summary_keys_come_from_the_names_module() -> None:
    assert SUMMARY_KEYS is metric_names.SUMMARY_KEYS and set(SUMMARY_KEYS) <= NAMES


def test_the_summary_carries_every_name(small_trace) -> None:
    from devices import load_profile
    from sim.engine import simulate
    from sim.policies.presets import preset_config

    s = simulate(small_trace, None, load_profile("jetson-orin-nano-8gb"), preset_config("naive")).summary()
    assert NAMES <= set(s)


def test_no_module_redeclares_a_metric_name() -> None:
    """A string constant equal to a summary metric name, bound at module level in a package that
    reads the summary, is a second definition (readers import the name instead)."""
    bad = []
    for pkg in READERS:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            if not any(f'"{n}"' in text or f"'{n}'" in text for n in NAMES):
                continue                                     # no metric name as a literal: nothing to parse
            for node in ast.parse(text).body:
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                        and node.value.value in NAMES:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value.value!r}")
                elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple) and \
                        any(isinstance(e, ast.Constant) and e.value in NAMES for e in node.value.elts):
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: a tuple of metric names")
    assert not bad, "metric names declared by a reader:\n" + "\n".join(bad)
