"""Checkpoint/artifact layout, manifests and torn-checkpoint detection against a moto server."""

from __future__ import annotations

import json
import threading
import time

import pytest
from agenttest import S3Server

from controlplane import storage


def _files(tag: str) -> dict[str, bytes]:
    return {"weights.npy": f"w-{tag}".encode(), "optimizer.npz": f"o-{tag}".encode(),
            "state.json": json.dumps({"tag": tag}).encode()}


def test_checkpoint_layout_and_manifest_written_last(moto: S3Server, operation_id: str) -> None:
    store = moto.store()
    storage.write_checkpoint(store, operation_id, 2, 40, _files("a"))
    prefix = f"checkpoints/{operation_id}/attempt-2/step-00000040/"
    keys = sorted(store.list_prefixes(prefix))
    assert keys == [prefix + n for n in ("MANIFEST.json", "optimizer.npz", "state.json", "weights.npy")]
    manifest = json.loads(store.get(prefix + "MANIFEST.json"))
    assert manifest["files"]["weights.npy"]["sha256"] == storage.sha256_hex(b"w-a")
    assert manifest["step"] == 40
    # S3 keeps LastModified at 1 s resolution, so "last" is checked through the write order.
    calls: list[str] = []
    original = store.put
    store.put = lambda key, data: (calls.append(key), original(key, data))[1]  # type: ignore[method-assign]
    storage.write_checkpoint(store, operation_id, 2, 60, _files("b"))
    assert calls[-1].endswith("/MANIFEST.json") and len(calls) == 4


@pytest.mark.parametrize("damage", ["no_manifest", "checksum_mismatch", "file_missing", "garbage_manifest"])
def test_torn_newest_checkpoint_is_skipped_and_reported(
    moto: S3Server, operation_id: str, damage: str
) -> None:
    store = moto.store()
    storage.write_checkpoint(store, operation_id, 1, 20, _files("good"))
    torn_prefix = storage.checkpoint_prefix(operation_id, 1, 40)
    if damage == "no_manifest":  # killed between the files and the manifest
        for name, data in _files("torn").items():
            store.put(torn_prefix + name, data)
    else:
        storage.write_checkpoint(store, operation_id, 1, 40, _files("torn"))
        if damage == "checksum_mismatch":
            store.put(torn_prefix + "weights.npy", b"overwritten")
        elif damage == "file_missing":
            store.client.delete_object(Bucket=store.bucket, Key=torn_prefix + "optimizer.npz")
        else:
            store.put(torn_prefix + "MANIFEST.json", b"{not json")

    loaded, torn = storage.latest_complete_checkpoint(store, operation_id)

    assert loaded is not None and loaded.ref.step == 20
    assert loaded.files["weights.npy"] == b"w-good"
    assert [t.ref.step for t in torn] == [40]
    assert torn[0].reason  # says what was wrong


def test_latest_complete_checkpoint_spans_attempts(moto: S3Server, operation_id: str) -> None:
    store = moto.store()
    storage.write_checkpoint(store, operation_id, 1, 20, _files("a1"))
    storage.write_checkpoint(store, operation_id, 2, 40, _files("a2"))
    storage.write_checkpoint(store, operation_id, 2, 10, _files("old"))
    loaded, torn = storage.latest_complete_checkpoint(store, operation_id)
    assert loaded is not None and (loaded.ref.attempt, loaded.ref.step) == (2, 40)
    assert torn == []
    assert storage.latest_complete_checkpoint(store, "no-such-operation") == (None, [])


def test_artifacts_need_their_completion_manifest(moto: S3Server, operation_id: str) -> None:
    store = moto.store()
    prefix = storage.artifact_prefix(operation_id, 1)
    store.put(prefix + "model.npy", b"model")
    store.put(prefix + "metrics.json", b"{}")
    manifest, reason = storage.verify_artifacts(store, operation_id, 1)
    assert manifest is None and reason == "COMPLETE.json missing"

    storage.write_artifacts(store, operation_id, 1, {"model.npy": b"model", "metrics.json": b"{}"})
    manifest, reason = storage.verify_artifacts(store, operation_id, 1)
    assert reason is None and manifest is not None
    assert manifest["files"]["model.npy"]["sha256"] == storage.sha256_hex(b"model")

    with pytest.raises(ValueError, match="missing files"):
        storage.write_artifacts(store, operation_id, 2, {"model.npy": b"model"})


def test_verify_reads_the_manifest_and_each_file_once(moto: S3Server, operation_id: str) -> None:
    store = moto.store()
    storage.write_artifacts(store, operation_id, 1, {"model.npy": b"model", "metrics.json": b"{}"})
    reads: list[str] = []
    original = store.get
    store.get = lambda key: (reads.append(key), original(key))[1]  # type: ignore[method-assign]
    manifest, reason = storage.verify_artifacts(store, operation_id, 1)
    assert reason is None and manifest is not None and manifest["version"] == 1
    assert sorted(k.rsplit("/", 1)[1] for k in reads) == ["COMPLETE.json", "metrics.json", "model.npy"]


def test_a_missing_bucket_is_empty_and_created_by_the_first_write(moto: S3Server) -> None:
    bucket = f"fresh-{time.monotonic_ns()}"
    store = storage.ObjectStore.from_config(
        storage.StorageConfig(endpoint_url=moto.endpoint, bucket=bucket))
    assert store.list_prefixes("checkpoints/") == []
    with pytest.raises(storage.ObjectMissing):  # reading still tells a missing key apart
        store.get("artifacts/x")
    store.put("artifacts/x", b"1")
    assert store.get("artifacts/x") == b"1" and store.list_prefixes("artifacts/") == ["artifacts/x"]


def test_frozen_store_bounded_by_explicit_timeouts(private_moto: S3Server) -> None:
    """SIGSTOPped endpoint: each call times out fast and the deadline turns it into an error."""
    store = private_moto.store(deadline=1.0)
    private_moto.proc.freeze()
    started = time.monotonic()
    with pytest.raises(storage.StorageUnavailable, match="gave up"):
        store.put("probe", b"x")
    elapsed = time.monotonic() - started
    private_moto.proc.thaw()
    # One try with a 3 s read timeout, then the 1 s deadline: botocore's defaults (60 s read
    # timeout, several attempts) would hang for minutes here.
    assert elapsed < 8, elapsed


def test_write_retried_while_store_frozen_then_completes(private_moto: S3Server) -> None:
    """Storage unavailable: the write pauses, retries with backoff and lands after SIGCONT."""
    retries: list[int] = []
    store = private_moto.store()
    store.retry = storage.RetryPolicy(initial_backoff=0.1, max_backoff=0.3)
    store.on_retry = lambda key, n, exc: retries.append(n)
    private_moto.proc.freeze()
    threading.Timer(6.0, private_moto.proc.thaw).start()  # > one 3 s read timeout
    started = time.monotonic()
    storage.write_checkpoint(store, "frozen-op", 1, 10, _files("x"))
    assert time.monotonic() - started >= 5.5
    assert retries, "the frozen store should have caused at least one retry"
    loaded, torn = storage.latest_complete_checkpoint(store, "frozen-op")
    assert loaded is not None and loaded.ref.step == 10 and torn == []
