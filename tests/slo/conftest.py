from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from slo.fixtures import ExperimentFixture, FixtureRun, FixtureSpec, build_run
from slo.specs import SPEC_DIR


@pytest.fixture
def spec_copy(tmp_path: Path) -> Path:
    """A writable copy of slo/specs to break on purpose."""
    dest = tmp_path / "specs"
    shutil.copytree(SPEC_DIR, dest, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    return dest


@pytest.fixture
def make_run(tmp_path: Path):
    def make(*experiments: ExperimentFixture, **kwargs) -> FixtureRun:
        kwargs.setdefault("submissions", 300)  # enough traffic for every window, fast to evaluate
        spec = FixtureSpec(
            experiments=experiments or (ExperimentFixture("api-replica-loss"),), **kwargs
        )
        return build_run(tmp_path / f"run-{len(list(tmp_path.iterdir()))}", spec)

    return make
