"""Every test here is a speed measurement: marked `benchmark`, kept out of the default run (and so out
of `make test` and CI), run by `make bench`, which prints ratios measured side by side."""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.benchmark)
