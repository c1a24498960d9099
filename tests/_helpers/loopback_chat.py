"""A loopback OpenAI-compatible /chat/completions server for backend tests; subclasses script the replies."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class LoopbackChatServer:
    """Records every request as (path, headers, body) and answers with `reply(body)` -> (status, JSON dict)."""

    delay = 0.0  # seconds to wait before answering (timeout tests)

    def __init__(self):
        self.requests: list[tuple[str, dict, dict]] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.requests.append((self.path, dict(self.headers), body))
                    status, payload = server.reply(body, len(server.requests))
                if server.delay:
                    time.sleep(server.delay)
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out first; nothing to deliver

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    @property
    def bodies(self) -> list[dict]:
        return [r[2] for r in self.requests]

    def reply(self, body: dict, n_seen: int) -> tuple[int, dict]:
        """(HTTP status, JSON reply) for a request; n_seen counts requests so far, this one included."""
        raise NotImplementedError

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
