"""The durability stream (gameday/durability_stream.py): its submissions go to the held queue
with the stream's source on every ledger line, it refuses a rate out of range and a target
off loopback, `gameday run` refuses it where there is no held queue before touching anything,
and stopping it cancels the held queue's work, recording a failure to instead of raising."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gameday import durability_stream
from gameday.run import Options, preflight
from gameday.suites import SuiteError
from loadtests.safety import UnsafeTargetError
from slo.ledger import read as read_ledger
from tests.loadtests.test_overload import Server

TOKENS = {"projects": {"team-b": "b" * 20, "team-a": "a" * 20}}


class Adapter:
    def __init__(self, fail: bool = False) -> None:
        self.calls, self.fail = 0, fail

    def cancel_held(self) -> int:
        self.calls += 1
        if self.fail:
            raise RuntimeError("HTTP 409 queue 'held' is not held")
        return 7


def test_the_stream_submits_to_the_held_queue_and_cancels_it_when_stopped(
        tmp_path: Path) -> None:
    assert durability_stream.BODY["queue"] == "held"
    with Server(body=durability_stream.BODY) as server:
        loop = durability_stream.start(f"http://127.0.0.1:{server.port}", TOKENS, tmp_path, 30.0)
        time.sleep(1.2)
        adapter = Adapter()
        counts = durability_stream.stop(loop, adapter)
    assert counts["stopped"] and counts["acked"] > 10 and counts["held_canceled"] == 7
    assert adapter.calls == 1
    ledger = list(read_ledger([tmp_path / ".locust" / "parts" /
                               "ledger.durability-stream.jsonl"]))
    assert len(ledger) == counts["acked"]
    assert {e.source for e in ledger} == {"durability-stream"}
    assert {e.project for e in ledger} == {"team-a"}  # the first project, as the probes'
    # its requests apart from the background load's (requests.jsonl is the users' SLIs)
    assert (tmp_path / durability_stream.REQUESTS_FILE).stat().st_size
    assert not list((tmp_path / ".locust" / "parts").glob("requests.*"))


def test_a_failed_cancel_is_recorded_not_raised(tmp_path: Path) -> None:
    with Server(body=durability_stream.BODY) as server:
        loop = durability_stream.start(f"http://127.0.0.1:{server.port}", TOKENS, tmp_path, 5.0)
        counts = durability_stream.stop(loop, Adapter(fail=True))
    assert "not held" in counts["held_cancel_error"]


def test_bad_rates_tokens_and_targets_are_refused(tmp_path: Path) -> None:
    for rate in (-1.0, 1e6):
        with pytest.raises(durability_stream.StreamError, match="out of range"):
            durability_stream.check_rate(rate)
    with pytest.raises(durability_stream.StreamError, match="tokens.projects"):
        durability_stream.start("http://127.0.0.1:1", {}, tmp_path, 1.0)
    with pytest.raises(UnsafeTargetError):
        durability_stream.start("http://192.0.2.1:8080", TOKENS, tmp_path, 1.0)


@pytest.mark.parametrize(("kw", "why"), [
    ({"durability_rate": 5000.0}, "out of range"),
    ({"durability_rate": 50.0, "platform": "prefect"}, "platform with a held queue only"),
])
def test_run_refuses_the_stream_before_touching_anything(kw: dict, why: str) -> None:
    with pytest.raises(SuiteError, match=why):
        preflight(Options(suite="ci", **kw))


def test_the_dry_run_names_the_stream(tmp_path: Path) -> None:
    from rich.console import Console

    from gameday.run import dry_run

    console = Console(record=True, width=200)
    opts = Options(suite="ci", durability_rate=100.0, home=tmp_path, runs_dir=tmp_path / "runs")
    dry_run(opts, preflight(opts), console)
    assert "durability stream: 100 submissions/s to the held queue" in console.export_text()
