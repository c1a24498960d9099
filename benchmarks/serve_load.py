"""Load test of `mmreward serve` on loopback: concurrent clients, requests/s, exact agreement.

Starts the Ray Serve reward server on 127.0.0.1 (a free port), runs `--clients` threads that each send
`--requests` score requests of `--items` images, and prints requests/s, items/s and how many responses
equal the in-process scores exactly (bit for bit) and the largest absolute difference.

    python benchmarks/serve_load.py --reward mock --clients 8 --requests 20
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
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import torch


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reward", default="mock")
    p.add_argument("--weights", default="pretrained", choices=["pretrained", "random"])
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--clients", type=int, default=8, help="concurrent client threads (loopback only, bounded)")
    p.add_argument("--requests", type=int, default=20, help="requests per client")
    p.add_argument("--items", type=int, default=2, help="images per request")
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--bad-every", type=int, default=0, metavar="K",
                   help="also send a bad request (NaN pixels / 0x0 image) after every K innocent ones (0: none)")
    args = p.parse_args(argv)
    if not 1 <= args.clients <= 64:
        p.error("--clients must be in [1, 64]")

    import mmreward
    from mmreward.serve import RemoteRewardError, RewardClient, ServeConfig, encode_tensor, shutdown, start

    options = {}
    for kv in args.option:
        k, _, v = kv.partition("=")
        try:
            options[k] = json.loads(v)
        except json.JSONDecodeError:
            options[k] = v
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = ServeConfig(reward=args.reward, weights=args.weights, options=options, port=port)
    t0 = time.perf_counter()
    url = start(cfg)
    print(f"server up in {time.perf_counter() - t0:.1f}s at {url}")
    try:
        client = RewardClient(url, cfg.token)
        prompts = ["a red circle", "two blue squares", "a green triangle", "a photo of a cat"]
        g = torch.Generator().manual_seed(0)
        shape = (args.items, 3, args.size, args.size) if "image" in client.modalities else (args.items, 4, 3, args.size, args.size)
        jobs = [(prompts[i % 4], torch.rand(*shape, generator=g)) for i in range(args.clients * args.requests)]
        client.score(*jobs[0])  # warm-up
        nan_media = torch.rand(*shape, generator=g)
        nan_media.view(-1)[0] = float("nan")
        bad = [{"prompts": prompts[0], "media": encode_tensor(nan_media)},
               {"prompts": prompts[0], "media": encode_tensor(torch.zeros(1, *shape[1:-2], 0, 0))}]
        order = []
        for i in range(len(jobs)):
            order.append(("ok", i))
            if args.bad_every and (i + 1) % args.bad_every == 0:
                order.append(("bad", i % len(bad)))

        def run(job):
            kind, i = job
            try:
                if kind == "ok":
                    return client.score(*jobs[i]).scores
                client._request("POST", "/score", bad[i])
                return "accepted"  # a bad request that was scored
            except RemoteRewardError as exc:
                return exc

        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=args.clients) as pool:
            answers = list(pool.map(run, order))
        wall = time.perf_counter() - t0
        results = [a for (kind, _), a in zip(order, answers) if kind == "ok"]
        failed = [a for a in results if isinstance(a, Exception)]
        if args.bad_every:
            refused = sum(isinstance(a, RemoteRewardError) and " 400:" in str(a)
                          for (kind, _), a in zip(order, answers) if kind == "bad")
            print(f"bad requests refused with 400: {refused}/{len(order) - len(jobs)}; "
                  f"innocent requests failed: {len(failed)}/{len(jobs)}")
        if failed:
            print(f"first innocent failure: {failed[0]}")
            results = [torch.full((args.items,), float("nan")) if isinstance(a, Exception) else a for a in results]
        local = mmreward.load(args.reward, weights=args.weights, **options) if args.weights == "pretrained" else None
        exact, max_diff = 0, 0.0
        if local is not None:
            for (prompt, media), got in zip(jobs, results):
                ref = local.score(prompt, media).scores
                exact += int(torch.equal(ref, got))
                max_diff = max(max_diff, float((ref - got).abs().max()))
        n = len(jobs)
        print(f"{n} requests x {args.items} items from {args.clients} clients in {wall:.2f}s: "
              f"{n / wall:.1f} requests/s, {n * args.items / wall:.1f} items/s")
        if local is not None:
            print(f"exact agreement with in-process scoring: {exact}/{n} requests; max |diff| = {max_diff:.3g}")
        else:
            print("agreement not checked: random weights differ between processes (use a real checkpoint)")
    finally:
        shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
