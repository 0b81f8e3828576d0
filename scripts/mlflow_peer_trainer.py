"""The peer of the tracking-outage class: a training script as a user writes it with the plain
MLflow client (``mlflow`` 3.17.2, run by .venv-mlflow's python, never imported by the harness).

It does what the workload's tracking sink does (params, the loss at every step, metrics.json as
an artifact, the run ended) with MLflow's defaults and no error handling of its own, and writes
what happened to ``--out``: each call's time, what raised, how far training got. Started by
gameday/tracking_peer.py."""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--uri", required=True)
    p.add_argument("--experiment", required=True)
    p.add_argument("--attempt-id", required=True)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--step-delay", type=float, default=0.1)
    p.add_argument("--out", required=True)
    args = p.parse_args()

    import mlflow
    from mlflow import environment_variables as ev

    began = time.monotonic()
    ledger: dict[str, object] = {
        "attempt_id": args.attempt_id, "mlflow": mlflow.__version__,
        "defaults": {"http_request_max_retries": ev.MLFLOW_HTTP_REQUEST_MAX_RETRIES.get(),
                     "http_request_backoff_factor": ev.MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR.get(),
                     "http_request_backoff_jitter": ev.MLFLOW_HTTP_REQUEST_BACKOFF_JITTER.get(),
                     "http_request_timeout": ev.MLFLOW_HTTP_REQUEST_TIMEOUT.get()},
        "points_logged": 0, "steps_trained": 0, "calls": [], "outcome": "running",
        "run_id": None, "ended": False}
    calls: list[dict[str, object]] = ledger["calls"]  # type: ignore[assignment]

    def call(name: str, fn: object, *a: object, **kw: object) -> object:
        t = time.monotonic()
        try:
            return fn(*a, **kw)  # type: ignore[operator]
        finally:
            took = time.monotonic() - t
            if took > 0.5 or sys.exc_info()[0] is not None:  # the slow and the failed ones
                calls.append({"call": name, "at_s": round(t - began, 3),
                              "seconds": round(took, 3),
                              "error": repr(sys.exc_info()[1])[:300] if sys.exc_info()[1] else None})

    try:
        mlflow.set_tracking_uri(args.uri)
        call("set_experiment", mlflow.set_experiment, args.experiment)
        run = call("start_run", mlflow.start_run, run_name=args.attempt_id,
                   tags={"gameday.attempt_id": args.attempt_id})
        ledger["run_id"] = run.info.run_id  # type: ignore[attr-defined]
        call("log_params", mlflow.log_params, {"steps": args.steps, "seed": 7})
        for step in range(1, args.steps + 1):
            call("log_metric", mlflow.log_metric, "loss", 1.0 / step, step=step)
            ledger["points_logged"] = step  # log_metric returned: the trainer was acknowledged
            ledger["steps_trained"] = step
            time.sleep(args.step_delay)
        call("log_dict", mlflow.log_dict, {"steps": args.steps}, "metrics.json")
        call("end_run", mlflow.end_run, "FINISHED")
        ledger["ended"] = True
        ledger["outcome"] = "succeeded"
        return 0
    except BaseException as exc:  # noqa: BLE001 - recorded, then the script dies as a user's would
        ledger["outcome"] = "failed"
        ledger["error"] = "".join(traceback.format_exception_only(type(exc), exc))[-600:]
        return 1
    finally:
        ledger["seconds"] = round(time.monotonic() - began, 3)
        with open(args.out, "w") as f:
            json.dump(ledger, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
