"""The sample training workload as a real subprocess against moto: determinism and resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading

import numpy as np
import pytest
from agenttest import S3Server, workload_argv

from controlplane import storage
from controlplane.workload import model
from controlplane.workload.events import WorkloadEvent, parse_line

STEPS, EVERY = 60, 10


def run_to_end(argv: list[str]) -> list[WorkloadEvent]:
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return [parse_line(line) for line in done.stdout.splitlines()]


def final_weights(s3: S3Server, operation_id: str, attempt: int) -> bytes:
    manifest, reason = storage.verify_artifacts(s3.store(), operation_id, attempt)
    assert reason is None and manifest is not None
    return s3.store().get(storage.artifact_prefix(operation_id, attempt) + "model.npy")


def test_same_seed_same_bits_in_process() -> None:
    config = model.TrainConfig(steps=30, checkpoint_every=10, seed=3)
    data = model.make_dataset(config.seed)
    runs = []
    for _ in range(2):
        state = model.init_state(config)
        for _ in range(config.steps):
            model.train_step(state, data, config)
        runs.append(state.theta.tobytes())
    assert runs[0] == runs[1]
    other = model.init_state(model.TrainConfig(seed=4))
    assert other.theta.tobytes() != model.init_state(config).theta.tobytes()


def test_checkpoint_round_trip_continues_bit_identically() -> None:
    config = model.TrainConfig(steps=40, checkpoint_every=10, seed=5)
    data = model.make_dataset(config.seed)
    straight = model.init_state(config)
    for _ in range(40):
        model.train_step(straight, data, config)

    resumed = model.init_state(config)
    for _ in range(17):  # mid-epoch: the data position and RNG state both matter
        model.train_step(resumed, data, config)
    resumed = model.deserialize(model.serialize(resumed, config), config)
    for _ in range(23):
        model.train_step(resumed, data, config)
    assert np.array_equal(straight.theta, resumed.theta)
    assert straight.theta.tobytes() == resumed.theta.tobytes()


def test_resume_rejects_a_checkpoint_of_another_configuration() -> None:
    files = model.serialize(model.init_state(model.TrainConfig(seed=1)), model.TrainConfig(seed=1))
    with pytest.raises(ValueError, match="does not match"):
        model.deserialize(files, model.TrainConfig(seed=2))


def test_sigkill_mid_run_then_resume_gives_bit_identical_weights(moto: S3Server) -> None:
    """Node loss mid-run: resume from the newest complete checkpoint, same final bits."""
    reference_op, interrupted_op = "ref-" + os.urandom(4).hex(), "int-" + os.urandom(4).hex()
    run_to_end(workload_argv(reference_op, 1, moto, steps=STEPS, every=EVERY))
    reference = final_weights(moto, reference_op, 1)

    victim = subprocess.Popen(workload_argv(interrupted_op, 1, moto, steps=STEPS, every=EVERY,
                                            step_delay=0.02),
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert victim.stdout is not None
    last_step = 0
    checkpoints = 0
    for line in victim.stdout:
        event = parse_line(line)
        if event.kind == "progress":
            last_step = event.data["step"]
        if event.kind == "checkpoint_written":
            checkpoints += 1
        if checkpoints >= 2 and last_step % EVERY == 5:  # between two checkpoints
            os.killpg(victim.pid, signal.SIGKILL)
            break
    victim.wait(timeout=10)
    assert victim.returncode == -signal.SIGKILL

    events = run_to_end(workload_argv(interrupted_op, 2, moto, steps=STEPS, every=EVERY))
    resumed = [e for e in events if e.kind == "resumed"]
    assert len(resumed) == 1
    from_step = resumed[0].data["from_step"]
    assert from_step == last_step - last_step % EVERY
    assert last_step - from_step <= EVERY  # recomputed at most one checkpoint interval
    assert final_weights(moto, interrupted_op, 2) == reference
    metrics = json.loads(moto.store().get(storage.artifact_prefix(interrupted_op, 2) + "metrics.json"))
    assert metrics["steps_computed"] == STEPS - from_step


def test_torn_checkpoint_is_skipped_reported_and_result_unchanged(moto: S3Server) -> None:
    reference_op, torn_op = "ref-" + os.urandom(4).hex(), "torn-" + os.urandom(4).hex()
    run_to_end(workload_argv(reference_op, 1, moto, steps=30, every=10))
    # A first attempt that got to step 30's checkpoint files but died before its manifest.
    run_to_end(workload_argv(torn_op, 1, moto, steps=30, every=10))
    store = moto.store()
    store.client.delete_object(Bucket=store.bucket,
                               Key=storage.checkpoint_prefix(torn_op, 1, 30) + "MANIFEST.json")

    events = run_to_end(workload_argv(torn_op, 2, moto, steps=30, every=10))

    skipped = [e for e in events if e.kind == "checkpoint_skipped_torn"]
    assert [e.data["step"] for e in skipped] == [30]
    assert "MANIFEST.json missing" in skipped[0].data["reason"]
    assert [e.data["from_step"] for e in events if e.kind == "resumed"] == [20]
    assert final_weights(moto, torn_op, 2) == final_weights(moto, reference_op, 1)


def test_invalid_parameters_exit_2_with_start_failed_event(moto: S3Server) -> None:
    done = subprocess.run(workload_argv("bad", 1, moto, steps=0, every=10), check=False,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    events = [parse_line(line) for line in done.stdout.splitlines()]
    assert events[-1].kind == "start_failed" and "steps must be >= 1" in events[-1].message


def test_workload_pauses_while_store_frozen_and_never_uses_a_torn_checkpoint(
    private_moto: S3Server,
) -> None:
    """SIGSTOP the store during a checkpoint: the run pauses, then completes after SIGCONT."""
    op = "frz-" + os.urandom(4).hex()
    proc = subprocess.Popen(workload_argv(op, 1, private_moto, steps=40, every=10, step_delay=0.01),
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None
    kinds: list[str] = []
    thaw = threading.Timer(5.0, private_moto.proc.thaw)
    try:
        for line in proc.stdout:
            event = parse_line(line)
            kinds.append(event.kind)
            if event.kind == "checkpoint_started" and event.data["step"] == 20 and not thaw.is_alive():
                private_moto.proc.freeze()
                thaw.start()
        assert proc.wait(timeout=60) == 0
    finally:
        thaw.cancel()
        private_moto.proc.thaw()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "log" in kinds  # the pause was reported ("object storage unavailable, pausing")
    loaded, torn = storage.latest_complete_checkpoint(private_moto.store(), op)
    assert torn == [] and loaded is not None and loaded.ref.step == 40
    manifest, reason = storage.verify_artifacts(private_moto.store(), op, 1)
    assert reason is None and manifest is not None
