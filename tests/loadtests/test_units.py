"""Pure parts: scenario validation, thresholds, retry/backoff, artifact locations, safety."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from click.testing import CliRunner

from loadtests.cli import load_group
from loadtests.client import Backoff, artifact_refs, is_retryable
from loadtests.collect import ledger_check
from loadtests.safety import UnsafeTargetError, check_target
from loadtests.scenario import ScenarioError, SubmitRetry, Thresholds, bundled, load_scenario
from loadtests.stats import LoadStats
from loadtests.thresholds import Status, evaluate_thresholds


def _route(method: str, route: str, count: int, failures: int, p95: float | None) -> dict:
    return {"method": method, "route": route, "count": count, "failures": failures, "p50_ms": p95,
            "p95_ms": p95, "p99_ms": p95, "avg_ms": p95, "max_ms": p95, "rps": 1.0}


STATS = LoadStats.model_validate({
    "source": "test", "started_at": None, "ended_at": "2026-01-01T00:00:00Z",
    "routes": [_route("POST", "/v1/operations", 200, 4, 120.0),
               _route("GET", "/v1/operations/{id}", 100, 0, 30.0)],
    "total": _route("ALL", "overall", 300, 4, 100.0)})


# --------------------------------------------------------------------------- thresholds

def test_thresholds_pass_fail_and_no_data_per_route_and_overall() -> None:
    th = Thresholds(max_error_rate={"overall": 0.01, "POST /v1/operations": 0.05},
                    max_p95_ms={"POST /v1/operations": 100, "GET /v1/operations/{id}": 50,
                                "GET s3:/{bucket}/artifacts/{id}/attempt-{n}/{file}": 10},
                    min_acknowledged=150, max_abandoned_submissions=0)
    got = {r.name: (r.status, r.measured) for r in
           evaluate_thresholds(th, STATS, acknowledged=196, abandoned=1)}
    assert got == {
        "max_error_rate[overall]": (Status.FAIL, 4 / 300),
        "max_error_rate[POST /v1/operations]": (Status.PASS, 0.02),
        "max_p95_ms[POST /v1/operations]": (Status.FAIL, 120.0),
        "max_p95_ms[GET /v1/operations/{id}]": (Status.PASS, 30.0),
        # a route without requests is "no data": neither pass nor fail
        "max_p95_ms[GET s3:/{bucket}/artifacts/{id}/attempt-{n}/{file}]": (Status.NO_DATA, None),
        "min_acknowledged": (Status.PASS, 196),
        "max_abandoned_submissions": (Status.FAIL, 1),
    }


def test_a_plain_number_threshold_means_overall_and_unset_thresholds_are_skipped() -> None:
    results = evaluate_thresholds(Thresholds(max_p95_ms=100), STATS, acknowledged=0, abandoned=0)
    assert [(r.name, r.status) for r in results] == [("max_p95_ms[overall]", Status.PASS)]
    assert evaluate_thresholds(Thresholds(), STATS, acknowledged=0, abandoned=0) == []
    low = evaluate_thresholds(Thresholds(min_acknowledged=1), STATS, acknowledged=0, abandoned=0)
    assert low[0].failed


# --------------------------------------------------------------------------- scenarios

def test_bundled_scenarios_are_valid() -> None:
    assert {"ci", "steady", "burst"} <= set(bundled())
    for name in bundled():
        scn = load_scenario(name)
        assert scn.name == name and scn.users.total > 0


@pytest.mark.parametrize(("over", "message"), [
    ({"userz": {}}, "field userz: Extra inputs are not permitted"),
    ({"duration": "ten seconds"}, "field duration: not a duration: 'ten seconds'"),
    ({"users": {"submitter": {"count": -1}}}, "field users.submitter.count: Input should be greater"),
    ({"users": {"poller": {"count": 1, "wait_s": [2, 1]}}}, "field users.poller: wait_s must be"),
    ({"users": {"submitter": {"count": 0}}}, "field users: at least one user class needs count >= 1"),
    ({"thresholds": {"max_p95_ms": {"POST /v1/operation": 10}}},
     "field thresholds.max_p95_ms: unknown route 'POST /v1/operation'"),
    ({"operation": {"kind": "dance"}}, "field operation.kind: Input should be 'train', 'sleep' or 'fail'"),
])
def test_broken_scenario_error_names_file_and_field(write_scenario, over: dict, message: str) -> None:
    path = write_scenario("broken", **over)
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)


def test_invalid_yaml_and_missing_file_are_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("users:\n  submitter: {count: 1\n")
    with pytest.raises(ScenarioError, match=r"bad.yaml: line \d+ not valid YAML"):
        load_scenario(bad)
    with pytest.raises(ScenarioError, match=r"nope.yaml: no such scenario file \(bundled: .*ci"):
        load_scenario("nope")


def test_cli_broken_scenario_exits_3_with_the_field(write_scenario) -> None:
    path = write_scenario("broken", spawn_rate=0)
    res = CliRunner().invoke(load_group, ["run", "--scenario", str(path), "--host",
                                          "http://127.0.0.1:9", "--token", "t"])
    assert res.exit_code == 3
    assert f"{path}: field spawn_rate: Input should be greater than 0" in res.output
    res = CliRunner().invoke(load_group, ["validate", str(path), "ci"])
    assert res.exit_code == 3 and "ok: ci" in res.output


def test_cli_usage_error_exits_3_not_2() -> None:
    res = CliRunner().invoke(load_group, ["run", "--scenario", "ci"])
    assert res.exit_code == 3 and "--host" in res.output


# --------------------------------------------------------------------------- safety

@pytest.mark.parametrize("url", ["http://127.0.0.1:8080", "http://127.9.8.7", "http://[::1]:80",
                                 "http://localhost:1"])
def test_loopback_targets_are_allowed(url: str) -> None:
    check_target(url, allow_remote=False)


def test_remote_target_is_refused_unless_allowed() -> None:
    with pytest.raises(UnsafeTargetError, match=r"192\.0\.2\.10 .*not loopback.*--allow-remote"):
        check_target("http://192.0.2.10:8080", allow_remote=False)
    check_target("http://192.0.2.10:8080", allow_remote=True)
    with pytest.raises(UnsafeTargetError, match="expected an http"):
        check_target("127.0.0.1:8080", allow_remote=False)


def test_cli_refuses_a_non_loopback_host_before_starting_anything(tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = CliRunner().invoke(load_group, ["run", "--scenario", "ci", "--host", "http://192.0.2.10",
                                          "--token", "t", "--out", str(out)])
    assert res.exit_code == 3
    assert "refusing to send load to --host http://192.0.2.10" in res.output
    assert not out.exists()
    res = CliRunner().invoke(load_group, ["run", "--scenario", "ci", "--host", "http://127.0.0.1:9",
                                          "--token", "t", "--s3-endpoint", "http://192.0.2.11:9000"])
    assert res.exit_code == 3 and "--s3-endpoint" in res.output


# --------------------------------------------------------------------------- client logic

def test_retry_decisions() -> None:
    assert [s for s in (0, 200, 201, 400, 401, 404, 408, 409, 422, 429, 500, 502, 503) if is_retryable(s)] \
        == [0, 408, 429, 500, 502, 503]


def test_backoff_is_bounded_by_attempts_and_deadline() -> None:
    b = Backoff(SubmitRetry(max_attempts=4, base_s=0.1, max_backoff_s=0.3, deadline=60))
    delays = [b.next_delay() for _ in range(5)]
    assert all(d is not None and 0 <= d <= 0.3 for d in delays[:3]) and delays[3:] == [None, None]
    # full jitter: the sleep is drawn from [0, cap]; a draw past the deadline gives up
    tight = Backoff(SubmitRetry(max_attempts=100, base_s=1.0, max_backoff_s=1.0, deadline=0.2),
                    rng=random.Random(1))  # first draw 0.134 * 1.0 ... then 0.847
    assert tight.next_delay() is not None and tight.next_delay() is None
    assert tight.gave_up == "deadline"


def test_artifact_refs_from_our_result_and_from_s3_uris() -> None:
    ours = {"bucket": "ml-artifacts", "artifacts_prefix": "artifacts/op1/attempt-2/",
            "files": {"model.npy": {"sha256": "ab"}, "metrics.json": {"sha256": "cd"}},
            "completion_manifest": "artifacts/op1/attempt-2/COMPLETE.json"}
    refs = artifact_refs(ours, "http://127.0.0.1:9000/")
    assert [(r.url, r.sha256) for r in refs] == [
        ("http://127.0.0.1:9000/ml-artifacts/artifacts/op1/attempt-2/metrics.json", "cd"),
        ("http://127.0.0.1:9000/ml-artifacts/artifacts/op1/attempt-2/model.npy", "ab")]
    other = {"model": "s3://b/artifacts/op9/attempt-1/model.npy", "dir": "s3://b/artifacts/op9/"}
    assert [r.url for r in artifact_refs(other, "http://h:1")] == [
        "http://h:1/b/artifacts/op9/attempt-1/model.npy"]
    assert artifact_refs(None, "http://h:1") == [] and artifact_refs({"x": 1}, "http://h:1") == []


def test_ledger_check_finds_repeats_and_cross_mapping() -> None:
    ok = [{"idempotency_key": "k1", "operation_id": "o1"}, {"idempotency_key": "k2", "operation_id": "o2"}]
    assert ledger_check(ok).ok
    bad = ok + [{"idempotency_key": "k1", "operation_id": "o3"}, {"idempotency_key": "k3", "operation_id": "o2"}]
    check = ledger_check(bad)
    assert not check.ok
    assert "1 key(s) acknowledged more than once" in check.detail
    assert "1 key(s) mapped to several operations" in check.detail
    assert "1 operation(s) acknowledged under several keys" in check.detail
