"""A stand-in for Prometheus's HTTP API in tests: answers /api/v1/query with the JSON shape a
real Prometheus returns (a vector per matching `slo="..."` selector; an SLO not in `answers`
gets an empty result, as when the series does not exist). Not a real Prometheus."""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class PromStub:
    def __init__(self, answers: dict[str, str | list[str]]) -> None:
        # SLO -> value, or one value per series
        self.answers: dict[str, str | list[str]] = answers
        self.queries: list[str] = []
        prom = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urllib.parse.urlparse(self.path)
                query = urllib.parse.parse_qs(url.query)["query"][0]
                prom.queries.append(query)
                result = [{"metric": {"slo": slo, "series": str(i)}, "value": [1.0, value]}
                          for slo, values in prom.answers.items() if f'slo="{slo}"' in query
                          for i, value in enumerate([values] if isinstance(values, str)
                                                    else values)]
                body = json.dumps({"status": "success",
                                   "data": {"resultType": "vector", "result": result}}).encode()
                self.send_response(200 if url.path == "/api/v1/query" else 404)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.closed = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.server.shutdown()
            self.server.server_close()


@contextmanager
def serving(answers: dict[str, str | list[str]] | None = None) -> Iterator[PromStub]:
    p = PromStub(answers or {})
    threading.Thread(target=p.server.serve_forever, daemon=True).start()
    try:
        yield p
    finally:
        p.close()
