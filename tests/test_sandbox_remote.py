"""The remote sandbox client (``PythonSandbox.url``) against a stand-in SandboxFusion ``/run_code`` server the test
starts: its answers become the tool's results or counted failures, and a service that is down or answers nonsense
is a failure too, never an exception of another kind."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from lit_grpo.sandbox import CodeFailed, Limits, PythonSandbox

ANSWERS = {  # code -> SandboxFusion's answer
    "print(6 * 7)": {"status": "Success", "message": "", "run_result": {
        "status": "Finished", "return_code": 0, "stdout": "42\n", "stderr": ""}},
    "1/0": {"status": "Failed", "message": "", "run_result": {
        "status": "Finished", "return_code": 1, "stdout": "", "stderr": "ZeroDivisionError: division by zero\n"}},
    "while True: pass": {"status": "Failed", "message": "", "run_result": {
        "status": "TimeLimitExceeded", "return_code": None, "stdout": "", "stderr": ""}},
    "print('x' * 100)": {"status": "Success", "message": "", "run_result": {
        "status": "Finished", "return_code": 0, "stdout": "x" * 100 + "\n", "stderr": ""}},
    "broken": {"status": "SandboxError", "message": "no executor pod"},
}


class StandIn(BaseHTTPRequestHandler):
    requests: list[tuple[str, dict, dict]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        StandIn.requests.append((self.path, body, dict(self.headers)))
        answer = b"not json" if body["code"] == "nonsense" else json.dumps(ANSWERS[body["code"]]).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def remote():
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    kind = type("Remote", (PythonSandbox,), {"url": f"http://127.0.0.1:{server.server_port}/run_code",
                                             "headers": {"Authorization": "Bearer t"},
                                             "limits": Limits(wall_seconds=7, output_bytes=50)})
    StandIn.requests.clear()
    yield kind()
    server.shutdown()
    server.server_close()


def test_a_result_is_the_services_stdout_and_the_request_is_sandboxfusions(remote):
    remote.reset()
    assert remote.python("print(6 * 7)") == "42\n"
    path, body, headers = StandIn.requests[0]
    assert path == "/run_code" and body == {"code": "print(6 * 7)", "language": "python", "run_timeout": 7}
    assert headers["Authorization"] == "Bearer t"


@pytest.mark.parametrize("code, words", [("1/0", "exited with status 1 (Finished, the service says); its output:\n"
                                                  "ZeroDivisionError: division by zero"),
                                         ("while True: pass", "ran past its wall time of 7 s (the service says)"),
                                         ("print('x' * 100)", "wrote more than 50 bytes of output"),
                                         ("broken", "was not run by the sandbox service: no executor pod"),
                                         ("nonsense", "could not be run by the sandbox service at http://127.0.0.1")])
def test_each_failure_is_one_code_failed(remote, code, words):
    with pytest.raises(CodeFailed) as failure:
        remote.python(code)
    assert words in str(failure.value)


def test_a_service_that_is_down_is_a_failure():
    with socket.socket() as probe:  # a port nothing listens on: bound, then closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    kind = type("Down", (PythonSandbox,), {"url": f"http://127.0.0.1:{port}/run_code"})
    with pytest.raises(CodeFailed, match="Connection refused"):
        kind().python("print(1)")
