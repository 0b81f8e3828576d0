"""Shared fixtures: a private PostgreSQL for the session, a migrated template database, a fresh
database per test (CREATE DATABASE ... TEMPLATE), and a running control plane."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest

from environments.local.launch import ControlPlane
from environments.local.pgserver import PostgresServer

# the recorded-cluster Kubernetes stub (`fake_cluster`), used by tests/chaos and tests/gameday
pytest_plugins = ["tests.chaos.fake_kube"]

_counter = itertools.count()

# Every server a test starts - fixtures in this process, and local environments started by
# `gameday` subprocesses - dies with this test session, even when it is killed by a timeout
# (environments/local/watchdog.py, the environment supervisor's owner).
os.environ.setdefault("GAMEDAY_OWNER_PID", str(os.getpid()))


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    with PostgresServer() as pg:
        yield pg


@pytest.fixture(scope="session")
def pg_template(pg_server: PostgresServer) -> str:
    from controlplane.db import migrate

    pg_server.create_database("cp_template")
    migrate(pg_server.dsn("cp_template"))
    return "cp_template"


@pytest.fixture
def pg_dsn(pg_server: PostgresServer, pg_template: str) -> str:
    """A fresh, migrated database for one test."""
    return pg_server.create_database(f"t{next(_counter)}", template=pg_template)


@pytest.fixture
def cp_stack(pg_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """One API replica + one reconciler on a fresh database (short leases for fast tests)."""
    cp = ControlPlane(dsn=pg_dsn, lease_seconds=3.0, retry_base=0.2,
                      logdir=tmp_path_factory.mktemp("cp"))
    cp.start(migrate=False)
    try:
        yield cp
    finally:
        cp.stop()


# The longest modules first (figures from `--durations` of CI-like runs): `make test` runs
# `-n 2 --dist loadfile --no-loadscope-reorder` (pytest-xdist), so each module runs whole on one
# worker in this order, and starting the end-to-end game days first (mostly waiting on faults
# and recoveries, each on its own local environment) keeps the two workers' shares even.
LONG_FIRST = (
    "tests/gameday/test_selftest_core.py",
    "tests/gameday/test_gameday_full.py",
    "tests/gameday/test_gameday_gray.py",
    "tests/gameday/test_gameday_upgrade.py",
    "tests/gameday/test_gameday_pipeline.py",
    "tests/gameday/test_gameday_local.py",
    "tests/platforms/test_prefect_gameday.py",
    "tests/gameday/test_db_restore.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable
