"""The reward server's HTTP front end: a small HTTP/1.1 reverse proxy with hard limits, in front of Ray Serve.

Ray Serve's own proxy (uvicorn) buffers an unfinished request head without any bound, before any handler
(and so before our token check) runs, and it never closes slow or idle connections: one 200 MiB header
line grew it by 391 MiB. So `mmreward serve` binds this front end to `--host`:`--port` and runs Ray's proxy
on a private loopback port behind it. Everything a client sends is bounded here, before Ray sees a byte:

- the request line and each header line are at most `max_line_bytes` (414 / 431), the head has at most
  `max_headers` fields and `max_header_bytes` in all (431); reading stops at the limit (the stream reader
  pauses the socket), so an endless line costs a few KiB, not its length;
- a connection that sends nothing for `idle_timeout_s` (before its first request or between keep-alive
  requests) is closed; a head not complete `header_timeout_s` after its first byte gets 408 (slowloris);
- the bearer token is checked on the head, before any body byte is read (401, and the body is never read);
  the scorer routes (flow_grpo / verl-omni clients, which send no headers) also take it as `?token=`;
- a declared `Content-Length` above the body cap is refused before reading (413); a chunked body is counted
  while it is decoded and refused at the cap; the whole body must arrive within `body_timeout_s` (408);
- at most `max_connections` connections are served at once; one more is answered 503 and closed.

Only what a handler needs is forwarded (method, path, Content-Type, Authorization, the de-chunked body with
its exact Content-Length), over kept-alive loopback connections, so request smuggling between the two parsers
has nothing to use.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import re
import threading
from dataclasses import dataclass

from mmreward.errors import ConfigError, RewardInputError

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 token: header names and methods
_REASONS = {200: "OK", 100: "Continue", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
            405: "Method Not Allowed", 408: "Request Timeout", 413: "Content Too Large", 414: "URI Too Long",
            422: "Unprocessable Content", 431: "Request Header Fields Too Large", 500: "Internal Server Error",
            501: "Not Implemented", 502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout",
            505: "HTTP Version Not Supported"}
_LINGER_S = 2.0  # after an error answer, how long unread input is discarded so the client can read the answer
_LINGER_BYTES = 16 * 2**20  # ... and at most this much of it (discarded in 64 KiB reads: no memory grows)
_FORWARDED = ("content-type", "authorization", "accept")
_UPSTREAM_IDLE = 64  # kept-alive connections to Ray's proxy (a new TCP connection per request costs ~30%)


@dataclass(frozen=True)
class HTTPLimits:
    """Bounds on what one client may make the front end hold, and for how long."""

    max_line_bytes: int = 8192  # request line and each header line, CRLF included
    max_headers: int = 100  # header fields per request
    max_header_bytes: int = 64 * 1024  # the whole head
    max_body_bytes: int = 64 * 2**20  # request body (ServeConfig.max_request_bytes)
    header_timeout_s: float = 10.0  # from a request's first byte to the end of its head
    idle_timeout_s: float = 5.0  # waiting for a request's first byte (new or kept-alive connection)
    body_timeout_s: float = 120.0  # the whole body, and writing the answer back
    max_connections: int = 256  # connections served at once
    upstream_timeout_s: float = 600.0  # the reward's answer (a VLM judge can be slow)

    def __post_init__(self) -> None:
        ints = ("max_line_bytes", "max_headers", "max_header_bytes", "max_body_bytes", "max_connections")
        for name in ints:
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("header_timeout_s", "idle_timeout_s", "body_timeout_s", "upstream_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0 seconds, got {getattr(self, name)}")
        if self.max_line_bytes < 64:
            raise ConfigError(f"max_line_bytes must be >= 64 to hold a request line, got {self.max_line_bytes}")


class HTTPProtocolError(RewardInputError):
    """A request the front end refuses before forwarding it; `status` is the HTTP answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Head:
    """A parsed request (or response) head; header names lower-cased, in arrival order."""

    start: tuple[str, str, str]  # (method, target, version) or (version, status, reason)
    headers: list[tuple[str, str]]

    def all(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k == name]

    def get(self, name: str) -> str | None:
        values = self.all(name)
        return values[0] if values else None

    def keep_alive(self) -> bool:
        tokens = {t.strip().lower() for v in self.all("connection") for t in v.split(",")}
        if self.start[2] == "HTTP/1.0":
            return "keep-alive" in tokens
        return "close" not in tokens


# ----------------------------------------------------------------------------------------------
# reading: bounded lines, heads and bodies
# ----------------------------------------------------------------------------------------------
async def read_line(reader: asyncio.StreamReader, limit: int, what: str, status: int = 431) -> bytes:
    """One CRLF-terminated line of at most `limit` bytes; the reader's own limit stops buffering beyond it."""
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.LimitOverrunError:
        raise HTTPProtocolError(status, f"{what} longer than {limit} bytes") from None
    except asyncio.IncompleteReadError:
        raise HTTPProtocolError(400, f"connection closed in the middle of the {what}") from None
    if len(line) > limit:
        raise HTTPProtocolError(status, f"{what} longer than {limit} bytes")
    return line[:-2] if line.endswith(b"\r\n") else line[:-1]


async def read_head(reader: asyncio.StreamReader, limits: HTTPLimits, first: bytes = b"", *,
                    request: bool = True) -> Head:
    """A request head (`request=True`) or a response head, every line and the whole bounded by `limits`.

    `first` is a byte already read from the stream (the one that ended the idle wait).
    """
    what = "request line" if request else "status line"
    line = first + await read_line(reader, limits.max_line_bytes, what, 414 if request else 502)
    for _ in range(4):  # RFC 9112 2.2: ignore a few empty lines before a request line
        if line:
            break
        line = await read_line(reader, limits.max_line_bytes, what, 414 if request else 502)
    parts = line.split(b" ", 2)
    if len(parts) != 3:
        raise HTTPProtocolError(400, f"malformed {what} {line[:80]!r}")
    if request:
        method, target, version = parts
        if not _TOKEN.fullmatch(method) or not target.startswith(b"/") or not target.isascii() or b" " in target:
            raise HTTPProtocolError(400, f"malformed request line {line[:80]!r}; expected 'METHOD /path HTTP/1.1'")
        if version not in (b"HTTP/1.1", b"HTTP/1.0"):
            raise HTTPProtocolError(505, f"unsupported HTTP version {version[:16]!r}; use HTTP/1.1")
        start = (method.decode(), target.decode(), version.decode())
    else:
        start = (parts[0].decode("latin-1"), parts[1].decode("latin-1"), parts[2].decode("latin-1"))
    total, headers = len(line), []
    while True:
        raw = await read_line(reader, limits.max_line_bytes, "header line")
        total += len(raw) + 2
        if total > limits.max_header_bytes:
            raise HTTPProtocolError(431, f"request head larger than {limits.max_header_bytes} bytes")
        if not raw:
            return Head(start, headers)
        if len(headers) >= limits.max_headers:
            raise HTTPProtocolError(431, f"more than {limits.max_headers} header fields")
        if raw[:1] in (b" ", b"\t"):  # obsolete line folding: refused (RFC 9112 5.2)
            raise HTTPProtocolError(400, "folded header lines are not accepted")
        name, sep, value = raw.partition(b":")
        if not sep or not _TOKEN.fullmatch(name):
            raise HTTPProtocolError(400, f"malformed header line {raw[:80]!r}")
        headers.append((name.decode().lower(), value.strip(b" \t").decode("latin-1")))


def body_length(head: Head, limit: int) -> int | None:
    """The declared body length (None: chunked), refused before any body byte is read when above `limit`."""
    te, cl = head.all("transfer-encoding"), head.all("content-length")
    if te and cl:  # both: the classic smuggling ambiguity
        raise HTTPProtocolError(400, "both Transfer-Encoding and Content-Length given; send one")
    if te:
        if ",".join(te).strip().lower() != "chunked":
            raise HTTPProtocolError(501, f"Transfer-Encoding {','.join(te)[:40]!r} not supported; use chunked")
        return None
    values = {v.strip() for item in cl for v in item.split(",")}
    if not values:
        return 0
    if len(values) != 1 or not re.fullmatch(r"[0-9]{1,19}", next(iter(values))):
        raise HTTPProtocolError(400, f"invalid Content-Length {sorted(values)[:3]}")
    n = int(next(iter(values)))
    if n > limit:
        raise HTTPProtocolError(413, f"request body of {n} bytes exceeds max_request_bytes={limit}; "
                                     "split it into smaller requests")
    return n


async def read_body(reader: asyncio.StreamReader, length: int | None, limits: HTTPLimits, limit: int) -> bytes:
    """A body of `length` bytes, or a chunked body counted as it is decoded and refused past `limit`."""
    try:
        if length is not None:
            return await reader.readexactly(length)
        out = bytearray()
        while True:
            size_line = await read_line(reader, limits.max_line_bytes, "chunk size line", 400)
            size_hex = size_line.split(b";", 1)[0].strip()
            if not re.fullmatch(rb"[0-9A-Fa-f]{1,16}", size_hex):
                raise HTTPProtocolError(400, f"malformed chunk size {size_line[:40]!r}")
            size = int(size_hex, 16)
            if size == 0:
                for _ in range(limits.max_headers + 1):  # trailer fields, ignored
                    if not await read_line(reader, limits.max_line_bytes, "trailer line"):
                        return bytes(out)
                raise HTTPProtocolError(431, f"more than {limits.max_headers} trailer fields")
            if len(out) + size > limit:
                raise HTTPProtocolError(413, f"request body exceeds max_request_bytes={limit} (stopped reading at "
                                             f"{len(out)} bytes); split it into smaller requests")
            out += await reader.readexactly(size)
            if await reader.readexactly(2) != b"\r\n":
                raise HTTPProtocolError(400, "chunk not followed by CRLF")
    except asyncio.IncompleteReadError:
        raise HTTPProtocolError(400, "connection closed in the middle of the request body") from None


SCORER_ROUTES = ("", "scorer")  # the scorer protocol: POST / (flow_grpo posts to the server root), POST /scorer


def route_name(target: str) -> str:
    """The last path segment of a request target ('' for the root): /score, /v1/score -> 'score'."""
    path = target.split("?", 1)[0].rstrip("/")
    return path.rsplit("/", 1)[-1] if path else ""


def query_token(target: str) -> str | None:
    """`token=` in the query string (flow_grpo's and verl-omni's scorer clients send no headers)."""
    from urllib.parse import parse_qs

    values = parse_qs(target.partition("?")[2]).get("token")
    return values[0] if values and len(values) == 1 else None


def token_ok(expected: str | None, authorization: str | None, target: str) -> bool:
    """The bearer token, or for the scorer routes the URL's `?token=`; constant-time comparisons."""
    if expected is None:
        return True
    want = f"Bearer {expected}".encode()
    if authorization is not None and hmac.compare_digest(authorization.encode("latin-1", "replace"), want):
        return True
    given = query_token(target) if route_name(target) in SCORER_ROUTES else None
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def is_open_route(method: str, path: str) -> bool:
    """Routes served without a token: the deployment's health check (same test as its handler)."""
    return method == "GET" and path.rstrip("/").endswith("/healthz")


# ----------------------------------------------------------------------------------------------
# the front end
# ----------------------------------------------------------------------------------------------
class FrontEnd:
    """The listening side of `mmreward serve`, forwarding bounded requests to `upstream` (host, port)."""

    def __init__(self, host: str, port: int, upstream: tuple[str, int] | None, *, token: str | None,
                 limits: HTTPLimits, app=None) -> None:
        """`upstream`: Ray Serve's proxy to forward to; or `app`, an async callable (method, target,
        authorization, body) -> (status, content type, body bytes) served in this process (engine="local")."""
        if (upstream is None) == (app is None):
            raise ConfigError("FrontEnd: give exactly one of upstream (host, port) and app")
        self.host, self.port, self.upstream, self.app = host, port, upstream, app
        self.token, self.limits = token, limits
        self.active = 0  # connections being served (read from other threads only for tests and logs)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._thread: threading.Thread | None = None
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []  # kept-alive upstream connections

    # --- lifecycle: an event loop of its own in a daemon thread, so the caller's code stays synchronous
    def start(self) -> int:
        """Listen (in a background thread) and return the bound port."""
        ready: dict = {}
        started = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)  # this thread's loop, for the helpers that look it up
            self._loop = loop
            try:
                # the reader's limit bounds what readuntil buffers: a line past it stops the socket reads
                self._server = loop.run_until_complete(asyncio.start_server(
                    self._connection, self.host, self.port, limit=self.limits.max_line_bytes + 2))
                ready["port"] = self._server.sockets[0].getsockname()[1]
            except OSError as exc:
                ready["error"] = exc
                started.set()
                loop.close()
                return
            started.set()
            loop.run_forever()
            pending = asyncio.all_tasks(loop)  # cancelled by stop(): let them unwind before closing the loop
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

        self._thread = threading.Thread(target=run, name="mmreward-http-front", daemon=True)
        self._thread.start()
        started.wait()
        if "error" in ready:
            raise ConfigError(f"cannot listen on {self.host}:{self.port}: {ready['error']}")
        self.port = ready["port"]
        return self.port

    def stop(self) -> None:
        loop, server = self._loop, self._server
        if loop is None or server is None or loop.is_closed():
            return

        async def close() -> None:
            server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()
            loop.stop()

        asyncio.run_coroutine_threadsafe(close(), loop)
        if self._thread is not None:
            self._thread.join(timeout=10)

    # --- one connection
    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.active >= self.limits.max_connections:
            await self._refuse(reader, writer, 503, f"too many connections (max_connections="
                                                    f"{self.limits.max_connections}); retry later")
            return
        self.active += 1
        try:
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away
        finally:
            self.active -= 1
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        lim = self.limits
        while True:
            try:  # idle: nothing yet of the next request
                first = await asyncio.wait_for(reader.readexactly(1), lim.idle_timeout_s)
            except (asyncio.TimeoutError, asyncio.IncompleteReadError):
                return  # idle too long, or closed between requests: close without an answer
            try:
                head = await asyncio.wait_for(read_head(reader, lim, first), lim.header_timeout_s)
                method, target, _ = head.start
                path = target.split("?", 1)[0]
                if not is_open_route(method, path):
                    self._check_token(head)  # before any body byte is read
                if method not in ("GET", "POST"):
                    raise HTTPProtocolError(405, f"method {method} not allowed; use GET /healthz, /metrics or "
                                                 "POST /score, /compare, /scorer")
                length = body_length(head, lim.max_body_bytes)
                if length is None or length > 0:
                    if "100-continue" in (head.get("expect") or "").lower():
                        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    body = await asyncio.wait_for(read_body(reader, length, lim, lim.max_body_bytes),
                                                  lim.body_timeout_s)
                else:
                    body = b""
            except asyncio.TimeoutError:
                await self._refuse(reader, writer, 408, "request not received in time (header_timeout_s="
                                                        f"{lim.header_timeout_s}, body_timeout_s={lim.body_timeout_s})")
                return
            except HTTPProtocolError as exc:
                await self._refuse(reader, writer, exc.status, str(exc))
                return
            status, ctype, data = await self._forward(head, body)
            keep = head.keep_alive()
            await asyncio.wait_for(self._write(writer, status, ctype, data, keep), lim.body_timeout_s)
            if not keep:
                return

    def _check_token(self, head: Head) -> None:
        given = head.all("authorization")
        if len(given) > 1 or not token_ok(self.token, given[0] if given else None, head.start[1]):
            raise HTTPProtocolError(401, "missing or wrong bearer token (Authorization: Bearer <token>, or "
                                         "?token= on the scorer routes)")

    async def _write(self, writer: asyncio.StreamWriter, status: int, ctype: str, data: bytes, keep: bool) -> None:
        head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(data)}\r\nConnection: {'keep-alive' if keep else 'close'}\r\n\r\n")
        writer.write(head.encode("latin-1") + data)
        await writer.drain()

    async def _refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, status: int,
                      message: str) -> None:
        """Answer an error, then close: input still arriving is discarded for a moment (not buffered), so the
        client can read the answer instead of a connection reset."""
        try:
            data = json.dumps({"error": message}).encode()
            await asyncio.wait_for(self._write(writer, status, "application/json", data, False), _LINGER_S)
            if writer.can_write_eof():
                writer.write_eof()

            async def drain_input() -> None:
                dropped = 0
                while dropped < _LINGER_BYTES:
                    chunk = await reader.read(65536)
                    if not chunk:
                        return
                    dropped += len(chunk)

            await asyncio.wait_for(drain_input(), _LINGER_S)
        except (asyncio.TimeoutError, ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def _forward(self, head: Head, body: bytes) -> tuple[int, str, bytes]:
        """(status, content type, body) of the upstream's answer; 502/504 JSON when it fails."""
        try:
            if self.app is not None:
                method, target, _ = head.start
                auth = head.get("authorization")
                return await asyncio.wait_for(self.app(method, target, auth, body), self.limits.upstream_timeout_s)
            return await asyncio.wait_for(self._upstream(head, body), self.limits.upstream_timeout_s)
        except asyncio.TimeoutError:
            return 504, "application/json", json.dumps({"error": "the reward did not answer within "
                                                                 f"{self.limits.upstream_timeout_s} s"}).encode()
        except (OSError, HTTPProtocolError, asyncio.IncompleteReadError, ValueError) as exc:
            return 502, "application/json", json.dumps({"error": "the reward backend failed to answer "
                                                                 f"({type(exc).__name__})"}).encode()

    async def _upstream(self, head: Head, body: bytes) -> tuple[int, str, bytes]:
        """Send one request upstream on a kept-alive connection (a fresh one when none is idle, or when the
        idle one turns out closed: scoring has no side effects, so that single retry is safe)."""
        while True:
            conn = None
            while self._idle and conn is None:
                reader, writer = self._idle.pop()
                conn = None if reader.at_eof() or writer.is_closing() else (reader, writer)
            fresh = conn is None
            if fresh:
                conn = await asyncio.open_connection(*self.upstream, limit=self.limits.max_line_bytes * 8)
            reader, writer = conn
            try:
                status, ctype, data, reusable = await self._exchange(reader, writer, head, body)
            except (OSError, HTTPProtocolError, asyncio.IncompleteReadError):
                writer.close()
                if fresh:
                    raise
                continue
            if reusable and len(self._idle) < _UPSTREAM_IDLE:
                self._idle.append(conn)
            else:
                writer.close()
            return status, ctype, data

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: Head,
                        body: bytes) -> tuple[int, str, bytes, bool]:
        host, port = self.upstream
        method, target, _ = head.start
        lines = [f"{method} {target} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(body)}"]
        lines += [f"{k.title()}: {v}" for k, v in head.headers if k in _FORWARDED]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        await writer.drain()
        # the upstream is our own Ray proxy: trusted, but its answer is still read with bounds
        up_limits = HTTPLimits(max_line_bytes=self.limits.max_line_bytes * 8, max_headers=200)
        resp = await read_head(reader, up_limits, request=False)
        status = int(resp.start[1])
        ctype = resp.get("content-type") or "application/json"
        response_cap = 4 * self.limits.max_body_bytes + 2**20  # scores and details are far smaller
        length = body_length(resp, response_cap)
        closes = "close" in (resp.get("connection") or "").lower() or resp.start[0] != "HTTP/1.1"
        if length is None:
            data = await read_body(reader, None, up_limits, response_cap)
        elif resp.get("content-length") is not None:
            data = await reader.readexactly(length)
        else:  # neither: the body runs to the end of the connection
            data, closes = await reader.read(response_cap), True
        return status, ctype, data, not closes
