"""MLflow's tracking server over its REST API (``/api/2.0/mlflow``), the calls the training
workload's tracking sink needs and nothing more; the ``mlflow`` library is never imported here
(it lives in its own venv, scripts/setup-mlflow.sh).

One boundary for errors: no answer, a timeout, a 5xx or a 429 is :class:`TrackingUnavailable`
(for a write, its outcome is unknown: it may have been committed); any other 4xx is
:class:`TrackingRefused`, with MLflow's ``error_code`` and message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import quote, urlparse

import httpx

ATTEMPT_TAG = "gameday.attempt_id"  # one run per attempt: looked up before any create


class TrackingError(Exception):
    pass


class TrackingUnavailable(TrackingError):
    """Tracking did not answer, or answered 5xx/429: try again later."""


class TrackingRefused(TrackingError):
    """Tracking answered and said no (4xx): trying again cannot help."""

    def __init__(self, call: str, status: int, code: str, message: str) -> None:
        super().__init__(f"{call}: HTTP {status} {code}: {message}")
        self.status, self.code = status, code


class MlflowRest:
    def __init__(self, base_url: str, timeout: float = 3.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        # connect bounded apart: a server that is gone refuses or times out in 1 s
        self._http = httpx.Client(timeout=httpx.Timeout(timeout, connect=min(1.0, timeout)),
                                  transport=transport)

    def close(self) -> None:
        self._http.close()

    @staticmethod
    def _pages(field: str, page: Callable[[str], Any]) -> list[dict[str, Any]]:
        """Every item of a paged MLflow answer: ``page(token)`` until no next_page_token."""
        out: list[dict[str, Any]] = []
        token = ""
        while True:
            got = page(token)
            out += got.get(field) or []
            token = got.get("next_page_token") or ""
            if not token:
                return out

    def _call(self, method: str, path: str, *, json: dict[str, Any] | None = None,
              params: dict[str, str] | None = None, content: bytes | None = None) -> Any:
        call = f"{method} {path}"
        try:
            r = self._http.request(method, self.base_url + path, json=json, params=params,
                                   content=content)
        except httpx.HTTPError as exc:  # refused, reset, timed out: no answer
            raise TrackingUnavailable(f"{call}: {type(exc).__name__}: {exc}") from exc
        if r.status_code >= 500 or r.status_code == 429:
            raise TrackingUnavailable(f"{call}: HTTP {r.status_code}: {r.text[:300]}")
        if r.status_code >= 400:
            try:
                body = r.json()
            except ValueError:
                body = {}
            raise TrackingRefused(call, r.status_code, str(body.get("error_code", "")),
                                  str(body.get("message", r.text[:300])))
        return r.json() if r.content else {}

    def experiment_id(self, name: str) -> str:
        """The experiment called ``name``, created when missing (a concurrent create is fine)."""
        for _ in range(2):
            try:
                got = self._call("GET", "/api/2.0/mlflow/experiments/get-by-name",
                                 params={"experiment_name": name})
                return str(got["experiment"]["experiment_id"])
            except TrackingRefused as exc:
                if exc.code != "RESOURCE_DOES_NOT_EXIST":
                    raise
            try:
                made = self._call("POST", "/api/2.0/mlflow/experiments/create", json={"name": name})
                return str(made["experiment_id"])
            except TrackingRefused as exc:
                if exc.code != "RESOURCE_ALREADY_EXISTS":
                    raise
        raise TrackingUnavailable(f"experiment {name!r}: neither found nor created")

    def runs_tagged(self, experiment_id: str, key: str, value: str) -> list[dict[str, Any]]:
        """Runs of the experiment whose tag ``key`` is ``value``, oldest first, deleted ones too."""
        quoted = value.replace("'", "\\'")
        got = self._call("POST", "/api/2.0/mlflow/runs/search", json={
            "experiment_ids": [experiment_id], "filter": f"tags.`{key}` = '{quoted}'",
            "run_view_type": "ALL", "max_results": 100, "order_by": ["attributes.start_time ASC"]})
        return list(got.get("runs") or [])

    def runs_since(self, experiment_id: str, since_ms: int) -> list[dict[str, Any]]:
        """Every run of the experiment started at or after ``since_ms``, deleted ones too."""
        body = {"experiment_ids": [experiment_id], "run_view_type": "ALL", "max_results": 1000,
                "filter": f"attributes.start_time >= {since_ms}"}
        return self._pages("runs", lambda token: self._call(
            "POST", "/api/2.0/mlflow/runs/search",
            json={**body, "page_token": token} if token else body))

    def create_run(self, experiment_id: str, run_name: str, start_ms: int,
                   tags: dict[str, str]) -> dict[str, Any]:
        got = self._call("POST", "/api/2.0/mlflow/runs/create", json={
            "experiment_id": experiment_id, "run_name": run_name, "start_time": start_ms,
            "tags": [{"key": k, "value": v} for k, v in sorted(tags.items())]})
        return dict(got["run"])

    def log_batch(self, run_id: str, *, metrics: list[dict[str, Any]] | None = None,
                  params: dict[str, str] | None = None) -> None:
        self._call("POST", "/api/2.0/mlflow/runs/log-batch", json={
            "run_id": run_id, "metrics": metrics or [],
            "params": [{"key": k, "value": v} for k, v in sorted((params or {}).items())],
            "tags": []})

    def put_artifact(self, artifact_uri: str, name: str, data: bytes) -> None:
        """Through the server's artifact proxy (``mlflow-artifacts:/<path>``; the server stores it
        where its ``--artifacts-destination`` says); a PUT of the same name replaces it."""
        path = urlparse(artifact_uri).path.lstrip("/")
        self._call("PUT", f"/api/2.0/mlflow-artifacts/artifacts/{quote(path)}/{quote(name)}",
                   content=data)

    def terminate(self, run_id: str, status: str, end_ms: int) -> None:
        self._call("POST", "/api/2.0/mlflow/runs/update",
                   json={"run_id": run_id, "status": status, "end_time": end_ms})

    def get_run(self, run_id: str) -> dict[str, Any]:
        return dict(self._call("GET", "/api/2.0/mlflow/runs/get", params={"run_id": run_id})["run"])

    def metric_history(self, run_id: str, key: str) -> list[dict[str, Any]]:
        params = {"run_id": run_id, "metric_key": key, "max_results": "25000"}
        return self._pages("metrics", lambda token: self._call(
            "GET", "/api/2.0/mlflow/metrics/get-history",
            params={**params, "page_token": token} if token else params))

    def artifacts(self, run_id: str) -> list[str]:
        got = self._call("GET", "/api/2.0/mlflow/artifacts/list", params={"run_id": run_id})
        return sorted(f["path"] for f in got.get("files") or [])
