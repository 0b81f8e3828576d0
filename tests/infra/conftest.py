from __future__ import annotations

import pytest

from tests.infra.harness import Run, run_program

STACKS = ("dev", "staging", "prod")


@pytest.fixture(scope="session")
def runs() -> dict[str, Run]:
    """The program run once per stack config (fresh runpy per stack)."""
    return {stack: run_program(stack) for stack in STACKS}
