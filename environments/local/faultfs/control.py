"""The control API on 127.0.0.1 (stdlib HTTP server, one thread per request):

* ``GET /faults``    -> the faults in effect and the unsynced state;
* ``PUT /faults``    -> replace the faults (JSON, fields as in spec.FaultSpec; left out = off);
  422 ``{"error", "field"}`` names a bad field;
* ``DELETE /faults`` -> no faults;
* ``POST /crash``    -> power loss: drop every unsynced write, truncation and creation;
  answers what was dropped (files and bytes);
* ``POST /sync``     -> sync(2) (which FUSE never sees): make everything durable;
* ``GET /metrics``   -> Prometheus text; ``GET /healthz``.
"""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from environments.local.faultfs.errors import InvalidFaultSpec
from environments.local.faultfs.fs import FaultFs
from environments.local.faultfs.spec import NO_FAULTS, parse_spec

MAX_BODY = 64 * 1024


class ControlServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, fs: FaultFs, source: str, mount: str) -> None:
        self.fs, self.source, self.mount = fs, source, mount
        super().__init__(("127.0.0.1", port), _Handler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def state(self) -> dict[str, Any]:
        fs = self.fs
        return {"faults": fs.spec.to_dict(), "active": fs.spec.active,
                "unsynced_bytes": fs.cache.held, "unsynced_files": fs.cache.files,
                "source": self.source, "mount": self.mount}


class _Handler(BaseHTTPRequestHandler):
    server: ControlServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return  # one line per request would drown the log during a game day

    def _send(self, status: int, body: object, content_type: str = "application/json") -> None:
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> object:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise InvalidFaultSpec("body", f"larger than {MAX_BODY} bytes")
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw or b"{}")
        except ValueError as exc:
            raise InvalidFaultSpec("body", f"not JSON: {exc}") from exc

    def _route(self, method: str) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        srv = self.server
        try:
            if path == "/faults" and method == "GET":
                self._send(200, srv.state())
            elif path == "/faults" and method == "PUT":
                srv.fs.set_faults(parse_spec(self._body()))
                self._send(200, srv.state())
            elif path == "/faults" and method == "DELETE":
                srv.fs.set_faults(NO_FAULTS)
                self._send(200, srv.state())
            elif path == "/crash" and method == "POST":
                self._send(200, srv.fs.crash().to_dict())
            elif path == "/sync" and method == "POST":
                files, nbytes = srv.fs.sync_all()
                self._send(200, {"synced_files": files, "synced_bytes": nbytes})
            elif path == "/metrics" and method == "GET":
                text = srv.fs.stats.render(srv.fs.cache.held, srv.fs.cache.files,
                                           srv.fs.spec.active)
                self._send(200, text, "text/plain; version=0.0.4")
            elif path == "/healthz" and method == "GET":
                self._send(200, {"ok": True})
            elif path in ("/faults", "/crash", "/sync", "/metrics", "/healthz"):
                self._send(405, {"error": f"{method} not allowed on {path}"})
            else:
                self._send(404, {"error": f"no route {path}"})
        except InvalidFaultSpec as exc:
            self._send(422, {"error": str(exc), "field": exc.field})

    def do_GET(self) -> None:
        self._route("GET")

    def do_PUT(self) -> None:
        self._route("PUT")

    def do_DELETE(self) -> None:
        self._route("DELETE")

    def do_POST(self) -> None:
        self._route("POST")
