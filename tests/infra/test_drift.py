"""`gameday infra drift`: classification of a refreshed preview's steps.

The Pulumi CLI cannot run here, so the engine event logs in tests/infra/data/ were written by
hand in the engine's JSON event format; each line is parsed by the SDK's own
``EngineEvent.from_json`` below, so a shape the SDK would not read fails this test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from pulumi.automation.events import EngineEvent

from environments.schedule import GameDayLock
from gameday.cli import main
from operations import drift

DATA = Path(__file__).parent / "data"
DRIFTED, CLEAN = DATA / "drift-staging.eventlog.jsonl", DATA / "clean-staging.eventlog.jsonl"


def test_recorded_logs_are_what_the_sdk_parses() -> None:
    for path in (DRIFTED, CLEAN):
        for line in path.read_text().splitlines():
            event = EngineEvent.from_json(json.loads(line))
            if event.resource_pre_event is not None:
                assert event.resource_pre_event.metadata.urn.startswith("urn:pulumi:staging::")


def test_each_step_gets_the_most_cautious_verdict_that_applies() -> None:
    items = {i.urn.rsplit("::", 1)[-1]: i for i in drift.classify(drift.load_event_log(DRIFTED))}
    verdicts = {name: i.verdict for name, i in items.items()}
    assert verdicts == {
        "mlplatform-staging-db-sg": "investigate",          # ingress: security-relevant
        "mlplatform-staging-net-flow-logs": "restore",      # retention changed by hand
        "mlplatform-staging-obs-rds-cpu": "import",         # named alarm gone from state
        "mlplatform-staging-net-private-a": "restore",      # stateless, recreated by `up`
        "mlplatform-staging-system-lt": "investigate",      # replace
        "mlplatform-staging-db-postgres": "investigate",    # data-bearing
        "mlplatform-staging-artifacts-bucket": "investigate",  # bucket policy
    }
    assert "same" not in {i.op for i in items.values()}  # no-change steps are not drift
    assert items["mlplatform-staging-db-sg"].properties == ("ingress", "ingress[1]")
    result = drift.summary(list(items.values()))
    assert result["worst"] == "investigate"
    assert result["counts"] == {"restore": 2, "import": 1, "investigate": 4}


def test_a_deleted_data_bearing_resource_is_never_just_recreated() -> None:
    item = drift.classify_step({"op": "create", "type": "aws:s3/bucket:Bucket",
                                "urn": "urn:pulumi:prod::mlplatform::aws:s3/bucket:Bucket::b"})
    assert item is not None and item.verdict == "investigate" and "backup" in item.reason
    assert drift.classify_step({"op": "same", "type": "aws:s3/bucket:Bucket", "urn": "u"}) is None


def test_cli_on_recorded_events_exit_codes_and_json(tmp_path: Path) -> None:
    out = tmp_path / "drift.json"
    result = CliRunner().invoke(main, ["infra", "drift", "--stack", "staging", "--events",
                                       str(DRIFTED), "--json-out", str(out)])
    assert result.exit_code == 3, result.output
    assert "worst: investigate" in result.output and "import" in result.output
    saved = json.loads(out.read_text())
    assert saved["stack"] == "staging" and saved["drifted"] and len(saved["items"]) == 7
    clean = CliRunner().invoke(main, ["infra", "drift", "--stack", "staging", "--events", str(CLEAN)])
    assert clean.exit_code == 0 and "no drift" in clean.output


def test_cli_refuses_without_a_lock_choice_and_while_a_game_day_holds_it(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["infra", "drift", "--stack", "staging"])
    assert result.exit_code == 2 and "--no-lock" in result.output
    lock = GameDayLock(tmp_path / "gameday.lock")
    lock.acquire({"run": "game day in progress"})
    try:
        result = CliRunner().invoke(main, ["infra", "drift", "--stack", "staging",
                                           "--lock-file", str(tmp_path / "gameday.lock")])
    finally:
        lock.release()
    assert result.exit_code == 1 and "refused: a game day is already running" in result.output


def test_a_broken_event_log_names_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(CLEAN.read_text() + "{not json\n")
    result = CliRunner().invoke(main, ["infra", "drift", "--stack", "staging", "--events", str(bad)])
    n = len(CLEAN.read_text().splitlines()) + 1
    assert result.exit_code == 1 and f"bad.jsonl:{n}: not a JSON engine event" in result.output


@pytest.mark.parametrize("prop", ["ingress", "policy", "publicAccessBlock", "kmsKeyId"])
def test_security_relevant_updates_are_investigated(prop: str) -> None:
    item = drift.classify_step({"op": "update", "type": "aws:ec2/securityGroup:SecurityGroup",
                                "urn": "urn:x::sg", "diffs": [prop]})
    assert item is not None and item.verdict == "investigate"
