"""Load test of `mmreward serve` on loopback: throughput and latency against in-process scoring.

Scores the same requests in this process (one after another), then for each `--replicas` count starts the
Ray Serve reward server on 127.0.0.1 (a free port) and runs `--clients` threads that each send `--requests`
score requests of `--items` images. Prints, per mode, requests/s, items/s, per-request latency p50/p99 and
how many responses equal the in-process scores exactly (bit for bit) and the largest absolute difference.

    python benchmarks/serve_load.py --reward mock --clients 8 --requests 20 --replicas 1 2
    # a judge whose time is per call (a GPU batch): the server's dynamic batching and replicas pay off
    python benchmarks/serve_load.py --reward mmreward.testing.slow:SleepingReward --option sleep_s=0.05
    python benchmarks/serve_load.py --overlap      # also the trainer's overlap ratio (benchmarks/reward_overlap.py)
    python benchmarks/serve_load.py --reward vqascore --weights random --option tiny=true --clients 4
    python benchmarks/serve_load.py --reward mock --bad-every 4   # a bad client among innocent ones

With `--bad-every K`, one more request after every K innocent ones sends NaN pixels or a 0x0 image of the
same batch (raw HTTP: the client would refuse them locally); it prints how many bad requests were refused
with a 4xx and how many innocent requests failed (the server must keep that at 0).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch


def _percentiles(latencies: Sequence[float]) -> tuple[float, float]:
    """(p50, p99) in milliseconds, by linear interpolation between order statistics (numpy's default)."""
    import numpy as np

    arr = np.asarray(latencies, dtype=np.float64) * 1e3
    return float(np.percentile(arr, 50)), float(np.percentile(arr, 99))


def _in_process(reward, jobs) -> dict:
    """The same requests scored in this process, one after another (a reward is not thread-safe)."""
    reward.score(*jobs[0])  # warm-up
    lat, out = [], []
    t0 = time.perf_counter()
    for prompt, media in jobs:
        t1 = time.perf_counter()
        out.append(reward.score(prompt, media).scores)
        lat.append(time.perf_counter() - t1)
    wall = time.perf_counter() - t0
    return {"wall": wall, "latencies": lat, "scores": out}


def _serve_run(args, cfg_kwargs: dict, replicas: int, jobs, bad) -> dict:
    from mmreward.serve import RemoteRewardError, RewardClient, ServeConfig, shutdown, start

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = ServeConfig(**cfg_kwargs, port=port, num_replicas=replicas)
    t0 = time.perf_counter()
    url = start(cfg)
    print(f"[{replicas} replica(s)] server up in {time.perf_counter() - t0:.1f}s at {url}")
    try:
        client = RewardClient(url, cfg.token)
        for job in jobs[: 2 * replicas]:  # warm-up: every replica loads its reward lazily on its first call
            client.score(*job)
        order = []
        for i in range(len(jobs)):
            order.append(("ok", i))
            if args.bad_every and (i + 1) % args.bad_every == 0:
                order.append(("bad", i % len(bad)))

        def run(job):
            kind, i = job
            t1 = time.perf_counter()
            try:
                if kind == "ok":
                    return client.score(*jobs[i]).scores, time.perf_counter() - t1
                client._request("POST", "/score", bad[i])
                return "accepted", 0.0  # a bad request that was scored
            except RemoteRewardError as exc:
                return exc, time.perf_counter() - t1

        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=args.clients) as pool:
            answers = list(pool.map(run, order))
        wall = time.perf_counter() - t0
    finally:
        shutdown()
    ok = [(a, lat) for (kind, _), (a, lat) in zip(order, answers) if kind == "ok"]
    failed = [a for a, _ in ok if isinstance(a, Exception)]
    if args.bad_every:
        refused = sum(isinstance(a, RemoteRewardError) and " 400:" in str(a)
                      for (kind, _), (a, _) in zip(order, answers) if kind == "bad")
        print(f"[{replicas} replica(s)] bad requests refused with 400: {refused}/{len(order) - len(jobs)}; "
              f"innocent requests failed: {len(failed)}/{len(jobs)}")
    if failed:
        print(f"first innocent failure: {failed[0]}")
    scores = [torch.full((args.items,), float("nan")) if isinstance(a, Exception) else a for a, _ in ok]
    return {"wall": wall, "latencies": [lat for a, lat in ok if not isinstance(a, Exception)], "scores": scores,
            "failed": len(failed)}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reward", default="mock")
    p.add_argument("--weights", default="pretrained", choices=["pretrained", "random"])
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--clients", type=int, default=8, help="concurrent client threads (loopback only, bounded)")
    p.add_argument("--requests", type=int, default=20, help="requests per client")
    p.add_argument("--items", type=int, default=2, help="images per request")
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--replicas", type=int, nargs="+", default=[1, 2], help="server replica counts to measure")
    p.add_argument("--bad-every", type=int, default=0, metavar="K",
                   help="also send a bad request (NaN pixels / 0x0 image) after every K innocent ones (0: none)")
    p.add_argument("--overlap", action="store_true",
                   help="also run benchmarks/reward_overlap.py (trainer iteration, synchronous vs overlapped)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if not 1 <= args.clients <= 64:
        p.error("--clients must be in [1, 64]")
    if any(not 1 <= r <= 16 for r in args.replicas):
        p.error("--replicas must be in [1, 16]")

    import mmreward
    from mmreward.serve import encode_tensor

    options = {}
    for kv in args.option:
        k, _, v = kv.partition("=")
        try:
            options[k] = json.loads(v)
        except json.JSONDecodeError:
            options[k] = v
    local = mmreward.load(args.reward, weights=args.weights, **options)
    prompts = ["a red circle", "two blue squares", "a green triangle", "a photo of a cat"]
    g = torch.Generator().manual_seed(0)
    shape = (args.items, 3, args.size, args.size) if "image" in local.modalities else (args.items, 4, 3, args.size, args.size)
    jobs = [(prompts[i % 4], torch.rand(*shape, generator=g)) for i in range(args.clients * args.requests)]
    nan_media = torch.rand(*shape, generator=g)
    nan_media.view(-1)[0] = float("nan")
    bad = [{"prompts": prompts[0], "media": encode_tensor(nan_media)},
           {"prompts": prompts[0], "media": encode_tensor(torch.zeros(1, *shape[1:-2], 0, 0))}]
    n = len(jobs)
    rows = []

    def report(name: str, res: dict, exact: int | None, max_diff: float | None) -> None:
        p50, p99 = _percentiles(res["latencies"]) if res["latencies"] else (float("nan"), float("nan"))
        row = {"mode": name, "requests": n, "items_per_request": args.items, "wall_s": res["wall"],
               "requests_per_s": n / res["wall"], "items_per_s": n * args.items / res["wall"],
               "p50_ms": p50, "p99_ms": p99, "exact": exact, "max_abs_diff": max_diff}
        rows.append(row)
        agree = "" if exact is None else f"; exact {exact}/{n}, max |diff| {max_diff:.3g}"
        print(f"{name:>22}: {row['requests_per_s']:8.1f} requests/s {row['items_per_s']:8.1f} items/s  "
              f"latency p50 {p50:7.1f} ms p99 {p99:7.1f} ms{agree}")

    ref = _in_process(local, jobs)
    cfg_kwargs = {"reward": args.reward, "weights": args.weights, "options": options}
    served = {r: _serve_run(args, cfg_kwargs, r, jobs, bad) for r in args.replicas}
    print(f"{n} requests x {args.items} items; server runs with {args.clients} concurrent clients, in-process "
          "scoring sequential in one thread (a reward is not thread-safe)")
    report("in-process", ref, None, None)
    for r, res in served.items():
        exact = max_diff = None
        if args.weights == "pretrained":  # random weights differ between processes
            exact = sum(int(torch.equal(a, b)) for a, b in zip(ref["scores"], res["scores"]))
            max_diff = max(float((a - b).abs().max()) for a, b in zip(ref["scores"], res["scores"]))
        report(f"served, {r} replica(s)", res, exact, max_diff)
    result = {"rows": rows}
    if args.overlap:
        from benchmarks import reward_overlap

        ov = reward_overlap.run(reward_overlap.main_args([]))
        print(f"trainer iteration with reward.overlap / synchronous: {ov['ratio_overlap_over_sync']:.3f} "
              f"(reward hidden: {ov['reward_time_hidden_fraction']:.0%}; same weights: {ov['weights_equal']})")
        result["overlap"] = ov
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
