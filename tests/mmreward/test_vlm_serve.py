"""The Ray Serve reward server on loopback: auth, size limits (also of chunked bodies), health, concurrent
clients that must get exactly the in-process scores even while another client sends bad requests, and Ray's
own ports on loopback. One module-scoped server (Ray takes seconds to start) serving the `mock` reward with
on-demand failures (mmreward.testing.faulty)."""

from __future__ import annotations

import ipaddress
import json
import socket
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import mmreward

pytest.importorskip("ray.serve")

from mmreward.serve import RemoteRewardError, RewardClient, ServeConfig, encode_tensor  # noqa: E402


@pytest.fixture(scope="module")
def server():
    from mmreward.serve import shutdown, start

    # port 0: the front end binds a free port itself and start() returns it in the URL (a port probed here and
    # closed again could be taken by one of the ports Ray binds in the seconds it starts, before the front end
    # binds it). A 20 ms batch window so that concurrent requests really share reward calls
    cfg = ServeConfig(reward="mmreward.testing.faulty:FaultyMockReward", port=0, max_request_items=8,
                      max_request_bytes=400_000, max_batch_size=16, batch_wait_timeout_s=0.02)
    url = start(cfg, ray_init={"num_cpus": 2})
    yield url, cfg
    shutdown()


def _post(url, payload, token=None, *, raw: bytes | None = None):
    data = json.dumps(payload).encode() if raw is None else raw
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        text = exc.read()
        try:
            return exc.code, json.loads(text)
        except ValueError:  # a non-JSON error page is itself a failure of the JSON-error contract
            return exc.code, {"non_json_body": text[:200].decode(errors="replace")}


def test_config_defaults_are_safe():
    cfg = ServeConfig()
    assert cfg.host == "127.0.0.1" and cfg.auth and len(cfg.token) >= 24
    assert ServeConfig().token != cfg.token
    assert ServeConfig(auth=False).token is None
    with pytest.raises(mmreward.ConfigError, match="max_batch_size"):
        ServeConfig(max_batch_size=0)


def test_health_and_auth(server):
    url, cfg = server
    with urllib.request.urlopen(url + "/healthz", timeout=30) as r:
        info = json.loads(r.read())
    assert info["status"] == "ok" and info["reward"] == "faulty-mock"
    body = {"prompts": ["a red circle"], "media": encode_tensor(torch.rand(1, 3, 8, 8))}
    assert _post(url + "/score", body)[0] == 401
    assert _post(url + "/score", body, token="wrong")[0] == 401
    status, out = _post(url + "/score", body, token=cfg.token)
    assert status == 200 and len(out["scores"]) == 1
    with pytest.raises(RemoteRewardError, match="401"):
        RewardClient(url, token=None).score("a red circle", torch.rand(1, 3, 8, 8))


def test_oversize_requests_are_refused(server):
    url, cfg = server
    big = {"prompts": "x", "media": encode_tensor(torch.rand(1, 3, 200, 200))}  # ~640 kB of base64
    status, out = _post(url + "/score", big, token=cfg.token)
    assert status == 413 and "max_request_bytes" in out["error"]
    many = {"prompts": "x", "media": encode_tensor(torch.rand(9, 3, 4, 4))}
    status, out = _post(url + "/score", many, token=cfg.token)
    assert status == 413 and "max_request_items=8" in out["error"]
    status, out = _post(url + "/score", {"prompts": ["a", "b"], "media": encode_tensor(torch.rand(3, 3, 4, 4))},
                        token=cfg.token)
    assert status == 400 and "prompts" in out["error"]


def test_concurrent_clients_get_exact_in_process_scores(server):
    url, cfg = server
    local = mmreward.load("mock")
    client = RewardClient(url, cfg.token)
    g = torch.Generator().manual_seed(0)
    jobs = [(f"a {c} square", torch.rand(3, 3, 16, 16, generator=g)) for c in ["red", "blue", "green", "yellow"] * 4]

    def run(job):
        prompt, media = job
        return client.score(prompt, media).scores

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(run, jobs))
    for (prompt, media), got in zip(jobs, results):
        assert torch.equal(got, local.score(prompt, media).scores)
    pa = client.compare("a red square", jobs[0][1], jobs[1][1])
    torch.testing.assert_close(pa.prob_a, local.compare("a red square", jobs[0][1], jobs[1][1]).prob_a)
    scores, info = client.flow_grpo_scorer()(jobs[0][1] * 2 - 1, ["a red square"] * 3, {})
    assert info == {} and torch.equal(torch.from_numpy(scores), local.score("a red square", jobs[0][1]).scores)
    assert client.compute_score(["a red square"] * 3, jobs[0][1]) == local.score("a red square", jobs[0][1]).scores.tolist()


def test_a_bad_client_never_fails_innocent_clients(server):
    """Innocent requests run concurrently with NaN pixels, a 0x0 image, a reward that raises an untyped
    exception and one that yields NaN scores; same-shaped requests share reward calls."""
    url, cfg = server
    local = mmreward.load("mock")
    g = torch.Generator().manual_seed(1)
    innocent = [(f"a {c} square", torch.rand(2, 3, 8, 8, generator=g)) for c in ["red", "blue", "green"] * 10]
    nan_pixels = torch.rand(2, 3, 8, 8)
    nan_pixels[1, 0, 3, 3] = float("nan")
    bad = [  # (payload, status, text the error names)
        ({"prompts": "a red square", "media": encode_tensor(nan_pixels)}, 400, "NaN"),
        ({"prompts": "a red square", "media": encode_tensor(torch.zeros(1, 3, 0, 0))}, 400, "pixel"),
        ({"prompts": "raise-untyped", "media": encode_tensor(torch.rand(2, 3, 8, 8))}, 500, "RuntimeError"),
        ({"prompts": "nan-score", "media": encode_tensor(torch.rand(2, 3, 8, 8))}, 422, "non-finite"),
    ]
    jobs = [("ok", i) for i in range(len(innocent))]
    for k in range(len(jobs) // 3):  # a bad request every third job, each kind several times
        jobs.insert(3 * k + 1, ("bad", k % len(bad)))

    def run(job):
        kind, i = job
        if kind == "ok":
            prompt, media = innocent[i]
            return _post(url + "/score", {"prompts": prompt, "media": encode_tensor(media)}, token=cfg.token)
        return _post(url + "/score", bad[i][0], token=cfg.token)

    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(run, jobs))
    for (kind, i), (status, body) in zip(jobs, answers):
        if kind == "ok":
            prompt, media = innocent[i]
            assert status == 200, body
            assert body["scores"] == local.score(prompt, media).scores.tolist()
        else:
            assert status == bad[i][1] and bad[i][2] in body["error"], (bad[i][1], status, body)


@pytest.mark.parametrize("raw,match", [(b"[1, 2]", "JSON object"), (b"null", "JSON object"),
                                       (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
                                       (b"{not json", "not valid JSON"),
                                       (b'{"prompts": "x", "media": {"dtype": "float32", "shape": ["a"], "data": ""}}',
                                        "non-negative integers")])
def test_malformed_bodies_get_400_naming_the_problem(server, raw, match):
    url, cfg = server
    status, body = _post(url + "/score", None, token=cfg.token, raw=raw)
    assert status == 400 and match in body.get("error", ""), (status, body)


def _read_status(sock: socket.socket) -> int:
    head = b""
    while b"\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            break
        head += chunk
    return int(head.split(b" ", 2)[1])


def test_chunked_body_over_the_cap_is_refused_before_it_ends(server):
    """No Content-Length: the server must stop at the cap and answer 413 while the body is still coming."""
    url, cfg = server
    host, port = url.removeprefix("http://").rsplit(":", 1)
    chunk = b"A" * 65_536
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(f"POST /score HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {cfg.token}\r\n"
                     "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
        sock.sendall(b'%x\r\n{"media": "\r\n' % len(b'{"media": "'))
        sent = 0
        while sent <= cfg.max_request_bytes + 2 * len(chunk):  # past the cap, then hold the body open
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            sent += len(chunk)
        sock.settimeout(20)  # the old server waited for the final chunk, which never comes
        assert _read_status(sock) == 413


def _is_loopback(addr: str) -> bool:
    ip = ipaddress.ip_address(addr.split("%")[0])
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def test_ray_ports_listen_on_loopback_only(server):
    """Started through our entry point on 127.0.0.1, no Ray process (GCS, raylet, workers, agents, proxy)
    listens on another interface."""
    psutil = pytest.importorskip("psutil")
    me = psutil.Process()
    listening = []
    for proc in [me, *me.children(recursive=True)]:
        try:
            conns = proc.net_connections(kind="inet")
            name = proc.name()
        except psutil.Error:  # a process that exited meanwhile
            continue
        listening += [(name, c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]
    assert any(port == int(server[0].rsplit(":", 1)[1]) for _, _, port in listening)  # the walk sees the proxy
    exposed = [entry for entry in listening if not _is_loopback(entry[1])]
    assert not exposed, f"Ray sockets listening beyond loopback: {exposed}"
