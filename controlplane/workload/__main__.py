"""``python -m controlplane.workload``: the sample training job.

Exit codes: 0 success (artifacts and COMPLETE.json written), 2 invalid parameters
(deterministic: retrying cannot help), 1 anything else (transient).
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import functools
import os
import signal
import sys
import time

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2
_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Die with the agent that started us, like a workload on a lost node.

    PR_SET_PDEATHSIG is Linux-only; it is set here (not via preexec_fn, unsafe with threads)
    and followed by a parent check to close the race where the agent died before the prctl.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:
        os._exit(EXIT_FAILED)


@functools.cache
def parser() -> argparse.ArgumentParser:
    """Built once per process: the local runtime's warm parent builds it before it forks, so an
    attempt only parses (about 1 ms of CPU and 180 copy-on-write page faults less per fork).
    Nothing here may depend on the attempt: its environment is read in parse_args."""
    p = argparse.ArgumentParser(prog="python -m controlplane.workload", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kind", choices=["train", "sleep", "fail", "prepare", "evaluate"],
                   default="train",
                   help="train: the numpy job; sleep: progress + artifacts only; fail: exit with "
                   "--exit-code after --seconds (fault injection); prepare, evaluate: pipeline "
                   "steps (controlplane/workload/steps.py)")
    p.add_argument("--pipeline-inputs", default=None,
                   help="a pipeline step's inputs as JSON (upstream completion manifests and "
                   "datasets, given by the control plane), or an operation's declared "
                   "datasets: read from the named prefixes and checked by sha256 before use")
    p.add_argument("--seconds", type=float, default=1.0, help="duration of sleep/fail kinds")
    p.add_argument("--min-candidates", type=int, default=0,
                   help="evaluate: the check enough_candidates passes only with at least this "
                   "many candidates scored (0: no such check)")
    p.add_argument("--exit-code", type=int, default=1, help="exit code of the fail kind")
    p.add_argument("--operation-id", required=True)
    p.add_argument("--attempt", type=int, required=True, help="attempt number (1-based)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--learning-rate", type=float, default=0.01)
    p.add_argument("--step-delay", type=float, default=0.0, help="sleep per step (seconds)")
    p.add_argument("--checkpoint-commit-delay", type=float, default=0.0,
                   help="seconds between a checkpoint's files and its manifest (a slow commit: "
                   "lets an experiment interrupt a checkpoint write for certain)")
    p.add_argument("--checkpoint-upload-every", type=int, default=1,
                   help="with a node-local checkpoint directory: every n-th checkpoint also "
                   "goes to the object store (the others stay on the node's disk)")
    p.add_argument("--checkpoint-sync-delay", type=float, default=0.0,
                   help="with a node-local checkpoint directory: seconds a checkpoint's last "
                   "file waits for its fsync (a slow disk: lets an experiment cut power while "
                   "a checkpoint is only partly durable)")
    p.add_argument("--local-checkpoint-dir", default=None,
                   help="the node's own checkpoint directory (controlplane/workload/local.py); "
                   "default: $CONTROLPLANE_CHECKPOINT_DIR, none when unset")
    p.add_argument("--s3-endpoint", default=None, help="default: $S3_ENDPOINT_URL")
    p.add_argument("--bucket", default=None, help="default: $ARTIFACT_BUCKET or ml-artifacts")
    p.add_argument("--tracking", type=int, choices=[0, 1], default=0,
                   help="train: 1 also logs params, the loss per step and metrics.json to the "
                   "MLflow tracking server at --tracking-uri, never waiting for it "
                   "(controlplane/workload/tracking.py)")
    p.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI")
    p.add_argument("--tracking-experiment", default=None,
                   help="the MLflow experiment of the runs; default: "
                   "$GAMEDAY_TRACKING_EXPERIMENT or gameday-training")
    p.add_argument("--parent-pid", type=int, default=None,
                   help="exit when this process (the agent) dies")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    args = parser().parse_args(argv)
    if args.s3_endpoint is None:
        args.s3_endpoint = os.environ.get("S3_ENDPOINT_URL")
    if args.bucket is None:
        args.bucket = os.environ.get("ARTIFACT_BUCKET", "ml-artifacts")
    if args.local_checkpoint_dir is None:
        args.local_checkpoint_dir = os.environ.get("CONTROLPLANE_CHECKPOINT_DIR") or None
    if args.tracking_uri is None:
        args.tracking_uri = os.environ.get("MLFLOW_TRACKING_URI") or None
    if args.tracking_experiment is None:
        args.tracking_experiment = (os.environ.get("GAMEDAY_TRACKING_EXPERIMENT")
                                    or "gameday-training")
    return args


def start_tracking(args: argparse.Namespace) -> object | None:
    """The attempt's tracking sink, started (its run is found or created in the background), or
    None without ``--tracking 1``. One identity per attempt: operation id + attempt number."""
    if not args.tracking:
        return None
    from controlplane.workload.events import emit
    from controlplane.workload.mlflow_rest import MlflowRest
    from controlplane.workload.tracking import TrackingSink

    sink = TrackingSink(
        MlflowRest(args.tracking_uri), experiment=args.tracking_experiment,
        attempt_id=f"{args.operation_id}/attempt-{args.attempt}",
        run_name=f"{args.operation_id[:8]}-attempt-{args.attempt}",
        on_event=lambda message, data: emit("log", message, tracking_event=data))
    sink.start({"steps": args.steps, "checkpoint_every": args.checkpoint_every,
                "seed": args.seed, "batch_size": args.batch_size,
                "learning_rate": args.learning_rate, "operation_id": args.operation_id,
                "attempt": args.attempt})
    return sink


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.parent_pid:
        die_with_parent(args.parent_pid)

    # Imported after the parent check: numpy/boto3 take ~0.5 s to import.
    from controlplane import storage
    from controlplane.workload.events import emit
    from controlplane.workload.model import TrainConfig
    from controlplane.workload.run import RunContext, pause_reporter, sleep, train

    config = TrainConfig(steps=args.steps, checkpoint_every=args.checkpoint_every, seed=args.seed,
                         batch_size=args.batch_size, learning_rate=args.learning_rate)
    try:
        config.validate()
    except ValueError as exc:
        emit("start_failed", str(exc), error_kind="deterministic")
        return EXIT_INVALID
    if args.tracking and (args.kind != "train" or not args.tracking_uri):
        why = ("only the train kind logs to tracking" if args.kind != "train"
               else "no tracking server: set MLFLOW_TRACKING_URI or --tracking-uri")
        emit("start_failed", f"workload.params.tracking: {why}", error_kind="deterministic")
        return EXIT_INVALID
    # shared: under the warm parent the client was made before the fork (runtimes/zygote.py)
    store = storage.ObjectStore(storage.shared_s3_client(
        storage.StorageConfig(endpoint_url=args.s3_endpoint, bucket=args.bucket)), args.bucket)
    # a store that is down at start is a pause too: say so from the first try on
    store.on_retry = pause_reporter
    inputs = None
    if args.pipeline_inputs is not None or args.kind in ("prepare", "evaluate"):
        import json

        from controlplane.workload import steps
        from controlplane.workload.data import DataUnavailable
        try:
            inputs = steps.read_inputs(store, json.loads(args.pipeline_inputs or "null"))
        except DataUnavailable as exc:  # data at start: a source missing or not as declared
            emit("start_failed", f"data unavailable at start: {exc}",
                 error_kind="deterministic", reason="data_unavailable")
            return EXIT_INVALID
        except ValueError as exc:  # the bytes behind an input are not the ones it was given
            emit("start_failed", str(exc), error_kind="deterministic")
            return EXIT_INVALID
    ctx = RunContext(args.operation_id, args.attempt, store, step_delay=args.step_delay,
                     checkpoint_commit_delay=args.checkpoint_commit_delay,
                     inputs=inputs.digests if inputs is not None else None,
                     inputs_sha256=inputs.content_sha256() if inputs is not None else None)
    if args.local_checkpoint_dir is not None:
        from pathlib import Path

        from controlplane.workload.local import LocalCheckpoints
        ctx = dataclasses.replace(ctx, local=LocalCheckpoints(Path(args.local_checkpoint_dir)),
                                  upload_every=args.checkpoint_upload_every,
                                  checkpoint_sync_delay=args.checkpoint_sync_delay)
    if args.kind in ("prepare", "evaluate"):
        assert inputs is not None
        if args.kind == "prepare":
            steps.prepare(store, args.operation_id, args.attempt, inputs, args.seconds)
        else:
            steps.evaluate(store, args.operation_id, args.attempt, inputs, args.seconds,
                           min_candidates=args.min_candidates)
        return EXIT_OK
    if args.kind == "fail":
        time.sleep(max(0.0, args.seconds))
        emit("log", f"fail workload exiting with {args.exit_code} as asked")
        return args.exit_code
    from controlplane.workload.tracking import FAILED, FINISHED, TrackingSink

    tracking = start_tracking(args)
    assert tracking is None or isinstance(tracking, TrackingSink)
    status = FAILED
    try:  # no ensure_bucket(): the first write creates a missing bucket (ObjectStore.put)
        if args.kind == "sleep":
            sleep(ctx, args.seconds)
        else:
            train(dataclasses.replace(ctx, tracking=tracking), config)
        status = FINISHED
    except ValueError as exc:  # e.g. a checkpoint from a different configuration
        emit("log", f"invalid input: {exc}")
        return EXIT_INVALID
    finally:
        if tracking is not None:  # the run is ended FAILED too when training raised
            summary = tracking.finish(status)
            emit("log", f"tracking: {summary.points_acknowledged} of {summary.points_logged} "
                 f"points in MLflow, run {summary.run_id} {summary.status_sent or 'not ended'}, "
                 f"waited {summary.finish_wait_seconds:.1f} s at the end",
                 tracking=summary.to_json())
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
