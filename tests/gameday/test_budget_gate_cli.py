"""`gameday run|gate --budget-check`: a game day whose touched SLOs are below the budget floor
(or have no data) is skipped before anything starts, with a record in the run directory and
the archive; `--force` goes ahead and says so. No game day runs here: every path below ends
before the first experiment (the skip itself, a dry run, or a refused cloud target)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from gameday.cli import main
from gameday.run import EXIT_REFUSED
from gameday.suites import SUITES, load_experiment
from slo.budget_gate import EXIT_SKIPPED
from slo.rules import window_error_ratio_query
from slo.specs import load_specs
from tests.slo.prom_stub import PromStub, serving


def _run(*args: str, home: Path, **env: str) -> tuple[int, str]:
    r = CliRunner().invoke(main, list(args), env={"GAMEDAY_HOME": str(home), **env},
                           terminal_width=200)
    return r.exit_code, " ".join(r.output.split())  # rich wraps at 80 columns


def _touched(env: str, suite: str) -> set[str]:
    """What the ci suite's experiments are judged against (x-gameday + recovery objective)."""
    specs = load_specs(env)
    out: set[str] = set()
    for name in SUITES[suite]:
        g = load_experiment(name).gameday
        out |= set(g.get("slos") or []) | set(specs.recovery_objectives[g["recovery_objective"]].slos)
    return out


def test_no_archived_data_skips_with_a_record_and_history_shows_it(tmp_path: Path) -> None:
    runs, archive = tmp_path / "runs", tmp_path / "archive"
    code, out = _run("gate", "--budget-check", "--runs-dir", str(runs), "--archive",
                     str(archive), home=tmp_path)
    assert code == EXIT_SKIPPED, out
    assert "skipped" in out and "no data" in out and "nothing was started" in out
    (run_dir,) = runs.iterdir()
    assert sorted(p.name for p in run_dir.iterdir()) == ["skipped.json"]  # no verdict
    record = json.loads((run_dir / "skipped.json").read_text())
    assert {b["slo"] for b in record["budgets"]} == _touched("local", "ci")
    assert {b["status"] for b in record["budgets"]} == {"no data"}
    assert record["floor"] == load_specs("local").gate.min_remaining_budget
    assert record["source"] == f"archive {archive}" and record["forced"] is False
    r = CliRunner().invoke(main, ["history", "--archive", str(archive), "--json"])
    (entry,) = json.loads(r.output)
    assert (entry["run_id"], entry["result"], entry["exit_code"]) == (
        run_dir.name, "skipped", EXIT_SKIPPED)
    assert entry["score"] is None and entry["objectives"] == []
    # a second skip in the same second gets its own run id and archive entry
    _run("gate", "--budget-check", "--runs-dir", str(runs), "--archive", str(archive),
         home=tmp_path)
    assert len(list(runs.iterdir())) == 2


def test_without_budget_check_no_budget_is_read(tmp_path: Path) -> None:
    code, out = _run("gate", "--dry-run", "--runs-dir", str(tmp_path / "runs"),
                     "--archive", str(tmp_path / "archive"), home=tmp_path)
    assert code == 0 and "error-budget gate" not in out


def test_force_goes_ahead_and_says_so(tmp_path: Path) -> None:
    code, out = _run("gate", "--budget-check", "--force", "--dry-run", "--runs-dir",
                     str(tmp_path / "runs"), "--archive", str(tmp_path / "archive"),
                     home=tmp_path)
    assert code == 0, out
    assert "a live run would go ahead (forced)" in out and not (tmp_path / "runs").exists()


# ---------------------------------------------------- a cloud env reads Prometheus


@pytest.fixture
def prom() -> Iterator[PromStub]:
    with serving() as p:
        yield p


def _target(tmp_path: Path, prometheus: str) -> Path:
    target = tmp_path / "target.json"
    target.write_text(json.dumps({
        "environment": "staging", "region": "eu-west-1", "project": "mlplatform",
        "stack": "staging", "artifactBucket": "b", "controlPlaneNamespace": "mlp-controlplane",
        "apiUrl": "http://127.0.0.1:9", "prometheusUrl": prometheus,
        "workloadImage": "127.0.0.1:5000/ml/trainer:1.0", "platformProject": "gameday"}))
    return target


def test_cloud_budget_from_prometheus_skips_below_floor_and_force_goes_on(
        tmp_path: Path, prom: PromStub) -> None:
    specs = load_specs("staging")
    touched = _touched("staging", "ci")
    tracked = sorted(n for n in touched if window_error_ratio_query(specs.slo(n), specs))
    assert tracked, "the ci suite touches SLOs with Prometheus rules"
    floor = specs.gate.min_remaining_budget
    # every tracked SLO has half its budget left except the first: less than the floor
    prom.answers = {n: str((1 - specs.slo(n).objective.target) * 0.5) for n in tracked}
    low = tracked[0]
    prom.answers[low] = str((1 - specs.slo(low).objective.target) * (1 - floor / 2))
    args = ["gate", "--env", "staging", "--target", str(_target(tmp_path, prom.url)),
            "--budget-check", "--runs-dir", str(tmp_path / "runs"),
            "--archive", str(tmp_path / "archive")]
    env = {"KUBECONFIG": str(tmp_path / "no-kubeconfig")}
    code, out = _run(*args, home=tmp_path, **env)
    assert code == EXIT_SKIPPED, out
    (run_dir,) = (tmp_path / "runs").iterdir()
    record = json.loads((run_dir / "skipped.json").read_text())
    status = {b["slo"]: b["status"] for b in record["budgets"]}
    assert status[low] == "below floor"
    assert all(status[n] == "ok" for n in tracked if n != low)
    assert all(status[n] == "not tracked" for n in touched - set(tracked))
    assert record["source"] == f"prometheus {prom.url}"

    # forced: not skipped; it goes on to the cloud environment, which refuses this target
    # (no credentials, no cluster) before anything is touched
    code, out = _run(*args, "--force", home=tmp_path, **env)
    assert code == EXIT_REFUSED and "forced" in out, out
    assert len(list((tmp_path / "runs").iterdir())) == 1  # no new skip record

    # the series absent: no data, skipped, never "budget fine"
    prom.answers = {}
    code, out = _run(*args, home=tmp_path, **env)
    assert code == EXIT_SKIPPED and "no data" in out


# ---------------------------------------------- the runner's fault timeline metrics


def test_metrics_off_with_port_0_and_a_busy_port_does_not_stop_the_run(tmp_path: Path) -> None:
    import io
    import socket

    from rich.console import Console

    from gameday.run import Options, _serve_fault_metrics

    out = io.StringIO()
    console = Console(file=out, width=200)
    timeline = tmp_path / "faults.jsonl"
    assert _serve_fault_metrics(Options(metrics_port=0), "r", timeline, 0.0, console) is None
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        got = _serve_fault_metrics(Options(metrics_port=port), "r", timeline, 0.0, console)
    assert got is None and f"not served on 127.0.0.1:{port}" in out.getvalue()
    free = _serve_fault_metrics(Options(metrics_port=port), "r", timeline, 0.0, console)
    assert free is not None and free.url == f"http://127.0.0.1:{port}/metrics"
    free.close()


def test_two_environments_game_days_each_serve_and_announce_their_own_port(tmp_path: Path) -> None:
    """The default for a local environment: a free port, listed in that environment's targets
    file while the run serves and withdrawn after. Two game days at once (two environments on
    one machine, the test suite's two workers) both serve; with one fixed port the second
    was refused and each Prometheus scraped whichever run held it."""
    import io

    import httpx
    from rich.console import Console

    from gameday.run import Options, _serve_fault_metrics

    console = Console(file=io.StringIO(), width=200)
    files = [tmp_path / "a-targets.json", tmp_path / "b-targets.json"]
    servers = [_serve_fault_metrics(Options(), run_id, tmp_path / "faults.jsonl", 0.0, console,
                                    targets)
               for run_id, targets in (("run-a", files[0]), ("run-b", files[1]))]
    try:
        assert all(s is not None for s in servers), console.file.getvalue()
        ports = [s.port for s in servers if s is not None]
        assert len(set(ports)) == 2
        for targets, port, run_id in zip(files, ports, ("run-a", "run-b"), strict=True):
            assert json.loads(targets.read_text()) == [{"targets": [f"127.0.0.1:{port}"]}]
            body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            assert f'gameday_run_info{{env="local",run_id="{run_id}"' in body
    finally:
        for s in servers:
            if s is not None:
                s.close()
    assert [json.loads(f.read_text()) for f in files] == [[], []]  # withdrawn: no game day


def test_an_explicit_port_is_the_one_announced(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from environments.local.ports import reserve_port
    from gameday.run import Options, _serve_fault_metrics

    port = reserve_port()
    targets = tmp_path / "targets.json"
    server = _serve_fault_metrics(Options(metrics_port=port), "r", tmp_path / "faults.jsonl", 0.0,
                                  Console(file=io.StringIO()), targets)
    assert server is not None and server.port == port
    try:
        assert json.loads(targets.read_text()) == [{"targets": [f"127.0.0.1:{port}"]}]
    finally:
        server.close()
