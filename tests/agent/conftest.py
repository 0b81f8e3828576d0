"""Fixtures for the agent tests: moto S3 server and the Debian docker-registry.

Every process is started in its own process group on a random loopback port and killed
(group-wide, after a SIGCONT in case a test froze it) in teardown.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from agenttest import ProcessSupervisor, Registry, S3Server, start_moto, start_registry


@pytest.fixture
def procs() -> Iterator[ProcessSupervisor]:
    sup = ProcessSupervisor()
    yield sup
    sup.kill_all()


@pytest.fixture(scope="session")
def session_procs() -> Iterator[ProcessSupervisor]:
    sup = ProcessSupervisor()
    yield sup
    sup.kill_all()


@pytest.fixture(scope="session")
def moto(session_procs: ProcessSupervisor, tmp_path_factory: pytest.TempPathFactory) -> S3Server:
    """A shared moto server (tests use unique operation ids). Never freeze this one."""
    return start_moto(session_procs, tmp_path_factory.mktemp("moto"))


@pytest.fixture
def private_moto(procs: ProcessSupervisor, tmp_path: Path) -> S3Server:
    """A moto server of this test alone: safe to SIGSTOP."""
    return start_moto(procs, tmp_path)


@pytest.fixture(scope="session")
def registry(session_procs: ProcessSupervisor, tmp_path_factory: pytest.TempPathFactory) -> Registry:
    """A shared registry holding the sample trainer image. Never stop this one."""
    return start_registry(session_procs, tmp_path_factory.mktemp("registry"))


@pytest.fixture
def private_registry(procs: ProcessSupervisor, tmp_path: Path) -> Registry:
    """A registry of this test alone: safe to stop or freeze."""
    return start_registry(procs, tmp_path / "registry")


@pytest.fixture
def operation_id() -> str:
    return str(uuid.uuid4())
