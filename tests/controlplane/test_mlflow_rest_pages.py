"""The REST client reads every page of MLflow's paged answers (runs/search, get-history): the
tracking invariants count runs and metric points from them, so a page left unread would read
as points lost."""

from __future__ import annotations

import json

import httpx

from controlplane.workload.mlflow_rest import MlflowRest


def _paged(field: str, pages: list[list[dict[str, str]]], seen: list[str]) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        token = (json.loads(request.content).get("page_token") if request.method == "POST"
                 else request.url.params.get("page_token")) or ""
        seen.append(token)
        n = int(token or 0)
        body: dict[str, object] = {field: pages[n]}
        if n + 1 < len(pages):
            body["next_page_token"] = str(n + 1)
        return httpx.Response(200, json=body)
    return httpx.MockTransport(handler)


def test_runs_since_reads_every_page() -> None:
    seen: list[str] = []
    pages = [[{"id": "a"}, {"id": "b"}], [{"id": "c"}], [{"id": "d"}]]
    client = MlflowRest("http://127.0.0.1:1", transport=_paged("runs", pages, seen))
    assert [r["id"] for r in client.runs_since("0", 5)] == ["a", "b", "c", "d"]
    assert seen == ["", "1", "2"]


def test_metric_history_reads_every_page() -> None:
    seen: list[str] = []
    pages = [[{"step": "0"}], [{"step": "1"}, {"step": "2"}]]
    client = MlflowRest("http://127.0.0.1:1", transport=_paged("metrics", pages, seen))
    assert [m["step"] for m in client.metric_history("r", "loss")] == ["0", "1", "2"]
    assert seen == ["", "1"]
