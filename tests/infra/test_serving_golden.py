"""The canary's golden-set check (provisioning/serving_golden.py, the ``golden-set`` analysis
Job) against a real HTTP server speaking the Open Inference Protocol v2 infer route, with the
golden set from a file and from S3 (a real moto server)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from provisioning.serving_golden import EXIT_FAIL, EXIT_PASS, EXIT_UNJUDGED, main, same_data
from tests.infra.motoserver import fresh_session

# the serving side's golden.json: rows and the outputs the model must give
GOLDEN = {"inputs": [[1.0, 2.0], [2.0, 2.0]], "expected": [3.0, 4.0]}


class Model:
    """What the fake server answers: sum of the input, named ``version``; ``bias`` skews it;
    ``status`` != 200 answers every request with that status."""

    def __init__(self) -> None:
        self.version, self.bias, self.status, self.requests = "2", 0.0, 200, []

    def answer(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self.requests.append((path, body))
        if self.status != 200:
            return self.status, {"error": "boom"}
        total = sum(body["inputs"][0]["data"]) + self.bias
        return 200, {"model_name": "clf", "model_version": self.version,
                     "outputs": [{"name": "output-0", "shape": [1], "datatype": "FP64",
                                  "data": [total]}]}


@pytest.fixture
def server() -> Iterator[tuple[str, Model]]:
    model = Model()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            status, answer = model.answer(self.path, body)
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", model
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def golden(tmp_path: Path) -> Path:
    path = tmp_path / "golden.json"
    path.write_text(json.dumps(GOLDEN))
    return path


def _run(url: str, golden: str, *extra: str) -> int:
    return main(["--url", url, "--model", "clf", "--version", "2", "--golden", golden,
                 "--timeout", "5", *extra])


def test_a_canary_answering_the_golden_set_passes(server: tuple[str, Model], golden: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    url, model = server
    assert _run(url, str(golden)) == EXIT_PASS
    assert "2/2 agree" in capsys.readouterr().out
    assert [p for p, _ in model.requests] == ["/v2/models/clf/infer"] * 2
    assert model.requests[0][1] == {"inputs": [{"name": "input-0", "shape": [1, 2],
                                                "datatype": "FP64", "data": [1.0, 2.0]}]}


@pytest.mark.parametrize(("change", "expected"), [
    ({"bias": 0.5}, "output 'output-0' is [3.5], expected [3.0]"),
    ({"version": "1"}, "answered by version '1', not '2'"),  # the old model answered
    ({"status": 503}, "HTTP 503"),
])
def test_a_canary_that_disagrees_fails(server: tuple[str, Model], golden: Path, change: dict,
                                       expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    url, model = server
    for key, value in change.items():
        setattr(model, key, value)
    assert _run(url, str(golden)) == EXIT_FAIL
    out = capsys.readouterr()
    assert expected in out.err and "FAIL" in out.out


def test_within_tolerance_agrees_and_min_agreement_counts(server: tuple[str, Model],
                                                          tmp_path: Path) -> None:
    url, model = server
    model.bias = 5e-7  # below the serving side's tolerance of 1e-6
    path = tmp_path / "g.json"
    path.write_text(json.dumps(GOLDEN))
    assert _run(url, str(path)) == EXIT_PASS
    model.bias = 0.0005
    assert _run(url, str(path)) == EXIT_FAIL
    assert _run(url, str(path), "--tolerance", "0.001") == EXIT_PASS
    model.bias = 0.0
    half = {**GOLDEN, "expected": [3.0, 9.0]}
    path.write_text(json.dumps(half))
    assert _run(url, str(path)) == EXIT_FAIL
    assert _run(url, str(path), "--min-agreement", "0.5") == EXIT_PASS


def test_an_unreachable_canary_fails(golden: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from environments.local.pgserver import free_port

    assert _run(f"http://127.0.0.1:{free_port()}", str(golden)) == EXIT_FAIL
    assert "no answer" in capsys.readouterr().err


@pytest.mark.parametrize(("content", "expected"), [
    (None, "cannot read the golden set"),
    ("not json", "not JSON"),
    (json.dumps({"inputs": [], "expected": []}), "the golden set is empty"),
    (json.dumps({"inputs": [[1.0]], "expected": []}), "must be lists of equal length"),
    (json.dumps({"inputs": [["a"]], "expected": [1.0]}), "inputs[0] must be a list of numbers"),
])
def test_no_usable_golden_set_is_never_a_pass(server: tuple[str, Model], tmp_path: Path,
                                              content: str | None, expected: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "golden.json"
    if content is not None:
        path.write_text(content)
    assert _run(server[0], str(path)) == EXIT_UNJUDGED
    assert expected in capsys.readouterr().err
    assert server[1].requests == []


def test_golden_set_from_s3(server: tuple[str, Model], moto: str,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    s3 = fresh_session(moto, monkeypatch, "eu-west-1").client("s3")
    s3.create_bucket(Bucket="artifacts", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    s3.put_object(Bucket="artifacts", Key="models/clf/2/golden.json", Body=json.dumps(GOLDEN).encode())
    assert _run(server[0], "s3://artifacts/models/clf/2/golden.json") == EXIT_PASS
    assert _run(server[0], "s3://artifacts/models/clf/3/golden.json") == EXIT_UNJUDGED


def test_same_data() -> None:
    assert same_data([[1.0, 2.0]], [1.0, 2.0000001], 1e-6)
    assert not same_data([1.0, 2.0], [1.0], 1.0)
    assert not same_data([float("nan")], [float("nan")], 1.0)
    assert same_data(["cat"], ["cat"], 0) and not same_data(["cat"], ["dog"], 0)


def test_the_job_modules_run_in_the_slim_control_plane_image() -> None:
    """Both Jobs run `python -m provisioning.<module>` in the control-plane image, which has the
    core dependencies only: every distribution importing them loads is in the core closure."""
    import importlib.metadata as md
    import subprocess
    import sys
    import tomllib

    from tests.floors.test_core_dependencies import REPO, _norm, core_closure

    def loaded(imports: str) -> set[str]:
        code = f"import sys{imports}; print(' '.join({{m.split('.')[0] for m in sys.modules}}))"
        return set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                  check=True, cwd=REPO).stdout.split())

    # what the interpreter's site hooks load anyway, and urllib3's optional brotli (imported
    # only when installed)
    new = loaded(", provisioning.serving_golden, provisioning.tracking_db, botocore.session") \
        - loaded("") - {"brotli", "_brotli"}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    allowed = core_closure(project["dependencies"]) | {_norm(project["name"])}
    owners = md.packages_distributions()
    outside = {m: owners[m] for m in new
               if m in owners and not {_norm(d) for d in owners[m]} & allowed}
    assert {"psycopg", "botocore"} <= new and outside == {}, outside
