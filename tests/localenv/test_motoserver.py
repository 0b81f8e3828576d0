"""The local S3 API server (environments/local/motoserver.py): moto's dispatcher with its host ->
backend lookup memoized answers exactly as moto's own, asks moto once per host, stays bounded,
and serves S3 end to end."""

from __future__ import annotations

import http.client
from pathlib import Path

import pytest
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

from controlplane import storage
from environments.local import motoserver
from environments.local.launch import spawn, wait_http
from environments.local.pgserver import free_port

HOSTS = [None, "moto_api", "s3", "s3.us-east-1.amazonaws.com", "ec2.eu-west-1.amazonaws.com",
         "sts.us-east-1.amazonaws.com", "iam.amazonaws.com", "nothing.example"]


def test_same_backend_as_moto_for_every_host() -> None:
    plain = DomainDispatcherApplication(create_backend_app)
    memo = motoserver.MemoizedDispatcher(create_backend_app)
    for host in HOSTS * 2:
        assert memo.get_backend_for_host(host) == plain.get_backend_for_host(host), host


def test_moto_is_asked_once_per_host_and_the_memo_is_bounded(monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    asked: list[str | None] = []
    real = DomainDispatcherApplication.get_backend_for_host

    def counting(self: DomainDispatcherApplication, host: str | None) -> object:
        asked.append(host)
        return real(self, host)

    monkeypatch.setattr(DomainDispatcherApplication, "get_backend_for_host", counting)
    memo = motoserver.MemoizedDispatcher(create_backend_app)
    for _ in range(3):
        assert memo.get_backend_for_host("s3.us-east-1.amazonaws.com") == "s3"
    assert asked == ["s3.us-east-1.amazonaws.com"]
    for i in range(motoserver._MAX_HOSTS + 10):
        memo.get_backend_for_host(f"h{i}.example")
    assert len(memo._backend_of) == motoserver._MAX_HOSTS


def test_serves_s3(tmp_path: Path) -> None:
    port = free_port()
    proc = spawn("moto", motoserver.command(port), tmp_path)
    try:
        endpoint = f"http://127.0.0.1:{port}"
        wait_http(endpoint + "/moto-api/", proc, 30)
        store = storage.ObjectStore.from_config(storage.StorageConfig(endpoint_url=endpoint))
        store.ensure_bucket()
        store.put("a/b.json", b"{}")
        assert store.get("a/b.json") == b"{}"
        with pytest.raises(storage.ObjectMissing):
            store.get("a/missing.json")
    finally:
        proc.stop()
    # request lines only for error answers (QuietHandler): the 404, not the 200s
    lines = [x for x in proc.log.read_text().splitlines() if '" ' in x and "HTTP/1" in x]
    assert [x for x in lines if "missing.json" in x and '" 404 ' in x], lines
    assert not [x for x in lines if '" 200 ' in x], lines


def test_keeps_connections_alive_and_stops_with_one_open(tmp_path: Path) -> None:
    """Requests of one client share a TCP connection (werkzeug's server closed it after every
    answer), and SIGTERM still ends the server at once while a client holds a connection."""
    port = free_port()
    proc = spawn("moto", motoserver.command(port), tmp_path)
    try:
        wait_http(f"http://127.0.0.1:{port}/moto-api/", proc, 30)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("PUT", "/kept-alive")
        first = conn.getresponse()
        first.read()
        sock = conn.sock
        conn.request("PUT", "/kept-alive/key", body=b"x")
        second = conn.getresponse()
        second.read()
        assert (first.status, second.status) == (200, 200)
        assert first.getheader("Connection", "").lower() != "close"
        assert sock is not None and conn.sock is sock, "the second request needed a new connection"
        proc.popen.terminate()
        assert proc.popen.wait(timeout=5) == 0
    finally:
        proc.stop()
