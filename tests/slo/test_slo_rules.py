"""Generated Prometheus rules: structure, window scaling, and the real promtool."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from slo.budget import scaled_window
from slo.cli import slo_group
from slo.durations import format_duration, parse_duration
from slo.rules import TELEMETRY_RUNBOOK, alert_windows, dump_rules, generate_rules
from slo.specs import ENVIRONMENTS, load_specs

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian package prometheus)"
)


def _rules(env: str) -> list[dict]:
    return [r for g in generate_rules(load_specs(env))["groups"] for r in g["rules"]]


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_every_alert_is_annotated_with_its_runbook(env: str) -> None:
    specs = load_specs(env)
    # the absent-data alerts have their own runbook (tests/slo/test_slo_telemetry.py)
    alerts = [r for r in _rules(env) if "alert" in r
              and r["annotations"]["runbook"] != TELEMETRY_RUNBOOK]
    prom_slos = [s for s in specs.slos if s.indicator.prometheus is not None and s.alert_policies]
    assert {a["alert"] for a in alerts} == {s.alert_name for s in prom_slos}
    for a in alerts:
        slo = next(s for s in prom_slos if s.alert_name == a["alert"])
        assert a["annotations"]["runbook"] == f"alert-{slo.name}-burn"
        assert a["annotations"]["runbook_url"] == f"runbooks/alert-{slo.name}-burn.md"
        assert a["labels"]["severity"] in ("page", "ticket")


def test_evidence_only_slis_get_no_rules() -> None:
    specs = load_specs("local")
    labelled = {r["labels"]["slo"] for r in _rules("local") if "slo" in r.get("labels", {})}
    for slo in specs.slos:
        assert (slo.name in labelled) == (slo.indicator.prometheus is not None)


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_burn_windows_scale_with_the_slo_window_and_respect_the_floor(env: str) -> None:
    specs = load_specs(env)
    for slo in specs.slos:
        pairs = alert_windows(slo, specs)
        conditions = [c for p in slo.alert_policies for c in p.conditions]
        assert len(pairs) == len(conditions)
        for (severity, rate, long_w, short_w), cond in zip(pairs, conditions):
            assert (severity, rate) == (cond.severity, cond.burn_rate)
            expected = scaled_window(
                cond.long_window_seconds, slo.window_seconds, specs.rules.min_window_seconds
            )
            assert parse_duration(long_w) == pytest.approx(expected, abs=1)
            assert parse_duration(short_w) >= specs.rules.min_window_seconds
            assert parse_duration(short_w) <= parse_duration(long_w)


def test_alert_thresholds_are_burn_rate_times_budget() -> None:
    specs = load_specs("prod")
    slo = specs.slo("api-availability")
    alert = next(
        r
        for r in _rules("prod")
        if r.get("alert") == slo.alert_name and r["labels"]["severity"] == "page"
    )
    for _, rate, long_w, _ in [w for w in alert_windows(slo, specs) if w[0] == "page"]:
        assert (
            f'ratio_rate{long_w}{{slo="{slo.name}"}} > {rate * slo.error_budget:.12g}'
            in alert["expr"]
        )


def test_cli_writes_the_rule_file(tmp_path: Path) -> None:
    out = tmp_path / "rules" / "slo.yaml"
    result = CliRunner().invoke(slo_group, ["rules", "--env", "prod", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(out.read_text()) == generate_rules(load_specs("prod"))


@needs_promtool
@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_promtool_check_rules(tmp_path: Path, env: str) -> None:
    path = tmp_path / f"{env}.yaml"
    path.write_text(dump_rules(generate_rules(load_specs(env))))
    proc = subprocess.run(
        [PROMTOOL, "check", "rules", str(path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def _expected_alerts(rules: list[dict], name: str, severities: list[str]) -> list[dict]:
    out = []
    for r in rules:
        if r.get("alert") == name and r["labels"]["severity"] in severities:
            out.append({"exp_labels": r["labels"], "exp_annotations": r["annotations"]})
    return out


@needs_promtool
def test_promtool_test_rules_fires_burn_alerts(tmp_path: Path) -> None:
    """Feed synthetic series to the generated local rules: healthy -> silent, burning -> page."""
    specs = load_specs("local")
    rules = generate_rules(specs)
    flat = [r for g in rules["groups"] for r in g["rules"]]
    (tmp_path / "rules.yaml").write_text(dump_rules(rules))
    api, queue = specs.slo("api-availability"), specs.slo("queue-age")
    step = format_duration(specs.rules.evaluation_interval_seconds)
    healthy = 60  # samples before the 5xx start
    short = alert_windows(api, specs)[0][3]
    labels = f'service="{api.service}", slo="{api.name}"'
    tests = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": step,
        "tests": [
            {
                "interval": step,
                "input_series": [
                    {
                        "series": 'haproxy_backend_http_responses_total{proxy="controlplane_api",code="2xx"}',
                        "values": f"0+10x{2 * healthy}",
                    },
                    {
                        "series": 'haproxy_backend_http_responses_total{proxy="controlplane_api",code="5xx"}',
                        "values": f"0x{healthy} 0+10x{healthy}",
                    },
                ],
                "promql_expr_test": [
                    {
                        "expr": f'round(slo:sli_error:ratio_rate{short}{{slo="{api.name}"}}, 0.001)',
                        "eval_time": "9m",
                        "exp_samples": [{"labels": "{" + labels + "}", "value": 0.5}],
                    },
                ],
                "alert_rule_test": [
                    {"eval_time": "4m", "alertname": api.alert_name, "exp_alerts": []},
                    {
                        "eval_time": "9m",
                        "alertname": api.alert_name,
                        "exp_alerts": _expected_alerts(flat, api.alert_name, ["page", "ticket"]),
                    },
                ],
            },
            {
                "interval": step,
                "input_series": [
                    {
                        "series": 'controlplane_queue_age_seconds{queue="default"}',
                        "values": "0+5x100",
                    }
                ],
                "alert_rule_test": [
                    {"eval_time": "20s", "alertname": queue.alert_name, "exp_alerts": []},
                    {
                        "eval_time": "5m",
                        "alertname": queue.alert_name,
                        "exp_alerts": _expected_alerts(flat, queue.alert_name, ["page", "ticket"]),
                    },
                ],
            },
        ],
    }
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    proc = subprocess.run(
        [PROMTOOL, "test", "rules", "tests.yaml"],
        cwd=tmp_path,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout
