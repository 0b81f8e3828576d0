from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def home() -> Iterator[Path]:
    # the postgres OS user must be able to enter the state directory (pytest's tmp_path is 0700)
    path = Path(tempfile.mkdtemp(prefix="gameday-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)
