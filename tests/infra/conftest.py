from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.infra.harness import Run, run_program
from tests.infra.motoserver import moto_server

STACKS = ("dev", "staging", "prod")


@pytest.fixture(scope="session")
def runs() -> dict[str, Run]:
    """The program run once per stack config (fresh runpy per stack)."""
    return {stack: run_program(stack) for stack in STACKS}


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A moto server per test module (reset it per test: ``motoserver.fresh_session``).
    moto's built-in AMIs come with ~1300 snapshots "owned" by the test account: not ours."""
    with moto_server(tmp_path_factory.mktemp("moto"),
                     {"MOTO_EC2_LOAD_DEFAULT_AMIS": "false"}) as endpoint:
        yield endpoint
