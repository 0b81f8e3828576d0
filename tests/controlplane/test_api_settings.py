"""The `api` command's settings reach the app a worker process builds from the environment
(uvicorn imports a factory): checked end to end, not on the Settings object alone."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from controlplane.api.app import SETTINGS_ENV, app_from_env
from controlplane.cli import group


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    import uvicorn

    # the command and app_from_env install the JSON log handler on the root logger, as a
    # process of their own should; it must not outlive the test in a shared test worker
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append({"app": app, **kw}))
    monkeypatch.setenv(SETTINGS_ENV, "")  # restored after the test; the command overwrites it
    monkeypatch.setenv("CONTROLPLANE_LOG_LEVEL", "INFO")
    yield calls
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.parametrize(("args", "window"), [([], 0.005), (["--submit-gather-ms", "0"], 0.0),
                                              (["--submit-gather-ms", "2.5"], 0.0025)])
def test_submit_gather_ms_reaches_the_group_commit(started: list[dict[str, Any]],
                                                   args: list[str], window: float) -> None:
    res = CliRunner().invoke(group, ["api", "--dsn", "postgresql://127.0.0.1:1/x",
                                     "--workers", "2", *args])
    assert res.exit_code == 0, res.output
    assert started and started[0]["app"] == "controlplane.api.app:app_from_env"
    assert app_from_env().state.group_commit.window == pytest.approx(window)


def test_a_negative_gather_is_refused_naming_the_option(started: list[dict[str, Any]]) -> None:
    res = CliRunner().invoke(group, ["api", "--dsn", "postgresql://127.0.0.1:1/x",
                                     "--submit-gather-ms", "-1"])
    assert res.exit_code == 2 and "--submit-gather-ms" in res.output and not started
