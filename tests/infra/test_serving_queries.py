"""The PromQL the serving layer runs (the canary analysis, KEDA's trigger), taken from the rendered
program and evaluated by the real Prometheus rule engine (`promtool test rules`) on series made
for it: the canary's figures must come from the canary's pods only."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.infra.harness import Run

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian "
                                "package prometheus, scripts/setup.sh installs it)")
CANARY, STABLE = "model-server-6d5f7c9b8-abcde", "model-server-58c4b6f7d-fghij"
NS = "mlp-serving"


def _queries(run: Run) -> dict[str, str]:
    """metric name -> query, as the rendered objects carry them, with the canary hash Argo
    substitutes for ``{{args.canary-hash}}``."""
    found: dict[str, str] = {}
    for r in run.k8s_objects():
        if r.props["kind"] == "AnalysisTemplate":
            for m in r.props["spec"]["metrics"]:
                if "prometheus" in m["provider"]:
                    found[m["name"]] = m["provider"]["prometheus"]["query"]
        elif r.props["kind"] == "ScaledObject":
            found["request-rate"] = r.props["spec"]["triggers"][0]["metadata"]["query"]
    return {k: q.replace("{{args.canary-hash}}", "6d5f7c9b8") for k, q in found.items()}


def _series(pod: str, errors_per_min: int, ok_per_min: int, slow: bool) -> list[dict[str, str]]:
    labels = f'namespace="{NS}", pod="{pod}", model_name="fraud-score"'
    out = [{"series": f'model_server_requests_total{{{labels}, code="500"}}',
            "values": f"0+{errors_per_min}x10"},
           {"series": f'model_server_requests_total{{{labels}, code="200"}}',
            "values": f"0+{ok_per_min}x10"}]
    # every request in the 0.5 s bucket (slow) or the 0.05 s one
    for le in ("0.05", "0.5", "+Inf"):
        n = errors_per_min + ok_per_min
        out.append({"series": f'request_predict_seconds_bucket{{{labels}, le="{le}"}}',
                    "values": f"0+{0 if slow and le == '0.05' else n}x10"})
    out.append({"series": f"request_predict_seconds_count{{{labels}}}",
                "values": f"0+{errors_per_min + ok_per_min}x10"})
    return out


def _promtool(tmp_path: Path, queries: dict[str, str], expected: dict[str, Any]) -> subprocess.CompletedProcess:
    rules = {"groups": [{"name": "serving", "rules": [
        {"record": f"serving:{name.replace('-', '_')}", "expr": q} for name, q in queries.items()]}]}
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    tests = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        # the canary: 6 errors and 54 answers a minute, slow; a stable pod: many errors, fast
        "input_series": _series(CANARY, 6, 54, slow=True) + _series(STABLE, 300, 300, slow=False),
        "promql_expr_test": [{"expr": f"serving:{name.replace('-', '_')}", "eval_time": "5m",
                              "exp_samples": [{"labels": labels, "value": value}]}
                             for name, (labels, value) in expected.items()]}]}
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests))
    return subprocess.run([str(PROMTOOL), "test", "rules", "tests.yml"], cwd=tmp_path, check=False,
                          capture_output=True, text=True, timeout=60)


def test_canary_figures_come_from_the_canary_pods_only(runs: dict[str, Run], tmp_path: Path) -> None:
    queries = _queries(runs["dev"])
    assert set(queries) == {"error-ratio", "p99-latency", "request-rate"}
    expected = {
        "error-ratio": ("serving:error_ratio", 0.1),  # 6 of 60 a minute, the stable pod's 50 % left out
        "p99-latency": ("serving:p99_latency", 0.4955),  # all in (0.05, 0.5]: 99th percentile by interpolation
        # the autoscaler counts every replica's answers: (60 + 600) a minute
        "request-rate": ("serving:request_rate", 11),
    }
    result = _promtool(tmp_path, queries, expected)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_query_that_reads_every_pod_is_caught(runs: dict[str, Run], tmp_path: Path) -> None:
    """The same test fails when the error ratio forgets the canary's pod filter."""
    queries = _queries(runs["dev"])
    queries["error-ratio"] = queries["error-ratio"].replace(', pod=~"model-server-6d5f7c9b8-.*"', "")
    result = _promtool(tmp_path, {"error-ratio": queries["error-ratio"]},
                       {"error-ratio": ("serving:error_ratio", 0.1)})
    assert result.returncode != 0 and "serving:error_ratio" in result.stdout + result.stderr
