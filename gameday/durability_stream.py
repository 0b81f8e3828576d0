"""The durability stream of `gameday run --durability-stream RATE`: cheap submissions at a
fixed rate through the whole game day, beside the background load, so that the durability
audit (every acknowledged submission present exactly once in the store) has enough events to
demonstrate its objective, not only to be consistent with it: with no loss in n events the
95 % lower bound of the kept share is 0.05 ** (1 / n), so 99.99 % needs 29,956 events
(slo/confidence.py), where the background load acknowledges about 3 a second.

The submissions go to the held queue (controlplane/store/queues.py): committed and
acknowledged like any work, never routed, so they cost the API and the database and need no
agent; the game day's faults hit them like any other (a replica killed, a failover). Each
logical submission is retried with its Idempotency-Key like the background load's (long
enough to ride out a failover, within a retry budget); every HTTP attempt is a request record
(in a file of its own, REQUESTS_FILE) and every acknowledgement a client-ledger line
(loadtests/overload.py OpenLoop, the overload class's open loop, here at a fixed rate). When the stream stops, the held queue's work is
canceled in bulk (it stays in the store for the audit): no later run carries it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from controlplane.store.queues import HELD_QUEUE
from loadtests.overload import OpenLoop, cancel_held, first_project
from loadtests.scenario import SubmitRetry

SOURCE = "durability-stream"
BODY: dict[str, Any] = {"name": "durability-probe", "queue": HELD_QUEUE, "max_retries": 0,
                        "workload": {"image": "127.0.0.1:5000/ml/trainer:1.0"}}
# the background load's retries (loadtests/scenarios/gameday.yaml): a failover's outage is
# ridden out, not abandoned; its budget keeps retries to a tenth of the submissions (plus a
# floor), so an outage is not met with a retry storm
RETRY = SubmitRetry(max_attempts=120, base_s=0.2, max_backoff_s=3.0, deadline=120.0,
                    budget_ratio=0.1, budget_min_per_s=5.0)
MAX_RATE = 1000.0
# Its request records stay apart from requests.jsonl: the stream is a durability probe, not a
# user population, so the availability and latency SLIs stay the background load's (measured:
# at 100/s on a busy 2-core machine the API shed the stream's retries during failovers, 20,000
# refusals that would have been judged as the users' availability). Its acks are audited.
REQUESTS_FILE = "durability-stream-requests.jsonl"


class StreamError(Exception):
    pass


def check_rate(rate: float) -> float:
    if not 0 <= rate <= MAX_RATE:
        raise StreamError(f"--durability-stream: {rate:g} submissions/s is out of range "
                          f"[0, {MAX_RATE:g}] (0: off)")
    return rate


def start(url: str, tokens: dict[str, Any], run_dir: Path, rate: float) -> OpenLoop:
    """Start the stream against ``url`` (refused unless on loopback: loadtests/safety.py) as
    the environment's first project; its acks go where the background load's ledger parts go
    (merged into the ledger when the load stops), its request records to REQUESTS_FILE."""
    first = first_project(tokens)
    if first is None:
        raise StreamError("the durability stream needs a project token (env.json: "
                          "tokens.projects)")
    project, token = first
    loop = OpenLoop(url=url, token=token, rate=check_rate(rate), project=project,
                    requests_path=run_dir / REQUESTS_FILE,
                    ledger_path=run_dir / ".locust" / "parts" / "ledger.durability-stream.jsonl",
                    source=SOURCE, body=dict(BODY), retry=RETRY)
    loop.start()
    return loop


def stop(loop: OpenLoop, adapter: Any) -> dict[str, Any]:
    """Stop the stream (submissions in flight get their answer, no new retries) and cancel
    the held queue's work. The counts, with ``held_canceled`` or ``held_cancel_error``."""
    return {**loop.stop(), **cancel_held(adapter)}
