"""The sample workload's lifecycle: resume -> train -> checkpoint every N steps -> artifacts.

With a node-local checkpoint directory (controlplane/workload/local.py) every checkpoint goes
to the node's disk first, made durable there, then (every ``upload_every``-th one) to the
object store, and only then is it recorded (its checksums, in the store) and reported; a resume
prefers the newest local copy whose bytes match such a record and says which it skipped."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import numpy as np

from controlplane import defects, storage
from controlplane.workload import model
from controlplane.workload.events import emit
from controlplane.workload.local import LocalCheckpoints, Slot, slot_of
from controlplane.workload.tracking import TrackingSink


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
    # the sha256 over the verified input bytes (a pipeline step): the training data follows it
    inputs_sha256: str | None = None
    # the node's own checkpoint directory (None: checkpoints go to the object store only)
    local: LocalCheckpoints | None = None
    upload_every: int = 1  # with a local directory: every n-th checkpoint also to the store
    checkpoint_sync_delay: float = 0.0  # with a local directory: the last file's fsync waits
    # params, metrics and the metrics artifact also go to an MLflow tracking server (never
    # waited for: controlplane/workload/tracking.py); None: no tracking
    tracking: TrackingSink | None = None


@dataclass(frozen=True)
class LocalChoice:
    """Where a resume on this node starts from its own disk (pure decision, choose_local)."""
    slot: Slot | None
    record: storage.LocalRecord | None
    skipped: tuple[dict[str, object], ...]  # each local checkpoint not used, with the reason


def _mismatch(slot: Slot, record: storage.LocalRecord) -> str | None:
    for name, digest in sorted(record.files.items()):
        data = slot.files.get(name)
        if data is None:
            return f"{name} missing in {slot.name}"
        if storage.sha256_hex(data) != digest:
            return f"{name} sha256 mismatch in {slot.name}"
    return None


def choose_local(records: list[storage.LocalRecord], slots: list[Slot], newer_than: int,
                 *, verify: bool = True) -> LocalChoice:
    """The newest local copy newer than step ``newer_than`` (the store's newest complete
    checkpoint) whose every file matches a durable record, and what was skipped on the way:
    recorded checkpoints whose local copy is gone or differs (lost with the node's unsynced
    writes), and slots claiming a step nobody recorded (a write the power loss cut short).
    ``verify=False`` is the seeded defect local-checkpoint-unverified: the slot claiming the
    newest step is used as it is."""
    by_step = {r.ref.step: r for r in reversed(records)}  # the latest attempt's record wins
    if not verify:
        claimed = [s for s in slots if s.claimed_step is not None and s.claimed_step > newer_than]
        best = max(claimed, key=lambda s: s.claimed_step or 0, default=None)
        return LocalChoice(best, by_step.get(best.claimed_step or 0) if best else None, ())
    skipped: list[dict[str, object]] = []
    chosen: tuple[Slot, storage.LocalRecord] | None = None
    for record in sorted(by_step.values(), key=lambda r: r.ref.step, reverse=True):
        if record.ref.step <= newer_than:
            break
        why = {s.name: _mismatch(s, record) for s in slots}
        match = next((s for s in slots if why[s.name] is None), None)
        if match is not None:
            chosen = (match, record)
            break
        reasons = [w for w in why.values() if w]
        claimed = [s for s in slots if s.claimed_step == record.ref.step]
        reason = (why[claimed[0].name] if claimed else
                  "no local copy" + (f" ({'; '.join(reasons)})" if reasons else ""))
        skipped.append({"step": record.ref.step, "record": record.key, "reason": reason})
    floor = chosen[1].ref.step if chosen else newer_than
    for s in slots:
        if s.claimed_step is not None and s.claimed_step > floor and s.claimed_step not in by_step:
            skipped.append({"step": s.claimed_step, "slot": s.name,
                            "reason": "never recorded: its write did not complete"})
    return LocalChoice(chosen[0] if chosen else None, chosen[1] if chosen else None,
                       tuple(skipped))


def _resume_local(ctx: RunContext, config: model.TrainConfig,
                  newer_than: int) -> model.TrainState | None:
    assert ctx.local is not None
    choice = choose_local(storage.local_records(ctx.store, ctx.operation_id),
                          ctx.local.slots(ctx.operation_id, storage.CHECKPOINT_FILES), newer_than,
                          verify=not defects.enabled("local-checkpoint-unverified"))
    for item in choice.skipped:
        where = item.get("record") or item.get("slot")
        emit("checkpoint_skipped_local",
             f"skipped the local checkpoint of step {item['step']} ({where}): {item['reason']}",
             **item)
    if choice.slot is None:
        return None
    state = model.deserialize(choice.slot.files, config)
    record = choice.record.key if choice.record else None
    emit("resumed", f"resumed from step {state.step} (local {choice.slot.name})",
         from_step=state.step, source="local", slot=choice.slot.name, record=record,
         verified=defects.enabled("local-checkpoint-unverified") is False)
    return state


def resume_state(ctx: RunContext, config: model.TrainConfig) -> model.TrainState:
    """The state of the newest complete checkpoint of the operation, or a fresh one."""
    loaded, torn = storage.latest_complete_checkpoint(ctx.store, ctx.operation_id)
    for skipped in torn:
        emit("checkpoint_skipped_torn", f"skipped torn checkpoint {skipped.ref.prefix}: {skipped.reason}",
             prefix=skipped.ref.prefix, step=skipped.ref.step, reason=skipped.reason)
    if ctx.local is not None:
        state = _resume_local(ctx, config, loaded.ref.step if loaded else 0)
        if state is not None:
            return state
    if loaded is None:
        return model.init_state(config)
    state = model.deserialize(loaded.files, config)
    emit("resumed", f"resumed from step {state.step} ({loaded.ref.prefix})",
         from_step=state.step, prefix=loaded.ref.prefix, source="store")
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


def _checkpoint_local(ctx: RunContext, config: model.TrainConfig, state: model.TrainState,
                      prefix: str) -> None:
    """Node disk first (durable when this returns), the store's copy when it is this
    checkpoint's turn, then the record, then the report: nothing is recorded or reported
    before its bytes are durable somewhere."""
    assert ctx.local is not None
    files = model.serialize(state, config)
    slot = ctx.local.write(ctx.operation_id, slot_of(state.step, config.checkpoint_every), files,
                           sync_delay=ctx.checkpoint_sync_delay)
    upload = (state.step // config.checkpoint_every) % ctx.upload_every == 0
    if upload:
        storage.write_checkpoint(ctx.store, ctx.operation_id, ctx.attempt, state.step, files,
                                 commit_delay=ctx.checkpoint_commit_delay)
    record = storage.write_local_record(ctx.store, ctx.operation_id, ctx.attempt, state.step,
                                        files, slot=slot, uploaded=upload)
    emit("checkpoint_written", f"checkpoint step {state.step} ({slot}"
         + (", uploaded)" if upload else ", node-local)"), step=state.step,
         prefix=prefix if upload else None, location="store" if upload else "local",
         slot=slot, record=record)


def train(ctx: RunContext, config: model.TrainConfig) -> dict[str, object]:
    config.validate()
    ctx.store.on_retry = pause_reporter
    if defects.enabled("success-without-artifacts"):
        _best_effort_writes(ctx)
    if ctx.upload_every < 1:
        raise ValueError(f"checkpoint upload every {ctx.upload_every}: expected 1 or more")
    state = resume_state(ctx, config)
    resumed_from = state.step
    data = model.make_dataset(config.seed, ctx.inputs_sha256)
    while state.step < config.steps:
        model.train_step(state, data, config)
        emit("progress", "", step=state.step, total=config.steps, loss=state.last_loss)
        if ctx.tracking is not None:
            ctx.tracking.log_metric("loss", state.last_loss, state.step)
        if state.step % config.checkpoint_every == 0:
            prefix = storage.checkpoint_prefix(ctx.operation_id, ctx.attempt, state.step)
            emit("checkpoint_started", f"checkpoint step {state.step}", step=state.step, prefix=prefix)
            if ctx.local is not None:
                _checkpoint_local(ctx, config, state, prefix)
            else:
                storage.write_checkpoint(ctx.store, ctx.operation_id, ctx.attempt, state.step,
                                         model.serialize(state, config),
                                         commit_delay=ctx.checkpoint_commit_delay)
                emit("checkpoint_written", f"checkpoint step {state.step}", step=state.step,
                     prefix=prefix, location="store")
        if ctx.step_delay:
            time.sleep(ctx.step_delay)

    weights = model.npy_bytes(state.theta)
    metrics = {
        "final_loss": state.last_loss, "steps": state.step, "seed": config.seed,
        "resumed_from_step": resumed_from, "steps_computed": state.step - resumed_from,
        "weights_sha256": storage.sha256_hex(weights),
    }
    _finish(ctx, weights, metrics)
    if ctx.tracking is not None:
        ctx.tracking.log_artifact("metrics.json", json.dumps(metrics, sort_keys=True).encode())
    return metrics
