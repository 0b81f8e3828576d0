"""`gameday cost report` against a run directory (the game-day evidence fixture with a
hand-written store snapshot) and against a real PostgreSQL store (the session's migrated
template database, tests/conftest.py), plus the report's Cost section and its independence
from the gate."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from gameday.cli import main
from slo.evaluate import evaluate_run
from slo.fixtures import FixtureSpec, build_run
from slo.report import render_html, render_markdown
from slo.specs import SPEC_DIR, load_specs

# the packaged example prices: cpu m6i.xlarge 0.192 $/node-h with 4 vCPUs, gpu p4d.24xlarge
# 32.77 $/node-h with 96 vCPUs and 8 accelerators (a spot pool)
CPU_H, GPU_H = 0.192, 32.77


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat()


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def seeded_run(tmp_path: Path) -> tuple[Path, float, float]:
    """A game-day run dir whose snapshot holds: op-a on gpu (2 accelerators, 0.25 node) lost
    after 60 s (a spot interruption, progress until 30 s), retried and succeeded in 60 s;
    op-b on cpu (2 vCPUs, 0.5 node) failed after 30 s. Agents: one gpu node with 8
    accelerators, one cpu node with 4 vCPUs."""
    run = tmp_path / "run"
    build_run(run, FixtureSpec(submissions=5))
    info = json.loads((run / "run.json").read_text())
    t0 = datetime.fromisoformat(info["started_at"]).timestamp()
    t1 = datetime.fromisoformat(info.get("snapshot_at") or info["ended_at"]).timestamp()
    snap = run / "snapshot"
    op = {"project": "team-a", "created_at": _iso(t0), "queue": "default",
          "workload": {"kind": "train"}}
    _jsonl(snap / "operations.jsonl", [
        {**op, "id": "op-a", "state": "succeeded",
         "resources": {"cpu": 1, "accelerator": {"type": "sim-a100", "count": 2}}},
        {**op, "id": "op-b", "state": "failed", "resources": {"cpu": 2, "accelerator": None}},
    ])
    att = {"created_at": _iso(t0)}
    _jsonl(snap / "attempts.jsonl", [
        {**att, "id": "a1", "operation_id": "op-a", "number": 1, "state": "lost",
         "agent_name": "gpu-1", "started_at": _iso(t0), "finished_at": _iso(t0 + 60)},
        {"id": "a2", "operation_id": "op-a", "number": 2, "state": "succeeded",
         "agent_name": "gpu-1", "created_at": _iso(t0 + 60), "started_at": _iso(t0 + 60),
         "finished_at": _iso(t0 + 120)},
        {**att, "id": "b1", "operation_id": "op-b", "number": 1, "state": "failed",
         "agent_name": "cpu-1", "started_at": _iso(t0), "finished_at": _iso(t0 + 30)},
    ])
    _jsonl(snap / "events.jsonl", [
        {"operation_id": "op-a", "attempt_id": "a1", "time": _iso(t0 + 30), "kind": "progress"},
        {"operation_id": "op-a", "attempt_id": "a1", "time": _iso(t0 + 60),
         "kind": "lease_expired"},
    ])
    _jsonl(snap / "agents.jsonl", [
        {"name": "gpu-1", "pool": "gpu", "accelerator_count": 8, "cpu_slots": 96},
        {"name": "cpu-1", "pool": "cpu", "accelerator_count": 0, "cpu_slots": 4},
    ])
    return run, t0, t1


def test_report_from_run_dir(tmp_path: Path) -> None:
    run, t0, t1 = seeded_run(tmp_path)
    res = CliRunner().invoke(main, ["cost", "report", "--run-dir", str(run), "--json"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.output)
    gpu_attempt = 60 / 3600 * 0.25 * GPU_H  # one minute of a quarter node
    assert s["complete"] is True
    assert s["operations_completed"] == 1 and s["operations_not_completed"] == 1
    assert s["cost_per_completed_operation"] == pytest.approx(2 * gpu_attempt)
    assert s["retry_cost"] == pytest.approx(gpu_attempt)
    assert s["retry_share"] == pytest.approx(0.5)
    assert s["lost_cost"] == pytest.approx(gpu_attempt)
    assert s["not_completed_cost"] == pytest.approx(30 / 3600 * 0.5 * CPU_H)
    window_h = (t1 - t0) / 3600
    assert s["allocated_cost"] == pytest.approx(window_h * (GPU_H + CPU_H))
    # 2 accelerators held 60 s twice; progress 30 s (lost) + 60 s (succeeded)
    assert s["held_accelerator_hours"] == pytest.approx(2 * 120 / 3600)
    assert s["progress_accelerator_hours"] == pytest.approx(2 * 90 / 3600)
    assert s["idle_accelerator_hours"] == pytest.approx(8 * window_h - 2 * 90 / 3600)
    assert s["per_pipeline"].startswith("not applicable")
    text = CliRunner().invoke(main, ["cost", "report", "--run-dir", str(run)])
    assert text.exit_code == 0
    assert "gpu" in text.output and "spot" in text.output and "declared" in text.output


def test_unpriced_pool_from_run_dir(tmp_path: Path) -> None:
    run, _, _ = seeded_run(tmp_path)
    prices = tmp_path / "prices.yaml"
    prices.write_text("currency: EUR\nsource: test\npools:\n  cpu: {instance_type: c,"
                      " capacity_type: on-demand, price_per_hour: 1, vcpus_per_node: 4}\n")
    res = CliRunner().invoke(main, ["cost", "report", "--run-dir", str(run), "--prices",
                                    str(prices)])
    assert res.exit_code == 0, res.output
    assert "unpriced: 2 attempt(s): pool 'gpu' is not in the price table" in res.output
    assert "not claimed (unpriced)" in res.output
    data = json.loads(CliRunner().invoke(main, ["cost", "report", "--run-dir", str(run),
                                                "--prices", str(prices), "--json"]).output)
    assert data["complete"] is False and data["cost_per_completed_operation"] is None
    assert data["not_completed_cost"] == pytest.approx(30 / 3600 * 0.5)  # cpu is priced


@pytest.mark.parametrize(("args", "code", "message"), [
    ([], 2, "exactly one of --run-dir and --dsn"),
    (["--run-dir", "RUN", "--dsn", "postgresql://x"], 2, "exactly one"),
    (["--run-dir", "RUN", "--since", "2025-01-01"], 2, "--since applies to --dsn only"),
    (["--run-dir", "RUN", "--prices", "BAD"], 1, "field pools.cpu.vcpus_per_node"),
    (["--run-dir", "MISSING"], 1, "run directory does not exist"),
])
def test_errors(tmp_path: Path, args: list[str], code: int, message: str) -> None:
    run, _, _ = seeded_run(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_text("currency: USD\nsource: x\npools:\n  cpu: {instance_type: c,"
                   " capacity_type: spot, price_per_hour: 1}\n")
    subst = {"RUN": str(run), "BAD": str(bad), "MISSING": str(tmp_path / "nope")}
    res = CliRunner().invoke(main, ["cost", "report", *[subst.get(a, a) for a in args]])
    assert res.exit_code == code, res.output
    assert message in res.output


def test_report_has_cost_section_and_gate_ignores_it(tmp_path: Path) -> None:
    run, _, _ = seeded_run(tmp_path)
    verdict = evaluate_run(run)
    assert verdict.cost is not None and verdict.cost_error is None
    md = render_markdown(verdict)
    assert "## Cost" in md
    assert f"| cost per completed operation (its attempts, retries included) | " \
           f"{verdict.cost.cost_per_completed_operation:,.6f} USD |" in md
    assert 'id="cost"' in render_html(verdict, load_specs("local"))
    # a broken price table is said, and changes nothing of the gate
    specs = tmp_path / "specs"
    import shutil

    shutil.copytree(SPEC_DIR, specs)
    (specs / "prices.yaml").write_text("currency: USD\nsource: x\npools: {}\n")
    broken = evaluate_run(run, spec_dir=specs)
    assert broken.cost is None
    assert broken.cost_error is not None and "prices.yaml: field pools" in broken.cost_error
    assert (broken.exit_code, broken.result, broken.score) == \
        (verdict.exit_code, verdict.result, verdict.score)
    assert "prices.yaml: field pools" in render_markdown(broken)


def test_report_from_live_store(pg_dsn: str) -> None:
    """The same figures from a real control-plane database, read in a READ ONLY transaction."""
    import psycopg

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO projects (name) VALUES ('team-a');"
                     "INSERT INTO queues (name) VALUES ('default');"
                     "INSERT INTO agents (name, pool, zone, region, cpu_slots, accelerator_type,"
                     " accelerator_count, registered_at) VALUES ('gpu-1', 'gpu', 'z', 'r', 96,"
                     " 'a100', 8, now() - interval '1 hour')")
        conn.execute(
            "INSERT INTO operations (id, project_id, idempotency_key, payload_hash, name, queue,"
            " spec, state, max_retries, timeout_seconds, created_at)"
            " SELECT '00000000-0000-0000-0000-00000000000a', id, 'k', 'h', 'op', 'default',"
            " '{\"resources\": {\"cpu\": 1, \"accelerator\": {\"type\": \"a100\", \"count\": 2}}}',"
            " 'succeeded', 3, 3600, now() - interval '30 minutes' FROM projects")
        for number, state, start, end in ((1, "lost", 30, 20), (2, "succeeded", 20, 10)):
            conn.execute(
                "INSERT INTO attempts (operation_id, number, agent_id, state, lease_expires_at,"
                " created_at, started_at, finished_at)"
                " SELECT '00000000-0000-0000-0000-00000000000a', %s, id, %s, now(),"
                " now() - make_interval(mins => %s), now() - make_interval(mins => %s),"
                " now() - make_interval(mins => %s) FROM agents",
                (number, state, start, start, end))
        before = conn.execute("SELECT count(*) FROM attempts").fetchone()
    res = CliRunner().invoke(main, ["cost", "report", "--json", "--since",
                                    "2000-01-01T00:00:00+00:00"], env={"GAMEDAY_COST_DSN": pg_dsn})
    assert res.exit_code == 0, res.output
    s = json.loads(res.output)
    attempt = 10 / 60 * 0.25 * GPU_H  # ten minutes of a quarter p4d node each
    assert s["complete"] is True
    assert s["cost_per_completed_operation"] == pytest.approx(2 * attempt)
    assert s["retry_cost"] == pytest.approx(attempt) and s["lost_cost"] == pytest.approx(attempt)
    # the agent registered an hour ago: allocated from then, not from --since
    assert s["allocated_accelerator_hours"] == pytest.approx(8.0, rel=0.01)
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM attempts").fetchone() == before
