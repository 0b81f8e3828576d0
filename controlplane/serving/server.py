"""One serving replica: KServe's Python model server (``kserve.ModelServer``) with one model,
loaded from the object store by version and digest (docs/serving.md).

Runs in its own virtualenv (``.venv-kserve``, scripts/setup-kserve.sh); nothing in the
harness imports this module. ``python -m controlplane.serving.server --help``.

Readiness: the model is registered before the server starts but is not ``ready`` until its
bytes were read in full and had the deployed sha256, so ``GET /v2/models/<name>/ready`` (the
load balancer's check) and ``POST /v2/models/<name>/infer`` answer 503 until then; a half-read
or substituted artifact is never served. Loading runs in the background and is retried while
the store cannot be reached; why the model is not ready is in the status file (``--status-file``,
read by ``gameday env status``) and the log.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import boto3
import kserve
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse
from prometheus_client import Counter

from controlplane import defects
from controlplane.serving.artifact import (
    OUTPUT_TENSOR,
    ArtifactError,
    LinearModel,
    decode_model,
    model_key,
)
from controlplane.serving.catalog import GOLDEN_INPUTS

log = logging.getLogger("controlplane.serving")

VERSION_HEADER = "x-model-version"
# how long one read of the store may take before the load is retried
READ_TIMEOUT_S = 5.0
RETRY_S = 0.5


# on the server's own /metrics (prometheus_client's default registry, which kserve serves)
REQUESTS = Counter("model_server_requests", "Predictions answered, by model and HTTP status",
                   ["model_name", "code"])


class ModelNotLoaded(RuntimeError):
    pass


class StoreModel(kserve.Model):
    """A linear model read from ``<store>/<bucket>/models/<name>/<version>/model.json``."""

    def __init__(self, name: str, version: str, digest: str, store: str, bucket: str,
                 status_file: Path | None, seed: int) -> None:
        super().__init__(name, return_response_headers=True)
        self.version, self.digest = version, digest
        self.bucket, self.key = bucket, model_key(name, version)
        self.url = f"{store.rstrip('/')}/{bucket}/{self.key}"
        # one attempt per read: load_until_ready retries, and says why in between
        self.s3 = boto3.client("s3", endpoint_url=store, config=Config(
            connect_timeout=READ_TIMEOUT_S, read_timeout=READ_TIMEOUT_S,
            retries={"max_attempts": 1, "mode": "standard"}))
        self.status_file = status_file
        self.model: LinearModel | None = None
        self.rng = random.Random(seed)
        self.status("loading", f"reading {self.url}")
        # seeded defect (test only): readiness says yes before a byte of the model was read
        self.ready = defects.enabled("ready-before-loaded")

    def status(self, state: str, reason: str) -> None:
        log.info("model %s:%s %s: %s", self.name, self.version, state, reason)
        if self.status_file is None:
            return
        tmp = self.status_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"model": self.name, "version": self.version,
                                   "sha256": self.digest, "state": state, "reason": reason,
                                   "time": time.time(), "pid": os.getpid()}))
        tmp.replace(self.status_file)

    def load(self) -> bool:
        """One attempt: read the whole object, check its digest, then (only then) go ready."""
        try:
            data = self.s3.get_object(Bucket=self.bucket, Key=self.key)["Body"].read()
            model = decode_model(data, self.digest, self.url)
        except ClientError as exc:
            self.status("unready", f"artifact store refused {self.url}: "
                                   f"{exc.response.get('Error', {}).get('Code', exc)}")
            return False
        except (OSError, BotoCoreError) as exc:  # a cut-off store, a body torn mid-read
            if defects.enabled("serve-partial-model"):
                return self.serve_partial(f"artifact store unreachable: {exc}")
            self.status("unready", f"artifact store unreachable: {exc}")
            return False
        except ArtifactError as exc:
            if defects.enabled("serve-partial-model"):
                return self.serve_partial(str(exc))
            self.status("unready", str(exc))
            return False
        if model.name != self.name or model.version != self.version:
            self.status("unready", f"{self.url} holds {model.name}:{model.version}, "
                                   f"not {self.name}:{self.version}")
            return False
        self.model = model
        self.ready = True
        self.status("ready", f"loaded {len(data)} bytes, sha256 {self.digest[:12]}")
        return True

    def serve_partial(self, why: str) -> bool:
        """Seeded defect ``serve-partial-model`` (test only): a load that failed goes ready
        anyway, with the model as far as it got (its weights still zero), digest unchecked."""
        self.model = LinearModel(self.name, self.version,
                                 weights=(0.0,) * len(GOLDEN_INPUTS[0]), bias=0.0)
        self.ready = True
        self.status("ready", f"serving what was loaded: {why}")
        return True

    def load_until_ready(self, stop: threading.Event) -> None:
        while not stop.is_set() and not self.load():
            stop.wait(RETRY_S)

    async def predict(self, payload: InferRequest, headers: dict[str, str] | None = None,
                      response_headers: dict[str, str] | None = None) -> InferResponse:
        """Answer, and count the answer by the HTTP status kserve gives it: the canary
        analysis' error ratio reads this counter (provisioning/components/serving.py); KServe
        exports only latency histograms of its own."""
        try:
            answer = await self._predict(payload, response_headers)
        except kserve.errors.InvalidInput:
            REQUESTS.labels(self.name, "400").inc()
            raise
        except Exception:
            REQUESTS.labels(self.name, "500").inc()
            raise
        REQUESTS.labels(self.name, "200").inc()
        return answer

    async def _predict(self, payload: InferRequest,
                       response_headers: dict[str, str] | None) -> InferResponse:
        model = self.model
        if model is None:  # kserve checks readiness first; this is the last line
            raise ModelNotLoaded(f"model {self.name}:{self.version} is not loaded")
        if response_headers is not None:
            response_headers[VERSION_HEADER] = self.version
        rows = payload.inputs[0].as_numpy().tolist()
        if model.behaviour.delay_ms:
            await _sleep(model.behaviour.delay_ms / 1000.0)
        if model.behaviour.error_ratio and self.rng.random() < model.behaviour.error_ratio:
            raise RuntimeError(f"model {self.name}:{self.version} failed this request "
                               "(its artifact's behaviour.error_ratio)")
        try:
            outputs = model.predict(rows)
        except ArtifactError as exc:
            raise kserve.errors.InvalidInput(str(exc)) from exc
        out = InferOutput(name=OUTPUT_TENSOR, shape=[len(outputs)], datatype="FP64")
        out.set_data_from_numpy(_array(outputs))
        return InferResponse(model_name=self.name, model_version=self.version,
                             infer_outputs=[out], response_id=payload.id or str(uuid.uuid4()))


async def _sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)


def _array(values: list[float]) -> Any:
    import numpy as np

    return np.asarray(values, dtype=np.float64)


def bind_to(host: str) -> None:
    """kserve 0.21's REST server always listens on 0.0.0.0 (kserve/protocol/rest/server.py
    ``RESTServer``); a local game day's replicas listen on loopback only, so the host of the
    uvicorn config it builds is replaced before uvicorn binds (it reads ``config.host`` then)."""
    from kserve.protocol.rest import server as rest

    original = rest.RESTServer.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.config.host = host

    rest.RESTServer.__init__ = init  # type: ignore[method-assign]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m controlplane.serving.server",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="model name")
    parser.add_argument("--version", required=True, help="model version to load")
    parser.add_argument("--sha256", required=True, help="digest the model.json must have")
    parser.add_argument("--store", required=True, help="S3 endpoint, e.g. http://127.0.0.1:9000")
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--port", type=int, required=True, help="HTTP port (v2 protocol)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--status-file", type=Path, default=None)
    parser.add_argument("--seed", type=int, default=0, help="seeds behaviour.error_ratio draws")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    model = StoreModel(args.model, args.version, args.sha256, args.store, args.bucket,
                       args.status_file, args.seed)
    # uvicorn's and kserve's per-request lines: the load balancer's checks would fill the log
    for noisy in ("uvicorn.access", "kserve.trace"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    bind_to(args.host)
    server = kserve.ModelServer(http_port=args.port, enable_grpc=False, workers=1,
                                enable_latency_logging=False)
    # registered unready: the v2 readiness and infer routes answer 503 until load() succeeds
    server.register_model(model)
    stop = threading.Event()
    threading.Thread(target=model.load_until_ready, args=(stop,), name="model-load",
                     daemon=True).start()
    try:
        server.start([])
    finally:
        stop.set()


if __name__ == "__main__":
    main()
