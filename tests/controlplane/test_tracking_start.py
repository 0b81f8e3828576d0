"""`--tracking 1` without a tracking server is a deterministic start failure naming the field."""

from __future__ import annotations

import json

import pytest

from controlplane.workload.__main__ import EXIT_INVALID, main


@pytest.mark.parametrize(("kind", "why"), [
    ("train", "no tracking server: set MLFLOW_TRACKING_URI or --tracking-uri"),
    ("sleep", "only the train kind logs to tracking"),
])
def test_tracking_without_a_server_fails_at_start(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str],
                                                  kind: str, why: str) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = [] if kind == "train" else ["--tracking-uri", "http://127.0.0.1:9"]
    code = main(["--kind", kind, "--operation-id", "op", "--attempt", "1", "--tracking", "1",
                 *uri])
    event = json.loads(capsys.readouterr().out.strip().removeprefix("@event "))
    assert code == EXIT_INVALID
    assert event["kind"] == "start_failed" and event["data"]["error_kind"] == "deterministic"
    assert event["message"] == f"workload.params.tracking: {why}"
