"""Helpers for the load tests. Locust itself is never imported here: it runs in its own
process(es), started by `gameday load` / loadtests.runner."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml


@pytest.fixture
def write_scenario(tmp_path: Path) -> Any:
    """Write a scenario YAML (based on the bundled ci.yaml, with overrides) and return its path."""
    base = yaml.safe_load((Path(__file__).parents[2] / "loadtests/scenarios/ci.yaml").read_text())

    def write(name: str = "test", **over: Any) -> Path:
        doc = {**base, **over}
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(doc))
        return path

    return write
