"""Locust users for `gameday load`. Runs only in its own process (docs/DESIGN.md section 8.3):
`gameday load run` starts it with GAMEDAY_LOAD_CONFIG / GAMEDAY_LOAD_TOKEN set.

Submitter       POST /v1/operations, one fresh Idempotency-Key per logical submission, retried
                with the SAME key on timeout / connection error / 5xx / 429 (backoff with full
                jitter, at least Retry-After, within the process's retry budget);
                every acknowledgement (201 new, 200 duplicate) -> one ledger line, flushed.
Poller          GET one known operation; list with filters, following cursors (bounded).
ArtifactReader  download the artifacts of succeeded operations from the S3 endpoint
                (path-style plain HTTP GET; no boto3 in this process), checksum-verified.
Inferrer        POST a golden-set row to the serving frontend (Open Inference Protocol v2);
                every request -> one inference.jsonl line: status, latency, the version that
                answered, whether the answer was the golden one (docs/serving.md).

Every HTTP request, retries included, becomes one requests.jsonl line (route templates only).
"""

from __future__ import annotations

import hashlib
import json
import random
import time
import uuid
from collections import deque
from typing import Any, ClassVar
from urllib.parse import urlencode

import gevent
from locust import FastHttpUser, between, events, task
from locust.env import Environment
from locust.rpc import Message
from locust.runners import MasterRunner, WorkerRunner

from controlplane.procstate import running
from controlplane.serving.artifact import golden_correct, infer_request
from controlplane.serving.catalog import GOLDEN
from loadtests import routes
from loadtests.client import (
    Backoff,
    RetryBudget,
    SubmitOutcome,
    artifact_refs,
    is_ack,
    is_retryable,
    parse_retry_after,
)
from loadtests.records import PartWriters, utc_iso
from loadtests.runconfig import RunConfig
from loadtests.stats import from_locust
from slo.inference_ledger import InferenceRecord
from slo.ledger import LedgerEntry

CONFIG, TOKEN = RunConfig.from_env()
SCENARIO = CONFIG.scenario
# operation ids this process has seen (acks and listings): what Pollers read
KNOWN_OPS: deque[str] = deque(maxlen=2000)
# one per process, shared by its submitters: retries may add only so much to what it sends
BUDGET = RetryBudget(ratio=SCENARIO.client.submit_retry.budget_ratio,
                     min_per_s=SCENARIO.client.submit_retry.budget_min_per_s)
_state: dict[str, Any] = {"writers": None, "started_at": None}


def _writers() -> PartWriters:
    if _state["writers"] is None:  # lazily: the master runs no users and writes no parts
        _state["writers"] = PartWriters(CONFIG.parts_dir)
    return _state["writers"]


# --------------------------------------------------------------------------- event hooks

@events.request.add_listener
def _record_request(request_type: str, name: str, response_time: float, response: Any,
                    exception: BaseException | None, start_time: float | None = None,
                    **_: Any) -> None:
    status = getattr(response, "status_code", 0) or None
    # `error` only for transport failures (no HTTP answer): a 4xx/5xx is described by status,
    # and the SLI treats error/5xx as "not answered", 4xx as the client's problem.
    error = None
    if status is None:
        error = str(getattr(response, "error", None) or exception or "no response")
    _writers().requests.write({
        "time": utc_iso(start_time), "method": request_type, "route": name,
        "status": status, "error": error, "latency_ms": round(max(response_time, 0.0), 3)})


@events.test_start.add_listener
def _on_test_start(environment: Environment, **_: Any) -> None:
    if isinstance(environment.runner, WorkerRunner):
        return
    _state["started_at"] = utc_iso()
    gevent.spawn(_end_of_run, environment)


def _owner_gone(pid: int | None) -> bool:
    """A background run lasts hours and Locust has its own session: when whoever started it is
    gone (a test session killed hard), nobody will ever touch the stop file."""
    return pid is not None and not running(pid)


def _end_of_run(environment: Environment) -> None:
    """Ends the run after the scenario's duration, or when the stop file appears (background
    mode). Not --run-time: a master's quit() waits only 0.5 s for its workers' final stats.
    Instead each worker is told to quit; it stops its users (stop_timeout), sends its final
    stats, then says "quit", and the last one makes the master stop and quit by itself."""
    deadline = time.monotonic() + SCENARIO.duration
    while (time.monotonic() < deadline and not CONFIG.stop_file.exists()
           and not _owner_gone(CONFIG.owner_pid)):
        gevent.sleep(0.2)
    runner = environment.runner
    if isinstance(runner, MasterRunner):
        for client in list(runner.clients.all):
            runner.server.send_to_client(Message("quit", None, client.id))
        bound = time.monotonic() + SCENARIO.stop_timeout + 15
        while runner.clients.all and time.monotonic() < bound:
            gevent.sleep(0.2)
    if runner is not None:
        runner.quit()


@events.quitting.add_listener
def _write_stats(environment: Environment, **_: Any) -> None:
    runner = environment.runner
    if isinstance(runner, WorkerRunner) or runner is None:
        if _state["writers"] is not None:
            _state["writers"].close()
        environment.process_exit_code = 0  # request failures are data, not a crash
        return
    data = from_locust(runner.stats, started_at=_state["started_at"], ended_at=utc_iso(),
                       exceptions=sum(e["count"] for e in runner.exceptions.values()),
                       user_classes=dict(runner.target_user_classes_count))
    tmp = CONFIG.stats_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2), encoding="utf-8")
    tmp.replace(CONFIG.stats_path)
    if _state["writers"] is not None:
        _state["writers"].close()
    # failures are judged by `gameday load` from the evidence; Locust's own exit code only says
    # whether the run itself worked (docs/DESIGN.md section 8.3: set process_exit_code yourself)
    environment.process_exit_code = 0


# --------------------------------------------------------------------------- users

class _ApiUser(FastHttpUser):
    abstract = True
    network_timeout = SCENARIO.client.request_timeout_s
    connection_timeout = SCENARIO.client.connect_timeout_s
    max_retries = 0  # retries are ours, visible in requests.jsonl, with the same key
    # per request, not default_headers: the API token must never reach the object store
    auth: ClassVar[dict[str, str]] = {"Authorization": f"Bearer {TOKEN}"}

    def _list(self, **params: Any) -> list[dict[str, Any]]:
        query = urlencode({k: v for k, v in params.items() if v is not None})
        with self.client.get(f"{routes.LIST_OPERATIONS}?{query}", name=routes.LIST_OPERATIONS,
                             headers=self.auth, catch_response=True) as resp:
            if resp.status_code != 200:
                resp.failure(f"HTTP {resp.status_code}" if resp.status_code else "no response")
                return []
            try:
                body = resp.json()
                items, cursor = body["items"], body.get("next_cursor")
            except (ValueError, KeyError, TypeError):
                resp.failure("list answer is not {items, next_cursor}")
                return []
        KNOWN_OPS.extend(op["id"] for op in items if isinstance(op, dict) and "id" in op)
        self._cursor = cursor
        return items


class Submitter(_ApiUser):
    wait_time = between(*SCENARIO.users.submitter.wait_s)
    fixed_count = SCENARIO.users.submitter.count

    @task
    def submit(self) -> None:
        template = SCENARIO.operation
        key = f"gameday-load-{uuid.uuid4()}"
        body = template.body(f"{template.name_prefix}-{key[-12:]}")
        backoff = Backoff(SCENARIO.client.submit_retry, budget=BUDGET)
        first = time.time()
        outcome, op_id, last, posts = SubmitOutcome.INTERRUPTED, None, None, 0
        try:
            while True:
                with self.client.post(routes.SUBMIT, json=body, name=routes.SUBMIT,
                                      headers={**self.auth, "Idempotency-Key": key},
                                      catch_response=True) as resp:
                    posts += 1
                    last = resp.status_code
                    retry_after = parse_retry_after(
                        resp.headers.get("Retry-After") if resp.headers else None)
                    if is_ack(last):
                        try:
                            answer = resp.json()
                            op_id, project = str(answer["id"]), str(answer["project"])
                        except (ValueError, KeyError, TypeError):
                            # acknowledged but unreadable: asking again with the key is safe
                            resp.failure(f"HTTP {last} without an operation id")
                        else:
                            # the body is kept to replay it after a database restore
                            _writers().ledger.append([LedgerEntry.now(
                                op_id, key, project, status=last, source="load", request=body)])
                            KNOWN_OPS.append(op_id)
                            outcome = SubmitOutcome.ACKED
                            break
                    elif is_retryable(last):
                        resp.failure(f"HTTP {last}" if last else str(resp.error or "no response"))
                    else:
                        resp.failure(f"HTTP {last}: {resp.text[:200] if resp.text else ''}")
                        outcome = SubmitOutcome.REJECTED
                        break
                delay = backoff.next_delay(retry_after)
                if delay is None:
                    outcome = SubmitOutcome.ABANDONED
                    break
                gevent.sleep(delay)
        finally:
            _writers().submissions.write({
                "idempotency_key": key, "outcome": outcome.value, "operation_id": op_id,
                "attempts": posts, "abandoned_by": backoff.gave_up,
                "last_status": last, "first_at": utc_iso(first), "done_at": utc_iso(),
                "process": _writers().tag})


class Poller(_ApiUser):
    wait_time = between(*SCENARIO.users.poller.wait_s)
    fixed_count = SCENARIO.users.poller.count
    _cursor: str | None = None

    @task(3)
    def get_operation(self) -> None:
        if not KNOWN_OPS:
            self._list(limit=SCENARIO.client.list_page_size)
            return
        op_id = random.choice(KNOWN_OPS)
        with self.client.get(f"/v1/operations/{op_id}", name=routes.GET_OPERATION,
                             headers=self.auth, catch_response=True) as resp:
            if resp.status_code != 200:
                resp.failure(f"HTTP {resp.status_code}" if resp.status_code else "no response")

    @task(1)
    def list_operations(self) -> None:
        state = random.choice([None, "queued", "running", "blocked", "succeeded"])
        self._cursor = None
        for _ in range(SCENARIO.client.list_max_pages):  # bounded pagination
            self._list(state=state, queue=SCENARIO.operation.queue,
                       limit=SCENARIO.client.list_page_size, cursor=self._cursor)
            if not self._cursor:
                break


class ArtifactReader(_ApiUser):
    wait_time = between(*SCENARIO.users.artifact_reader.wait_s)
    fixed_count = SCENARIO.users.artifact_reader.count

    @task
    def download(self) -> None:
        if not CONFIG.s3_endpoint:
            return  # no object store endpoint given: nothing to read
        succeeded = [op for op in self._list(state="succeeded", limit=SCENARIO.client.list_page_size)
                     if op.get("result")]
        refs = [r for op in succeeded[:5] for r in artifact_refs(op["result"], CONFIG.s3_endpoint)]
        if not refs:
            return
        ref = random.choice(refs)
        with self.client.get(ref.url, name=routes.ARTIFACT, catch_response=True) as resp:
            if resp.status_code != 200:
                resp.failure(f"HTTP {resp.status_code}" if resp.status_code else "no response")
            elif ref.sha256 and hashlib.sha256(resp.content or b"").hexdigest() != ref.sha256:
                resp.failure(f"checksum mismatch for {ref.key}")


class Inferrer(FastHttpUser):
    """Predictions through the serving frontend: one golden row a request, never retried (the
    load balancer retries a request a dead replica dropped; what the client sees is the SLI)."""

    wait_time = between(*SCENARIO.users.inferrer.wait_s)
    fixed_count = SCENARIO.users.inferrer.count
    network_timeout = SCENARIO.client.request_timeout_s
    connection_timeout = SCENARIO.client.connect_timeout_s
    max_retries = 0

    @task
    def infer(self) -> None:
        if not CONFIG.serving_endpoint or not CONFIG.serving_model:
            return  # the environment serves no model
        row = list(random.choice(GOLDEN.inputs))
        body = infer_request(row)
        url = f"{CONFIG.serving_endpoint}/v2/models/{CONFIG.serving_model}/infer"
        started = time.time()
        version, correct, error = None, None, None
        with self.client.post(url, json=body, name=routes.INFER, catch_response=True) as resp:
            status = resp.status_code or None
            if status is None:
                error = str(resp.error or "no response")
                resp.failure(error)
            elif status != 200:
                resp.failure(f"HTTP {status}")
            else:
                try:
                    answer = resp.json()
                    version = (resp.headers.get("x-model-version") if resp.headers else None) \
                        or answer.get("model_version")
                    correct = golden_correct(GOLDEN, row, float(answer["outputs"][0]["data"][0]))
                except (ValueError, KeyError, IndexError, TypeError):
                    correct = False
                    resp.failure("answer is not a v2 inference response")
        _writers().inference.write(InferenceRecord(
            time=utc_iso(started), status=status, error=error,
            latency_ms=round((time.time() - started) * 1000.0, 3), version=version,
            correct=correct).model_dump(mode="json"))
