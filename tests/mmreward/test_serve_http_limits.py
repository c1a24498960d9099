"""The reward server's HTTP front end under hostile clients (issue 28 item 15), on loopback.

The server is started as a user exposing it would: `mmreward serve --host 127.0.0.1 ...` in its own process
(the front end lives there, so its memory is that process's RSS from /proc), with small timeouts so the
slow-client tests run in seconds. It runs with `--engine local`: every limit here is enforced by the front end
before a request reaches either engine, and Ray adds ~10 s of start-up and a shutdown that, under a loaded
full suite, outlasted its 60 s wait; the Ray engine behind the same front end is tested in test_vlm_serve.py. Before the front end, one 200 MiB header line grew the server by 391 MiB
and slow or idle connections were never closed."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
import torch

import mmreward

pytest.importorskip("ray.serve")

from mmreward.serve import ServeConfig, encode_tensor  # noqa: E402

HEADER_TIMEOUT, IDLE_TIMEOUT, BODY_TIMEOUT, MAX_CONN = 1.5, 1.5, 2.0, 24


def _rss_kib(pid: int, field: str = "VmRSS") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


@pytest.fixture(scope="module")
def server():
    # a leading '-' on purpose: `--token=-...` must reach the server as a value, not a flag
    token = "-" + secrets.token_urlsafe(24)
    # --port 0: the server binds a free port itself and prints its URL (a port probed here and closed again
    # could be taken by another process, e.g. the other xdist worker, in the seconds the server takes to start)
    cmd = [sys.executable, "-m", "mmreward", "serve", "--reward", "mock", "--host", "127.0.0.1", "--port", "0",
           f"--token={token}", "--engine", "local", "--header-timeout-s", str(HEADER_TIMEOUT), "--idle-timeout-s", str(IDLE_TIMEOUT),
           "--body-timeout-s", str(BODY_TIMEOUT), "--max-connections", str(MAX_CONN),
           "--max-request-bytes", "200000"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)  # also keeps the pipe drained
    reader.start()
    url = None
    deadline = time.monotonic() + 240
    while True:
        if proc.poll() is not None:
            reader.join(timeout=10)
            pytest.fail(f"mmreward serve exited {proc.returncode}: {''.join(err)[-2000:]}")
        if url is None:  # the CLI prints its URL once the front end listens
            found = [m for line in list(err) if (m := re.search(r" at (http://127\.0\.0\.1:(\d+)) ", line))]
            url, port = (found[0][1], int(found[0][2])) if found else (None, None)
        try:
            if url is not None:
                with urllib.request.urlopen(url + "/healthz", timeout=5) as r:
                    if r.status == 200:
                        break
        except OSError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"mmreward serve did not answer /healthz within 240 s: {''.join(err)[-2000:]}")
        time.sleep(0.5)
    yield {"url": url, "port": port, "token": token, "pid": proc.pid}
    proc.send_signal(signal.SIGINT)  # the CLI stops the front end on Ctrl-C
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    reader.join(timeout=10)
    proc.stderr.close()


def _connect(server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server["port"]), timeout=10)


def _read_until_closed(sock: socket.socket, limit_s: float) -> tuple[bytes, float, bool]:
    """Everything the server sends until it closes the connection: (bytes, seconds, closed)."""
    t0, data = time.monotonic(), b""
    sock.settimeout(0.2)
    while time.monotonic() - t0 < limit_s:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return data, time.monotonic() - t0, True
        if not chunk:
            return data, time.monotonic() - t0, True
        data += chunk
    return data, time.monotonic() - t0, False


def _status(data: bytes) -> int | None:
    parts = data.split(b" ", 2)
    return int(parts[1]) if data.startswith(b"HTTP/1.1 ") and len(parts) > 1 else None


def _flood(sock: socket.socket, prefix: bytes, total: int) -> None:
    """Send `prefix` then up to `total` bytes of one endless line, until the server stops taking them."""
    chunk = b"a" * 2**20
    try:
        sock.sendall(prefix)
        for _ in range(total // len(chunk)):
            sock.sendall(chunk)
    except OSError:  # the server answered and closed: that is the point
        pass


def _post_score(server, prompts, media, token=None):
    body = json.dumps({"prompts": prompts, "media": encode_tensor(media)}).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token or server['token']}"}
    req = urllib.request.Request(server["url"] + "/score", data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


# ---------------------------------------------------------------------------------------------- sizes
@pytest.mark.parametrize("prefix,status", [
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ", 431),  # one endless header line
    (b"GET /healthz?q=", 414),  # one endless request line
])
def test_an_endless_line_is_refused_and_closed_without_memory_growth(server, prefix, status):
    pid = server["pid"]
    rss0, peak0 = _rss_kib(pid), _rss_kib(pid, "VmHWM")
    with _connect(server) as sock:
        sender = threading.Thread(target=_flood, args=(sock, prefix, 200 * 2**20))
        sender.start()
        data, _, closed = _read_until_closed(sock, 20)
        sender.join(timeout=30)
    assert _status(data) == status, data[:200]
    assert b"longer than 8192 bytes" in data and closed
    grew = (_rss_kib(pid) - rss0) / 1024
    peak_grew = (_rss_kib(pid, "VmHWM") - peak0) / 1024
    print(f"endless {status} line: server RSS {grew:+.2f} MiB, peak {peak_grew:+.2f} MiB")
    assert grew < 8 and peak_grew < 8, (grew, peak_grew)  # MiB; before the front end: +391 MiB


def test_many_connections_with_huge_headers_do_not_grow_the_server(server):
    """20 concurrent connections each send an 8 MiB header line (the campaign's 40 x 8 MiB grew it 321 MiB)."""
    pid = server["pid"]
    rss0, peak0 = _rss_kib(pid), _rss_kib(pid, "VmHWM")
    answers: list[bytes] = []

    def attack() -> None:
        with _connect(server) as sock:
            sender = threading.Thread(target=_flood, args=(sock, b"GET /healthz HTTP/1.1\r\nX-Big: ", 8 * 2**20))
            sender.start()
            answers.append(_read_until_closed(sock, 30)[0])
            sender.join(timeout=30)

    threads = [threading.Thread(target=attack) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert [_status(a) for a in answers] == [431] * 20
    grew, peak_grew = (_rss_kib(pid) - rss0) / 1024, (_rss_kib(pid, "VmHWM") - peak0) / 1024
    print(f"20 x 8 MiB header lines: server RSS {grew:+.2f} MiB, peak {peak_grew:+.2f} MiB")
    assert grew < 12 and peak_grew < 12, (grew, peak_grew)  # 20 connections' buffers and allocator slack


@pytest.mark.parametrize("headers,match", [
    ("".join(f"X-H{i}: v\r\n" for i in range(150)), b"more than 100 header fields"),
    ("".join(f"X-H{i}: {'v' * 4000}\r\n" for i in range(40)), b"larger than 65536 bytes"),
])
def test_too_many_or_too_large_headers_are_refused(server, headers, match):
    with _connect(server) as sock:
        sock.sendall(f"GET /healthz HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode())
        data, _, closed = _read_until_closed(sock, 10)
    assert _status(data) == 431 and match in data and closed, data[:300]


def test_the_token_is_checked_before_the_body_is_read(server):
    """A 50 MB body is declared but never sent: the wrong token gets 401 at once, the right one 413 at once."""
    for token, status in [("wrong", 401), (server["token"], 413)]:
        with _connect(server) as sock:
            sock.sendall(f"POST /score HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                         "Content-Type: application/json\r\nContent-Length: 50000000\r\n\r\n".encode())
            data, elapsed, closed = _read_until_closed(sock, 10)
        assert _status(data) == status and closed, data[:300]
        assert elapsed < BODY_TIMEOUT  # answered on the head, not after waiting for a body


# ---------------------------------------------------------------------------------------------- time
def test_a_slowloris_client_is_cut_at_the_header_deadline(server):
    with _connect(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        t0, data, closed = time.monotonic(), b"", False
        sock.settimeout(0.25)
        while time.monotonic() - t0 < 10:  # one byte every 0.25 s: never idle, never finishing its head
            try:
                sock.sendall(b"X")
            except OSError:
                closed = True
                break
            try:
                chunk = sock.recv(4096)
            except TimeoutError:
                continue
            except ConnectionResetError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            data += chunk
        elapsed = time.monotonic() - t0
    assert closed and _status(data) == 408, data[:200]
    assert HEADER_TIMEOUT - 0.3 < elapsed < HEADER_TIMEOUT + 2.5, elapsed


def test_a_slow_body_is_cut_at_the_body_deadline(server):
    with _connect(server) as sock:
        sock.sendall(f"POST /score HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {server['token']}\r\n"
                     "Content-Length: 1000\r\n\r\n{\"prompts\"".encode())
        data, elapsed, closed = _read_until_closed(sock, 10)
    assert _status(data) == 408 and closed, data[:200]
    assert BODY_TIMEOUT - 0.3 < elapsed < BODY_TIMEOUT + 2.5, elapsed


def test_idle_connections_are_closed(server):
    with _connect(server) as sock:  # connects and never sends
        data, elapsed, closed = _read_until_closed(sock, 10)
    assert closed and data == b"" and IDLE_TIMEOUT - 0.3 < elapsed < IDLE_TIMEOUT + 2.5, elapsed
    with _connect(server) as sock:  # one keep-alive request, then silence
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        data, elapsed, closed = _read_until_closed(sock, 10)
    assert _status(data) == 200 and b'"status":"ok"' in data.replace(b" ", b"")
    assert closed and IDLE_TIMEOUT - 0.3 < elapsed < IDLE_TIMEOUT + 2.5, elapsed


# ---------------------------------------------------------------------------------------------- service
def test_innocent_clients_score_while_attackers_hold_slow_and_huge_connections(server):
    local = mmreward.load("mock")
    stop = threading.Event()

    def slowloris() -> None:
        try:
            with _connect(server) as sock:
                sock.sendall(b"POST /score HTTP/1.1\r\n")
                while not stop.is_set():
                    sock.sendall(b"X")
                    time.sleep(0.2)
        except OSError:
            pass  # cut by the header deadline

    def flooder() -> None:
        with _connect(server) as sock:
            _flood(sock, b"POST /score HTTP/1.1\r\nX-Big: ", 64 * 2**20)

    attackers = [threading.Thread(target=slowloris) for _ in range(12)] + [threading.Thread(target=flooder)
                                                                          for _ in range(3)]
    for t in attackers:
        t.start()
    try:
        time.sleep(0.3)
        g = torch.Generator().manual_seed(0)
        for prompt in ["a red square", "two blue circles", "a green triangle"]:
            media = torch.rand(2, 3, 16, 16, generator=g)
            status, body = _post_score(server, prompt, media)
            assert status == 200, body
            assert body["scores"] == local.score(prompt, media).scores.tolist()  # bit-identical to in-process
        assert _post_score(server, "a red square", torch.rand(1, 3, 8, 8), token="wrong")[0] == 401
    finally:
        stop.set()
        for t in attackers:
            t.join(timeout=30)


def test_connections_beyond_the_cap_get_503_and_the_server_recovers(server):
    time.sleep(IDLE_TIMEOUT + 0.5)  # earlier tests' connections are gone
    held = [_connect(server) for _ in range(MAX_CONN)]
    try:
        time.sleep(0.3)  # all accepted
        with _connect(server) as extra:
            data, _, closed = _read_until_closed(extra, 5)
        assert _status(data) == 503 and b"max_connections=24" in data and closed, data[:200]
    finally:
        for s in held:
            s.close()
    time.sleep(0.3)
    with urllib.request.urlopen(server["url"] + "/healthz", timeout=10) as r:
        assert r.status == 200


# ---------------------------------------------------------------------------------------------- config
def test_limits_are_validated_and_reach_the_front_end():
    with pytest.raises(mmreward.ConfigError, match="max_headers must be >= 1"):
        ServeConfig(max_headers=0)
    with pytest.raises(mmreward.ConfigError, match="header_timeout_s must be > 0"):
        ServeConfig(header_timeout_s=0)
    from mmreward.cli import build_parser

    args = build_parser().parse_args(["serve", "--reward", "mock", "--max-headers", "7", "--idle-timeout-s", "0.5",
                                      "--max-header-line-bytes", "4096", "--max-connections", "3"])
    assert (args.max_headers, args.idle_timeout_s, args.max_header_line_bytes, args.max_connections) == (7, 0.5, 4096, 3)
    limits = ServeConfig(max_headers=7, max_request_bytes=1234).http_limits()
    assert limits.max_headers == 7 and limits.max_body_bytes == 1234
    d = ServeConfig()
    assert (d.max_header_line_bytes, d.max_headers, d.max_connections) == (8192, 100, 256)
