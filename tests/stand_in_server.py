"""A stand-in for ``vllm serve`` in tests of ``server_address``: the same ``--host``/``--port`` flags and
``VLLM_API_KEY`` variable; answers ``GET /v1/models`` with 200, or 401 without the key."""

import argparse
import os
from http.server import BaseHTTPRequestHandler, HTTPServer


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        key = os.environ.get("VLLM_API_KEY")
        allowed = key is None or self.headers.get("Authorization") == f"Bearer {key}"
        self.send_response(200 if allowed else 401)
        self.end_headers()
        self.wfile.write(b'{"data": []}' if allowed else b'{"error": "unauthorized"}')

    def log_message(self, *args: object) -> None:
        pass


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    options = parser.parse_args()
    HTTPServer((options.host, options.port), Handler).serve_forever()
