"""The sample training job as a Prefect 3 flow (runs in ``.venv-prefect``, never in the harness).

It wraps ``controlplane.workload`` unchanged: same parameters (steps, checkpoint_every, seed,
step_delay, ...), same deterministic numpy model, same manifest-last layout on the environment's
S3 store (docs/CONTRACTS.md section 3), keyed by the **flow run id** as the operation id and
Prefect's ``run_count`` as the attempt number::

    checkpoints/<flow_run_id>/attempt-<run_count>/step-<%08d>/... + MANIFEST.json (last)
    artifacts/<flow_run_id>/attempt-<run_count>/{model.npy,metrics.json} + COMPLETE.json (last)

The workload's ``@event {json}`` lines (progress, checkpoint_started/written, resumed,
artifact_written ...) are sent as Prefect run logs, so the adapter rebuilds the same event
timeline from Prefect's own log API: what Prefect drops (e.g. during an API outage) is missing
from the evidence exactly as it is missing for a Prefect user.

Deployed by ``environments.local.prefect.deploy`` with the module-path entrypoint
``platforms.prefect_flow.gameday_train`` (the project is installed ``--no-deps -e`` into
``.venv-prefect``, so no code download or pull step is needed, and no Docker).
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
from typing import Any

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

ENTRYPOINT = "platforms.prefect_flow.gameday_train"


class LogStream(io.TextIOBase):
    """stdout -> Prefect run logger, one log record per line (the workload flushes per line)."""

    def __init__(self, logger: Any) -> None:
        self.logger = logger
        self.buf = ""
        self.lock = threading.Lock()

    def write(self, s: str) -> int:
        with self.lock:
            self.buf += s
            while "\n" in self.buf:
                line, self.buf = self.buf.split("\n", 1)
                if line.strip():
                    self.logger.info(line)
        return len(s)

    def flush(self) -> None:
        with self.lock:
            if self.buf.strip():
                self.logger.info(self.buf)
            self.buf = ""


@flow(name="gameday-train", retries=0, persist_result=False, log_prints=False)
def gameday_train(steps: int = 40, checkpoint_every: int = 10, seed: int = 7,
                  step_delay: float = 0.05, batch_size: int = 32, learning_rate: float = 0.01,
                  checkpoint_commit_delay: float = 0.0,
                  s3_endpoint: str | None = None, bucket: str = "ml-artifacts") -> dict[str, Any]:
    from controlplane import storage
    from controlplane.workload.events import emit
    from controlplane.workload.model import TrainConfig
    from controlplane.workload.run import RunContext, train

    logger = get_run_logger()
    operation_id = str(flow_run.id)
    attempt = int(flow_run.run_count or 1)
    stream = LogStream(logger)
    with contextlib.redirect_stdout(stream):
        # which environment component runs this attempt (the fault injector's target)
        emit("log", f"attempt {attempt} started", agent_name=os.environ.get("GAMEDAY_COMPONENT", ""),
             pid=os.getpid(), attempt=attempt)
        config = TrainConfig(steps=steps, checkpoint_every=checkpoint_every, seed=seed,
                             batch_size=batch_size, learning_rate=learning_rate)
        store = storage.ObjectStore.from_config(storage.StorageConfig(
            endpoint_url=s3_endpoint or os.environ.get("S3_ENDPOINT_URL"), bucket=bucket))
        store.ensure_bucket()
        metrics = train(RunContext(operation_id, attempt, store, step_delay=step_delay,
                                   checkpoint_commit_delay=checkpoint_commit_delay), config)
        stream.flush()
    return {**metrics, "artifacts_prefix": storage.artifact_prefix(operation_id, attempt),
            "attempt": attempt}
