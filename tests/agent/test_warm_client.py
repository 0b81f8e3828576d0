"""The local runtime's warm parent makes each S3 endpoint's client once and its forked attempts
inherit it (storage.shared_s3_client, runtimes/zygote.py warm_client): the attempts still write
their artifacts, and warming never opens a connection (a socket shared across fork would mix
two processes' requests on one stream)."""

from __future__ import annotations

import socket
import time

import pytest

from controlplane import storage
from controlplane.runtimes.base import LaunchSpec, Outcome
from controlplane.runtimes.local import LocalRuntime
from controlplane.runtimes.zygote import warm_client
from tests.agent.agenttest import S3Server
from tests.runtimes.test_local_forkserver import wait_result


def test_one_client_per_endpoint_whatever_the_bucket() -> None:
    a = storage.shared_s3_client(storage.StorageConfig(endpoint_url="http://127.0.0.1:7", bucket="x"))
    b = storage.shared_s3_client(storage.StorageConfig(endpoint_url="http://127.0.0.1:7", bucket="y"))
    c = storage.shared_s3_client(storage.StorageConfig(endpoint_url="http://127.0.0.1:8"))
    assert a is b and a is not c
    assert c.meta.endpoint_url == "http://127.0.0.1:8"


def test_warming_makes_the_endpoints_client_without_connecting() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        warm_client(["--kind", "sleep", "--s3-endpoint", url, "--bucket", "b"])
        key = storage.StorageConfig(endpoint_url=url, bucket="")
        assert storage.shared_s3_client(key).meta.endpoint_url == url
        time.sleep(0.2)
        with pytest.raises(BlockingIOError):  # nobody connected: no socket to share across fork
            listener.accept()


def test_priming_writes_nothing_and_leaves_the_client_sending_for_real(moto: S3Server) -> None:
    """storage.prime_s3_client answers its put_object itself: nothing reaches the bucket, and
    its before-send hook is gone afterwards, so the next put is the server's."""
    client = storage.make_s3_client(storage.StorageConfig(endpoint_url=moto.endpoint))
    storage.prime_s3_client(client, moto.bucket)
    store = storage.ObjectStore(client, moto.bucket)
    assert store.list_prefixes("prime") == []
    store.put("after-priming", b"real")
    assert moto.store().get("after-priming") == b"real"


def test_forked_attempts_inherit_the_client_and_write_their_artifacts(moto: S3Server) -> None:
    rt = LocalRuntime(start_method="forkserver")
    try:
        ops = [f"op-warm-client-{i}-{time.monotonic_ns()}" for i in range(3)]
        for op in ops:
            res = wait_result(rt.start(LaunchSpec(
                operation_id=op, attempt_id="a", attempt_number=1, project="p", kind="sleep",
                image="x", params={"seconds": 0.1}, s3_endpoint=moto.endpoint,
                bucket=moto.bucket)), timeout=30)
            assert res.outcome is Outcome.SUCCEEDED, res.reason
        store = moto.store()
        for op in ops:
            manifest, reason = storage.verify_artifacts(store, op, 1)
            assert reason is None and manifest is not None
    finally:
        rt.close()
