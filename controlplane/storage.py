"""Checkpoints and artifacts on S3-compatible object storage (CONTRACTS.md section 3).

Layout::

    checkpoints/<operation_id>/attempt-<n>/step-<%08d>/{weights.npy,optimizer.npz,state.json}
    checkpoints/<operation_id>/attempt-<n>/step-<%08d>/MANIFEST.json      (written last)
    artifacts/<operation_id>/attempt-<n>/{model.npy,metrics.json}
    artifacts/<operation_id>/attempt-<n>/COMPLETE.json                    (written last)

A checkpoint or artifact set is valid only when its manifest exists and every file it lists
has the recorded sha256: a writer killed half-way leaves a *torn* prefix that readers skip.
Writes are retried with backoff for as long as the caller allows (the workload pauses while
the store is unavailable); nothing is ever deleted here, so nothing written is lost.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import random
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from controlplane import defects

S3Client = Any  # boto3 clients are generated at runtime; no stubs installed

log = logging.getLogger(__name__)

DEFAULT_BUCKET = "ml-artifacts"
CHECKPOINT_FILES = ("weights.npy", "optimizer.npz", "state.json")
ARTIFACT_FILES = ("model.npy", "metrics.json")
CHECKPOINT_MANIFEST = "MANIFEST.json"
ARTIFACT_MANIFEST = "COMPLETE.json"
_STEP_PREFIX = re.compile(r"^checkpoints/(?P<op>[^/]+)/attempt-(?P<n>\d+)/step-(?P<step>\d{8})/$")


class StorageError(Exception):
    """Root of storage errors."""


class StorageUnavailable(StorageError):
    """The store could not be reached (or kept failing) within the allowed time."""


class ObjectMissing(StorageError):
    """A key that should exist does not."""


@dataclass(frozen=True)
class StorageConfig:
    endpoint_url: str | None
    bucket: str = DEFAULT_BUCKET
    region: str = "us-east-1"
    access_key: str | None = None
    secret_key: str | None = None
    # botocore's defaults (60 s read timeout, legacy retries) hang for minutes when the
    # endpoint is SIGSTOPped (docs/DESIGN.md section 8.7): keep each call short, retry above it.
    connect_timeout: float = 2.0
    read_timeout: float = 3.0
    # Our own loop (ObjectStore._with_retry) retries with backoff and a deadline; botocore's
    # retries would only multiply the time a single call can hang.
    total_max_attempts: int = 1


def make_s3_client(config: StorageConfig) -> S3Client:
    """A boto3 S3 client with explicit timeouts and a bounded, standard retry mode."""
    botocore_config = Config(
        connect_timeout=config.connect_timeout,
        read_timeout=config.read_timeout,
        # total_max_attempts counts the first try; botocore's "max_attempts" counts retries only.
        retries={"total_max_attempts": config.total_max_attempts, "mode": "standard"},
        s3={"addressing_style": "path"},
    )
    return boto3.client(
        "s3",
        endpoint_url=config.endpoint_url,
        region_name=config.region,
        aws_access_key_id=config.access_key or ("testing" if config.endpoint_url else None),
        aws_secret_access_key=config.secret_key or ("testing" if config.endpoint_url else None),
        config=botocore_config,
    )


_CLIENTS: dict[StorageConfig, S3Client] = {}


def shared_s3_client(config: StorageConfig) -> S3Client:
    """This process's client for ``config`` (any bucket), made on first use.

    The local runtime's warm parent makes it before forking attempts, so each attempt skips
    ~12 ms of CPU of client set-up. The parent never sends a request with it: a forked child
    inherits a client with no open connection, never a socket shared with another process.
    """
    key = replace(config, bucket="")
    client = _CLIENTS.get(key)
    if client is None:
        client = _CLIENTS[key] = make_s3_client(key)
    return client


class _NoBody:
    """The empty body of an answer made up in this process (prime_s3_client)."""

    def stream(self, **_: Any) -> Any:
        return iter(())

    def read(self, *_: Any) -> bytes:
        return b""


def prime_s3_client(client: S3Client, bucket: str) -> None:
    """Run one ``put_object`` through the client's whole request path (parameter checks,
    serialiser, endpoint rules, checksum, signing, response parser) with the answer made up
    here, so that what botocore builds on a client's first call of an operation is built now.

    For the local runtime's warm parent: its forked attempts then inherit those parts instead
    of each building its own, which measured about 6 ms of CPU and 320 copy-on-write page
    faults less per attempt (docs/local-environment.md). Nothing is sent: no connection is
    opened (a forked child never shares a socket) and nothing is written to the bucket. The
    made-up answer is returned through botocore's documented ``before-send`` hook, which is
    removed again before this returns."""
    from botocore.awsrequest import AWSResponse

    def answer(request: Any, **_: Any) -> AWSResponse:
        return AWSResponse(request.url, 200, {"ETag": '"0"'}, _NoBody())

    event, uid = "before-send.s3.PutObject", "controlplane-prime"
    client.meta.events.register_first(event, answer, unique_id=uid)
    try:
        client.put_object(Bucket=bucket, Key="prime", Body=b"", ChecksumSHA256=_b64_sha256(b""))
    finally:
        client.meta.events.unregister(event, unique_id=uid)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def checkpoint_prefix(operation_id: str, attempt: int, step: int) -> str:
    return f"checkpoints/{operation_id}/attempt-{attempt}/step-{step:08d}/"


def artifact_prefix(operation_id: str, attempt: int) -> str:
    return f"artifacts/{operation_id}/attempt-{attempt}/"


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff for writes/reads against an unavailable store; deadline None = wait forever.

    Capped exponential backoff with full jitter: the n-th sleep (n from 0) is drawn uniformly
    from [0, min(max_backoff, initial_backoff * 2**n)]. Without the draw every client that met
    the same brownout retried in lockstep and hit the store again together."""

    initial_backoff: float = 0.2
    max_backoff: float = 2.0
    deadline_seconds: float | None = None

    def cap(self, retry: int) -> float:
        """The upper bound of the ``retry``-th sleep (0 for the first)."""
        # exponent bounded: 2.0**1100 overflows, and the cap is reached long before
        return min(self.max_backoff, self.initial_backoff * 2.0 ** min(retry, 64))


def full_jitter(cap: float, draw: float) -> float:
    """The sleep for a draw in [0, 1): uniform over [0, cap]."""
    return cap * draw


def backoff_sleep(policy: RetryPolicy, retry: int, draw: float, elapsed: float) -> float:
    """Seconds to wait before the next try: jittered, and never past the deadline, so the last
    try happens at the deadline instead of up to a whole backoff after it."""
    sleep = full_jitter(policy.cap(retry), draw)
    if policy.deadline_seconds is not None:
        sleep = min(sleep, max(0.0, policy.deadline_seconds - elapsed))
    return sleep


THROTTLED, SERVER_ERROR, UNREACHABLE = "throttled", "server_error", "unreachable"
_THROTTLE_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "TooManyRequests",
                             "RequestLimitExceeded"})


def failure_kind(error: Exception) -> str:
    """Why a retried call failed: the store asked us to slow down (it is up, and busy), it
    answered with another 5xx/timeout, or it could not be reached at all."""
    if isinstance(error, ClientError):
        code = error.response.get("Error", {}).get("Code", "")
        return THROTTLED if code in _THROTTLE_CODES else SERVER_ERROR
    return UNREACHABLE


RetryListener = Callable[[str, int, Exception], None]
"""Called as (key, attempt_number, error) before each backoff sleep: lets callers report a pause.
``failure_kind(error)`` tells throttling from unreachability."""


@dataclass
class ObjectStore:
    client: S3Client
    bucket: str
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    on_retry: RetryListener | None = None
    # SystemRandom by default: it keeps no state, so processes forked from one parent (the
    # warm parent's attempts) never draw the same sleeps, as copies of a seeded Random would.
    rng: random.Random = field(default_factory=random.SystemRandom)
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    # Retries so far by failure_kind(): throttled / server_error / unreachable (a tally: threads
    # sharing one store may lose an increment now and then).
    retry_counts: Counter[str] = field(default_factory=Counter)

    @classmethod
    def from_config(
        cls, config: StorageConfig, retry: RetryPolicy | None = None,
        on_retry: RetryListener | None = None,
    ) -> ObjectStore:
        return cls(make_s3_client(config), config.bucket, retry or RetryPolicy(), on_retry)

    def _with_retry(self, what: str, fn: Callable[[], Any]) -> Any:
        started = self.clock()
        attempt = 0
        while True:
            attempt += 1
            try:
                return fn()
            except ClientError as exc:
                code = exc.response.get("Error", {}).get("Code", "")
                if code in ("NoSuchKey", "404", "NoSuchBucket"):
                    raise ObjectMissing(f"{what}: {code}") from exc
                status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
                if status < 500 and code not in ("SlowDown", "RequestTimeout"):
                    # 4xx: retrying won't help
                    raise StorageError(f"{what}: {code}: {exc}") from exc
                error: Exception = exc
            except BotoCoreError as exc:  # connection refused/timeouts after botocore's own retries
                error = exc
            elapsed = self.clock() - started
            deadline = self.retry.deadline_seconds
            if deadline is not None and elapsed >= deadline:
                raise StorageUnavailable(f"{what}: gave up after {attempt} tries: {error}") from error
            kind = failure_kind(error)
            self.retry_counts[kind] += 1
            if self.on_retry is not None:
                self.on_retry(what, attempt, error)
            pause = backoff_sleep(self.retry, attempt - 1, self.rng.random(), elapsed)
            if defects.enabled("storage-retry-no-backoff"):  # seeded defect: retry at once
                pause = 0.0
            log.warning("storage %s failed (try %d, %s), retrying in %.2fs: %s",
                        what, attempt, kind, pause, error)
            self.sleep(pause)

    def ensure_bucket(self) -> None:
        def create() -> None:
            try:
                self.client.head_bucket(Bucket=self.bucket)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket"):
                    raise
                self.client.create_bucket(Bucket=self.bucket)

        self._with_retry(f"ensure bucket {self.bucket}", create)

    def put(self, key: str, data: bytes) -> None:
        def send() -> None:
            self.client.put_object(Bucket=self.bucket, Key=key, Body=data,
                                   ChecksumSHA256=_b64_sha256(data))

        def write() -> None:
            try:
                send()
            except ClientError as exc:
                if not _no_such_bucket(exc):
                    raise
                # The first write creates the bucket, instead of a HEAD before every run: one
                # request less per attempt, the same outcome as ensure_bucket() then put.
                self.client.create_bucket(Bucket=self.bucket)
                send()

        self._with_retry(f"put {key}", write)

    def get(self, key: str) -> bytes:
        def read() -> bytes:
            return self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()

        return self._with_retry(f"get {key}", read)

    def list_prefixes(self, prefix: str) -> list[str]:
        """Every key under prefix (paginated)."""

        def list_all() -> list[str]:
            keys: list[str] = []
            paginator = self.client.get_paginator("list_objects_v2")
            try:
                for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
                    keys.extend(obj["Key"] for obj in page.get("Contents", []))
            except ClientError as exc:
                if not _no_such_bucket(exc):
                    raise
                return []  # a bucket nobody has written to yet holds nothing (put creates it)
            return keys

        return self._with_retry(f"list {prefix}", list_all)


def _no_such_bucket(exc: ClientError) -> bool:
    return exc.response.get("Error", {}).get("Code") == "NoSuchBucket"


def _b64_sha256(data: bytes) -> str:
    # Sent with the PUT so the store itself rejects a body corrupted in transit.
    return base64.b64encode(hashlib.sha256(data).digest()).decode()


# --- manifests -----------------------------------------------------------------------------


def build_manifest(files: Mapping[str, bytes], extra: Mapping[str, Any] | None = None) -> bytes:
    body: dict[str, Any] = {
        "version": 1,
        "files": {name: {"sha256": sha256_hex(data), "size": len(data)} for name, data in files.items()},
    }
    if extra:
        body.update(extra)
    return json.dumps(body, sort_keys=True, indent=1).encode()


def write_with_manifest(
    store: ObjectStore, prefix: str, files: Mapping[str, bytes], manifest_name: str,
    extra: Mapping[str, Any] | None = None, commit_delay: float = 0.0,
) -> dict[str, Any]:
    """Write every file, then the manifest last: a reader never sees a manifest without its files."""
    for name, data in files.items():
        store.put(prefix + name, data)
    if commit_delay > 0:
        time.sleep(commit_delay)
    manifest = build_manifest(files, extra)
    store.put(prefix + manifest_name, manifest)
    return json.loads(manifest)


def verify_manifest(store: ObjectStore, prefix: str, manifest_name: str) -> tuple[dict[str, bytes], str | None]:
    """Read the files of a prefix and check them against its manifest.

    Returns (files, None) when complete, or ({}, reason) when the prefix is torn.
    Storage being unavailable propagates (a torn verdict must not be invented from an outage).
    """
    _, files, reason = _read_verified(store, prefix, manifest_name)
    return files, reason


def _read_verified(store: ObjectStore, prefix: str, manifest_name: str,
                   ) -> tuple[dict[str, Any], dict[str, bytes], str | None]:
    """(manifest, files, None) when complete, else ({}, {}, reason); the manifest is read once."""
    try:
        raw = store.get(prefix + manifest_name)
    except ObjectMissing:
        return {}, {}, f"{manifest_name} missing"
    try:
        manifest = json.loads(raw)
        listed: dict[str, dict[str, Any]] = manifest["files"]
        entries = sorted(listed.items())
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return {}, {}, f"{manifest_name} unreadable: {exc}"
    files: dict[str, bytes] = {}
    for name, meta in entries:
        try:
            data = store.get(prefix + name)
        except ObjectMissing:
            return {}, {}, f"{name} missing"
        if sha256_hex(data) != meta.get("sha256"):
            return {}, {}, f"{name} sha256 mismatch"
        files[name] = data
    return manifest, files, None


# --- checkpoints ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointRef:
    operation_id: str
    attempt: int
    step: int

    @property
    def prefix(self) -> str:
        return checkpoint_prefix(self.operation_id, self.attempt, self.step)


@dataclass(frozen=True)
class TornCheckpoint:
    ref: CheckpointRef
    reason: str


@dataclass(frozen=True)
class LoadedCheckpoint:
    ref: CheckpointRef
    files: dict[str, bytes]


def write_checkpoint(
    store: ObjectStore, operation_id: str, attempt: int, step: int, files: Mapping[str, bytes],
    commit_delay: float = 0.0,
) -> CheckpointRef:
    missing = set(CHECKPOINT_FILES) - set(files)
    if missing:
        raise ValueError(f"checkpoint is missing files: {sorted(missing)}")
    ref = CheckpointRef(operation_id, attempt, step)
    write_with_manifest(store, ref.prefix, files, CHECKPOINT_MANIFEST,
                        {"step": step, "attempt": attempt}, commit_delay=commit_delay)
    return ref


def list_checkpoints(store: ObjectStore, operation_id: str) -> list[CheckpointRef]:
    """All checkpoint prefixes of an operation (any attempt), newest step first."""
    refs: set[CheckpointRef] = set()
    for key in store.list_prefixes(f"checkpoints/{operation_id}/"):
        match = _STEP_PREFIX.match(key.rsplit("/", 1)[0] + "/")
        if match:
            refs.add(CheckpointRef(operation_id, int(match["n"]), int(match["step"])))
    # Highest step wins; at equal step the later attempt (both are complete copies of the same state).
    return sorted(refs, key=lambda r: (r.step, r.attempt), reverse=True)


def latest_complete_checkpoint(
    store: ObjectStore, operation_id: str
) -> tuple[LoadedCheckpoint | None, list[TornCheckpoint]]:
    """The newest checkpoint whose manifest verifies, plus the torn ones skipped on the way."""
    torn: list[TornCheckpoint] = []
    for ref in list_checkpoints(store, operation_id):
        if defects.enabled("torn-checkpoint-resume"):
            # SEEDED DEFECT: "the files are there, the manifest is a formality"
            found = _read_files_without_manifest(store, ref.prefix)
            if found is not None:
                return LoadedCheckpoint(ref, found), torn
        files, reason = verify_manifest(store, ref.prefix, CHECKPOINT_MANIFEST)
        if reason is None:
            return LoadedCheckpoint(ref, files), torn
        torn.append(TornCheckpoint(ref, reason))
    return None, torn


def _read_files_without_manifest(store: ObjectStore, prefix: str) -> dict[str, bytes] | None:
    """Only for the torn-checkpoint-resume seeded defect: every checkpoint file, unchecked."""
    try:
        return {name: store.get(prefix + name) for name in CHECKPOINT_FILES}
    except ObjectMissing:
        return None


# --- node-local checkpoints: the durable record of each (controlplane/workload/local.py) --


def local_record_key(operation_id: str, attempt: int, step: int) -> str:
    return f"local-checkpoints/{operation_id}/attempt-{attempt}/step-{step:08d}.json"


_LOCAL_RECORD = re.compile(
    r"^local-checkpoints/(?P<op>[^/]+)/attempt-(?P<n>\d+)/step-(?P<step>\d{8})\.json$")


@dataclass(frozen=True)
class LocalRecord:
    """A checkpoint kept on a node's own disk, as recorded in the store once its bytes were
    durable there: the checksums its local copy must match to be used."""
    ref: CheckpointRef
    files: dict[str, str]  # name -> sha256
    uploaded: bool  # its bytes are also in the store under ref.prefix

    @property
    def key(self) -> str:
        return local_record_key(self.ref.operation_id, self.ref.attempt, self.ref.step)


def write_local_record(store: ObjectStore, operation_id: str, attempt: int, step: int,
                       files: Mapping[str, bytes], *, slot: str, uploaded: bool) -> str:
    """Record a node-local checkpoint in the store (written only after its bytes are
    durable on the node: a record is the job's promise that the local copy survives)."""
    key = local_record_key(operation_id, attempt, step)
    store.put(key, build_manifest(files, {"step": step, "attempt": attempt, "slot": slot,
                                          "uploaded": uploaded}))
    return key


def local_records(store: ObjectStore, operation_id: str) -> list[LocalRecord]:
    """Every local-checkpoint record of an operation (any attempt), newest step first; an
    unreadable record is left out (it promises nothing)."""
    out = []
    for key in store.list_prefixes(f"local-checkpoints/{operation_id}/"):
        match = _LOCAL_RECORD.match(key)
        if not match:
            continue
        try:
            body = json.loads(store.get(key))
            files = {str(k): str(v["sha256"]) for k, v in body["files"].items()}
        except (ObjectMissing, ValueError, KeyError, TypeError, AttributeError):
            continue
        out.append(LocalRecord(CheckpointRef(operation_id, int(match["n"]), int(match["step"])),
                               files, bool(body.get("uploaded"))))
    return sorted(out, key=lambda r: (r.ref.step, r.ref.attempt), reverse=True)


# --- artifacts -----------------------------------------------------------------------------


def write_artifacts(
    store: ObjectStore, operation_id: str, attempt: int, files: Mapping[str, bytes],
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    missing = set(ARTIFACT_FILES) - set(files)
    if missing:
        raise ValueError(f"artifacts are missing files: {sorted(missing)}")
    return write_with_manifest(
        store, artifact_prefix(operation_id, attempt), files, ARTIFACT_MANIFEST, extra
    )


def verify_artifacts(store: ObjectStore, operation_id: str, attempt: int) -> tuple[dict[str, Any] | None, str | None]:
    """(completion manifest, None) when the artifacts are complete, else (None, reason)."""
    prefix = artifact_prefix(operation_id, attempt)
    manifest, files, reason = _read_verified(store, prefix, ARTIFACT_MANIFEST)
    if reason is not None:
        return None, reason
    if set(ARTIFACT_FILES) - set(files):
        return None, f"completion manifest lacks {sorted(set(ARTIFACT_FILES) - set(files))}"
    return manifest, None
