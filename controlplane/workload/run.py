"""The sample workload's lifecycle: resume -> train -> checkpoint every N steps -> artifacts."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import numpy as np

from controlplane import defects, storage
from controlplane.workload import model
from controlplane.workload.events import emit


@dataclass(frozen=True)
class RunContext:
    operation_id: str
    attempt: int
    store: storage.ObjectStore
    step_delay: float = 0.0  # seconds per step: lets tests interrupt a run mid-way
    checkpoint_commit_delay: float = 0.0  # files written, manifest not yet: a torn window
    # a pipeline step: the input digests it consumed (verified by workload/steps.py), recorded
    # in COMPLETE.json; None outside pipelines
    inputs: list[str] | None = None


def resume_state(ctx: RunContext, config: model.TrainConfig) -> model.TrainState:
    """The state of the newest complete checkpoint of the operation, or a fresh one."""
    loaded, torn = storage.latest_complete_checkpoint(ctx.store, ctx.operation_id)
    for skipped in torn:
        emit("checkpoint_skipped_torn", f"skipped torn checkpoint {skipped.ref.prefix}: {skipped.reason}",
             prefix=skipped.ref.prefix, step=skipped.ref.step, reason=skipped.reason)
    if loaded is None:
        return model.init_state(config)
    state = model.deserialize(loaded.files, config)
    emit("resumed", f"resumed from step {state.step} ({loaded.ref.prefix})",
         from_step=state.step, prefix=loaded.ref.prefix)
    return state


def pause_reporter(key: str, attempt: int, error: Exception) -> None:
    if attempt == 1 or attempt % 10 == 0:
        emit("log", f"object storage unavailable, pausing ({key}, try {attempt}): {error}",
             storage_unavailable=True, key=key, tries=attempt)


def _finish(ctx: RunContext, weights: bytes, metrics: dict[str, object]) -> None:
    """Artifacts, then COMPLETE.json last; then tell the agent where they are."""
    manifest = storage.write_artifacts(
        ctx.store, ctx.operation_id, ctx.attempt,
        {"model.npy": weights, "metrics.json": json.dumps(metrics, sort_keys=True).encode()},
        extra={"operation_id": ctx.operation_id, "attempt": ctx.attempt, "steps": metrics["steps"],
               **({"inputs": ctx.inputs} if ctx.inputs is not None else {})},
    )
    prefix = storage.artifact_prefix(ctx.operation_id, ctx.attempt)
    emit("artifact_written", f"artifacts at {prefix}", prefix=prefix,
         files=sorted(manifest["files"]), weights_sha256=metrics["weights_sha256"])


def sleep(ctx: RunContext, seconds: float) -> None:
    """Load-test filler: progress for ``seconds``, then an (empty) model as artifact."""
    ctx.store.on_retry = pause_reporter
    ticks = max(1, int(seconds / 0.1))
    for i in range(ticks):
        time.sleep(seconds / ticks)
        emit("progress", "", step=i + 1, total=ticks)
    weights = model.npy_bytes(np.zeros(0))
    _finish(ctx, weights, {"steps": ticks, "weights_sha256": storage.sha256_hex(weights)})


def _best_effort_writes(ctx: RunContext) -> None:
    """SEEDED DEFECT success-without-artifacts: an unavailable store is waited for one second,
    then the write is skipped and the run carries on as if it had been written."""
    ctx.store.retry = storage.RetryPolicy(deadline_seconds=1.0)
    for name in ("write_checkpoint", "write_artifacts"):
        real = getattr(storage, name)

        def skip_on_outage(*args: object, _real: object = real, _name: str = name,
                           **kwargs: object) -> object:
            try:
                return _real(*args, **kwargs)  # type: ignore[operator]
            except storage.StorageUnavailable as exc:
                emit("log", f"{_name} skipped: {exc}", storage_unavailable=True)
                return {"files": {}}

        setattr(storage, name, skip_on_outage)


def train(ctx: RunContext, config: model.TrainConfig) -> dict[str, object]:
    config.validate()
    ctx.store.on_retry = pause_reporter
    if defects.enabled("success-without-artifacts"):
        _best_effort_writes(ctx)
    state = resume_state(ctx, config)
    resumed_from = state.step
    data = model.make_dataset(config.seed)
    while state.step < config.steps:
        model.train_step(state, data, config)
        emit("progress", "", step=state.step, total=config.steps, loss=state.last_loss)
        if state.step % config.checkpoint_every == 0:
            prefix = storage.checkpoint_prefix(ctx.operation_id, ctx.attempt, state.step)
            emit("checkpoint_started", f"checkpoint step {state.step}", step=state.step, prefix=prefix)
            storage.write_checkpoint(ctx.store, ctx.operation_id, ctx.attempt, state.step,
                                     model.serialize(state, config),
                                     commit_delay=ctx.checkpoint_commit_delay)
            emit("checkpoint_written", f"checkpoint step {state.step}", step=state.step, prefix=prefix)
        if ctx.step_delay:
            time.sleep(ctx.step_delay)

    weights = model.npy_bytes(state.theta)
    metrics = {
        "final_loss": state.last_loss, "steps": state.step, "seed": config.seed,
        "resumed_from_step": resumed_from, "steps_computed": state.step - resumed_from,
        "weights_sha256": storage.sha256_hex(weights),
    }
    _finish(ctx, weights, metrics)
    return metrics
