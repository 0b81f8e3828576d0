"""Telemetry loss: Prometheus (or its scrape path) lost during an experiment.

The objectives that read Prometheus (the expected alerts) are `no data` for that experiment,
never a pass or a number; everything computed from the ledger, request log and store snapshot
keeps its measured verdict; every output says the same; the generated absent-data alerts pass
promtool and fire when their inputs are gone."""

from __future__ import annotations

import json
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from slo.cli import evaluate_cmd
from slo.evaluate import EXIT_OBJECTIVE, EXIT_PASS, evaluate_run
from slo.evidence import PromQuery, PromSeries
from slo.fixtures import ExperimentFixture as X
from slo.report import write_reports
from slo.rules import TELEMETRY_RUNBOOK, dump_rules, generate_rules, input_metrics
from slo.runbooks import RUNBOOK_DIR, Kind, load_runbooks
from slo.specs import ENVIRONMENTS, KNOWN_SLIS, load_specs
from slo.telemetry import (
    PROMETHEUS,
    SLI_SOURCES,
    check_sources,
    needs_prometheus,
    scrape_gaps,
    telemetry_loss,
)

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed")

ALERT = "ApiAvailabilityBurnRate"
LOST = "db-primary-loss"


def _suite(lost: bool, lost_acks: int = 2) -> tuple[X, ...]:
    """Three experiments; Prometheus is down during the middle one only (when `lost`)."""
    return (
        X("api-replica-loss", api_error_seconds=5, alerts={ALERT: 10}, expected_alerts=(ALERT,)),
        X(LOST, api_error_seconds=20, alerts={ALERT: 12}, expected_alerts=(ALERT,),
          lost_acks=lost_acks, telemetry_lost=lost),
        X("node-interruption-checkpoint", interrupted_at_step=50, resume_from_step=40,
          alerts={"ActiveProgressBurnRate": 25}, expected_alerts=("ActiveProgressBurnRate",)),
    )


def _checks(verdict) -> dict[str, object]:
    return {c.id: c for c in verdict.checks}


# --------------------------------------------------------------------------- declared sources


def test_every_sli_and_objective_kind_declares_its_evidence(make_run) -> None:
    assert set(SLI_SOURCES) == set(KNOWN_SLIS)
    verdict = evaluate_run(make_run(*_suite(lost=False)).path)
    for c in verdict.checks:  # KeyError here: a check kind without declared sources
        assert check_sources(c.id), c.id
    prom = {c.id for c in verdict.checks if needs_prometheus(c.id)}
    assert prom == {c.id for c in verdict.checks if ".alert." in c.id}
    # durability never depends on Prometheus
    assert not any(PROMETHEUS in check_sources(c.id) for c in verdict.checks
                   if ".rpo." in c.id or c.id == "sli.submission-durability")


# --------------------------------------------------------------------------- the evaluator


def test_lost_prometheus_in_one_experiment_is_no_data_and_durability_still_decides(
    make_run,
) -> None:
    intact = evaluate_run(make_run(*_suite(lost=False)).path)
    lost = evaluate_run(make_run(*_suite(lost=True)).path)
    before, after = _checks(intact), _checks(lost)
    assert before.keys() == after.keys()

    # the lost experiment: its alert is no data (no number, not scored, not "silent")
    alert = after[f"{LOST}.alert.{ALERT}"]
    assert before[alert.id].status == "pass" and before[alert.id].measured is not None
    assert alert.status == "no_data" and alert.measured is None
    assert alert.message.startswith("no data: Prometheus scraped nothing")
    result = next(e for e in lost.experiments if e.name == LOST)
    assert result.telemetry_lost is not None and result.alerts[0].no_data is not None
    assert not any("stayed silent" in f for f in result.findings)
    assert any("Prometheus evidence lost" in f for f in lost.findings)
    # only that experiment: the others' alerts were measured as before
    assert {e.name for e in lost.experiments if e.telemetry_lost} == {LOST}
    # every objective not computed from Prometheus has exactly the same verdict and number
    for cid, c in after.items():
        if not needs_prometheus(cid):
            assert (c.status, c.measured) == (before[cid].status, before[cid].measured), cid
        elif cid != alert.id:
            assert c.status == before[cid].status == "pass", cid
    # durability was measured from the ledger and the store: 2 acknowledged submissions lost
    rpo = after[f"{LOST}.rpo.acknowledged_submissions"]
    assert (rpo.status, rpo.measured) == ("fail", 2.0)
    assert lost.exit_code == EXIT_OBJECTIVE
    assert f"no data (not scored): {alert.id}" in lost.reason


def test_every_output_says_the_same(make_run) -> None:
    run = make_run(*_suite(lost=True, lost_acks=0))
    out = CliRunner().invoke(evaluate_cmd, [str(run.path)], env={"COLUMNS": "250"})
    verdict = json.loads((run.path / "verdict.json").read_text())
    alert_id = f"{LOST}.alert.{ALERT}"
    # a non-key alert without data is reported, not scored: the gate still passes on the rest
    assert out.exit_code == verdict["exit_code"] == EXIT_PASS, out.output
    assert verdict["result"] in ("pass", "warning")
    row = next(c for c in verdict["checks"] if c["id"] == alert_id)
    assert row["status"] == "no_data" and row["measured"] is None
    assert f"no data (not scored): {alert_id}" in verdict["reason"]
    case = next(c for c in ET.parse(run.path / "junit.xml").iter("testcase")
                if c.get("name") == alert_id)
    skipped = case.find("skipped")
    assert skipped is not None and "Prometheus scraped nothing" in skipped.get("message")
    assert case.find("failure") is None
    md = (run.path / "report.md").read_text()
    html = (run.path / "report.html").read_text()
    assert f"alert {ALERT}: **no data** (Prometheus scraped nothing" in md
    assert "no data</b> (Prometheus scraped nothing" in html
    assert alert_id in out.output and "no data" in out.output


def test_a_key_alert_without_prometheus_evidence_fails_the_gate(make_run, spec_copy) -> None:
    env_file = spec_copy / "env" / "local.yaml"
    doc = yaml.safe_load(env_file.read_text())
    doc["spec"]["gate"]["keyAlerts"] = [ALERT]
    env_file.write_text(yaml.safe_dump(doc))
    intact = evaluate_run(make_run(*_suite(lost=False, lost_acks=0)).path, spec_dir=spec_copy)
    assert intact.exit_code == EXIT_PASS, intact.reason
    run = make_run(*_suite(lost=True, lost_acks=0))
    lost = evaluate_run(run.path, spec_dir=spec_copy)
    alert = _checks(lost)[f"{LOST}.alert.{ALERT}"]
    assert alert.key and alert.status == "fail" and alert.measured is None
    assert alert.message.startswith("no data")
    assert lost.exit_code == EXIT_OBJECTIVE and lost.result == "fail"
    assert f"key objective(s) missed: {alert.id}" in lost.reason
    write_reports(lost, run.path)
    case = next(c for c in ET.parse(run.path / "junit.xml").iter("testcase")
                if c.get("name") == alert.id)
    assert case.find("failure") is not None


def test_an_unknown_key_alert_is_a_spec_error(spec_copy) -> None:
    env_file = spec_copy / "env" / "local.yaml"
    doc = yaml.safe_load(env_file.read_text())
    doc["spec"]["gate"]["keyAlerts"] = ["NoSuchAlert"]
    env_file.write_text(yaml.safe_dump(doc))
    with pytest.raises(Exception, match=r"spec.gate.keyAlerts\[0\].*NoSuchAlert"):
        load_specs("local", spec_copy)


def test_a_failed_alerts_query_loses_every_experiment(make_run) -> None:
    verdict = evaluate_run(make_run(*_suite(lost=False, lost_acks=0),
                                    failed_queries=("alerts",)).path)
    alerts = [c for c in verdict.checks if ".alert." in c.id]
    assert len(alerts) == 3
    assert all(c.status == "no_data" and c.measured is None for c in alerts)
    assert all("prometheus/alerts.json: query failed" in c.message for c in alerts)
    assert all(e.telemetry_lost for e in verdict.experiments)
    assert all(c.status == "pass" for c in verdict.checks if ".rpo." in c.id)


def test_a_failed_drop_counter_query_is_no_count(make_run) -> None:
    verdict = evaluate_run(make_run(failed_queries=("evidence_dropped",)).path)
    dropped = _checks(verdict)["evidence.dropped"]
    assert "drop counter" not in dropped.message


def _scrapes(points: list[float], step: float = 5.0) -> PromQuery:
    return PromQuery(name="scrapes", query="q", step=step, start=0.0, end=1000.0,
                     series=(PromSeries(metric={}, values=tuple((t, 3.0) for t in points)),))


def test_scrape_gaps() -> None:
    every = [float(t) for t in range(0, 1001, 5)]
    assert scrape_gaps(_scrapes(every), 100, 400) == []
    # a missed scrape or two is within the tolerance (3 steps)
    assert scrape_gaps(_scrapes([t for t in every if t not in (200, 205)]), 100, 400) == []
    gap = [t for t in every if not 200 < t < 300]
    assert scrape_gaps(_scrapes(gap), 100, 400) == [(200.0, 300.0)]
    # a window ending inside the gap, and one without any point at all
    assert scrape_gaps(_scrapes(gap), 100, 250) == [(200.0, 250.0)]
    assert scrape_gaps(_scrapes([]), 100, 400) == [(100.0, 400.0)]
    # clipped to the range the collector asked for
    assert scrape_gaps(_scrapes(every), 900, 1500) == []
    lost = telemetry_loss({"scrapes": _scrapes(gap)}, 100, 400)
    assert lost is not None and "100s" in lost.reason
    assert telemetry_loss({}, 100, 400) is None  # older run dirs: nothing says it was lost
    failed = PromQuery(name="scrapes", query="q", series=(), error="connection refused")
    assert "query failed: connection refused" in telemetry_loss({"scrapes": failed}, 0, 1).reason


# --------------------------------------------------------------------------- the rules


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_every_alerting_slo_input_has_absent_data_alerts_with_the_runbook(env: str) -> None:
    specs = load_specs(env)
    rules = [r for g in generate_rules(specs)["groups"] for r in g["rules"] if "alert" in r]
    telemetry = [r for r in rules if r["annotations"]["runbook"] == TELEMETRY_RUNBOOK]
    for slo in specs.slos:
        if slo.indicator.prometheus is None or not slo.alert_policies:
            continue
        assert input_metrics(slo, specs), slo.name
        mine = {r["alert"] for r in telemetry if r["labels"].get("slo") == slo.name}
        assert mine == {"SloInputAbsent", "SloInputScrapeLost"}, slo.name
    assert any(r["alert"] == "TelemetryWatchdog" for r in telemetry)
    for r in telemetry:
        assert r["annotations"]["runbook_url"] == f"runbooks/{TELEMETRY_RUNBOOK}.md"
    runbook = load_runbooks(RUNBOOK_DIR)[TELEMETRY_RUNBOOK]
    assert runbook.kind is Kind.ALERT
    assert {r["alert"] for r in telemetry} <= set(runbook.alerts)


def test_histogram_inputs_are_read_through_their_count_series() -> None:
    specs = load_specs("local")
    slo = specs.slo("scheduling-delay")
    assert slo.indicator.prometheus is not None and slo.indicator.prometheus.histogram
    assert all(m.endswith("_count") for m in input_metrics(slo, specs))


def _render(text: str, job: str) -> str:
    return text.replace("{{ $labels.job }}", job)


@needs_promtool
def test_promtool_fires_the_absent_data_alerts(tmp_path: Path) -> None:
    """The api-availability input is scraped from job haproxy for 10 min, then the job's only
    target fails its scrapes and the metric disappears."""
    specs = load_specs("local")
    group = next(g for g in generate_rules(specs)["groups"] if g["name"] == "slo-telemetry")
    slo = specs.slo("api-availability")
    rules = [r for r in group["rules"] if r["labels"].get("slo") in (None, slo.name)]
    (tmp_path / "rules.yaml").write_text(dump_rules({"groups": [{**group, "rules": rules}]}))
    by_name = {r["alert"]: r for r in rules}
    metric = input_metrics(slo, specs)[0]

    def expected(name: str, **labels: str) -> list[dict]:
        r = by_name[name]
        ann = {k: _render(v, labels.get("job", "")) for k, v in r["annotations"].items()}
        return [{"exp_labels": {**r["labels"], **labels}, "exp_annotations": ann}]

    tests = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                {"series": f'{metric}{{job="haproxy",proxy="api",code="2xx"}}',
                 "values": "0+10x10"},
                {"series": 'up{job="haproxy",instance="lb"}', "values": "1x10 0x40"},
                {"series": 'up{job="api",instance="api-1"}', "values": "1x50"},
            ],
            "alert_rule_test": [
                {"eval_time": "5m", "alertname": "SloInputScrapeLost", "exp_alerts": []},
                {"eval_time": "5m", "alertname": "SloInputAbsent", "exp_alerts": []},
                {"eval_time": "5m", "alertname": "TelemetryWatchdog",
                 "exp_alerts": expected("TelemetryWatchdog")},
                {"eval_time": "15m", "alertname": "SloInputScrapeLost",
                 "exp_alerts": expected("SloInputScrapeLost", job="haproxy")},
                {"eval_time": "15m", "alertname": "SloInputAbsent", "exp_alerts": []},
                # 15 min without a sample, held for 5 min
                {"eval_time": "32m", "alertname": "SloInputAbsent",
                 "exp_alerts": expected("SloInputAbsent")},
            ],
        }],
    }
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    proc = subprocess.run([PROMTOOL, "test", "rules", "tests.yaml"], cwd=tmp_path, check=False,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --------------------------------------------------------------------------- the experiment

EXPERIMENT = Path(__file__).resolve().parents[2] / "chaos" / "experiments" / "telemetry-loss.yaml"


def test_the_telemetry_loss_experiment_validates_and_outlasts_the_liveness_window() -> None:
    from chaos.validate import validate_experiment
    from slo.durations import parse_duration
    from slo.telemetry import DEFAULT_STEP, GAP_STEPS, SCRAPES_PROMQL

    assert validate_experiment(EXPERIMENT) == []
    doc = yaml.safe_load(EXPERIMENT.read_text())
    stop = next(a for a in doc["method"] if a["provider"]["func"] == "stop")
    assert stop["provider"]["arguments"]["target"] == "prometheus"
    # Prometheus must stay down longer than the query's lookback plus the gap tolerance, or
    # prometheus/scrapes.json shows no gap and the loss goes unseen
    window = parse_duration(SCRAPES_PROMQL.split("[")[1].split("]")[0])
    assert stop["pauses"]["after"] > window + GAP_STEPS * DEFAULT_STEP
    assert any(a["provider"]["func"] == "start"
               and a["provider"]["arguments"]["target"] == "prometheus" for a in doc["method"])
