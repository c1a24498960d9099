"""reward.remote: a reward on another process, reached over loopback HTTP in the `mmreward serve` wire format.

The done-when check: a ShapesWorld GRPO run whose reward is served by a worker on loopback equals the
in-process run bit for bit (params after 2 iterations). Then the client's contract: typed errors for the
server's refusals, retries with failover for what a retry fixes, replicas giving the in-process scores, and
the config checks. The Ray Serve server and the trainer-started subprocess pool are `slow` (seconds to start).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import mmreward
from diffusion_rl.remote_rewards import RemoteReward, RewardWorker, parse_remote_specs
from mmreward.errors import ConfigError, RewardValueError
from mmreward.serve import RemoteRewardError

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "assets" / "shapesworld" / "generator"
needs_generator = pytest.mark.skipif(not (GENERATOR / "model_index.json").is_file(),
                                     reason="assets/shapesworld/generator is not built")
# 4 samples in 2 rollout chunks: the remote run also overlaps its scoring with the rollout (reward.overlap)
SMALL = ["train.iterations=2", "sample.prompts_per_iteration=2", "sample.group_size=2", "sample.batch_size=2",
         "train.micro_batch_size=4", "sample.num_steps=2", "sample.sde_window=[0, 1]", "train.num_minibatches=1",
         "log.progress=false", "log.eval_every=0", "prompts.eval=null", "log.save_every=0"]
TOKEN = "test-token-0123456789"


def _trainer(out: Path, *extra: str):
    from diffusion_rl.config import load_config
    from diffusion_rl.trainer import Trainer

    return Trainer(load_config(ROOT / "configs" / "shapes_grpo.yaml", [*SMALL, f"log.output_dir={out}", *extra]))


@pytest.fixture
def worker():
    """A worker thread on loopback serving two rewards (shapes-eval as the shipped config loads it, and a
    faulty mock); stopped after the test."""
    from mmreward.testing.faulty import FaultyMockReward

    w = RewardWorker({"shapes-eval": mmreward.load("shapes-eval", mode="soft"), "faulty": FaultyMockReward()},
                     token=TOKEN)
    w.start()
    yield w
    w.stop()


def _train_and_params(trainer) -> tuple[list[dict], dict[str, torch.Tensor]]:
    metrics = [trainer.train_iteration(it) for it in range(2)]
    return metrics, {n: p.detach().clone() for n, p in trainer.policy.model.named_parameters()}


@needs_generator
def test_run_with_a_remote_reward_equals_the_in_process_run_bit_for_bit(tmp_path, worker, monkeypatch):
    monkeypatch.setenv("MMREWARD_TOKEN", TOKEN)
    local = _trainer(tmp_path / "local")
    before = {n: p.detach().clone() for n, p in local.policy.model.named_parameters()}
    remote_cfg = json.dumps({"shapes-eval": {"url": f"{worker.url}/shapes-eval", "request_items": 1}})
    remote = _trainer(tmp_path / "remote", f"reward.remote={remote_cfg}", "reward.options={}", "reward.overlap=true")
    assert isinstance(remote.rewards.train["shapes-eval"], RemoteReward)
    assert remote.rewards.train["shapes-eval"].name == "shapes-eval"
    m_local, p_local = _train_and_params(local)
    m_remote, p_remote = _train_and_params(remote)
    assert [m["reward/shapes-eval"] for m in m_local] == [m["reward/shapes-eval"] for m in m_remote]
    assert p_local.keys() == p_remote.keys()
    for n in p_local:
        assert torch.equal(p_local[n], p_remote[n]), n
    assert any(not torch.equal(p_local[n], before[n]) for n in before)  # training moved the weights


def test_scores_from_two_replicas_equal_in_process_scores(worker):
    second = RewardWorker({"shapes-eval": mmreward.load("shapes-eval", mode="soft")}, token=TOKEN)
    second.start()
    urls = [f"{worker.url}/shapes-eval", f"{second.url}/shapes-eval"]
    rr = RemoteReward("shapes-eval", urls, TOKEN, request_items=2, backoff_s=0.0)
    no_retry = RemoteReward("shapes-eval", urls, TOKEN, request_items=2, retries=0)
    g = torch.Generator().manual_seed(1)
    images = torch.rand(5, 3, 32, 32, generator=g)
    prompts = ["a red circle", "a blue square", "a green cross", "a white triangle", "a red square"]
    expected = mmreward.load("shapes-eval", mode="soft").score(prompts, images).scores
    assert torch.equal(rr.score(prompts, images).scores, expected)
    # one replica gone: the chunks sent to it fail over to the other after a retry ...
    second.stop()
    assert torch.equal(rr.score(prompts, images).scores, expected)
    # ... and fail without retries (3 chunks over 2 replicas: one goes to the stopped one)
    with pytest.raises(RemoteRewardError, match="after 1 tries.*cannot reach"):
        no_retry.score(prompts, images)


def test_server_refusals_are_typed_and_only_retryable_failures_are_retried(worker):
    rr = RemoteReward("faulty", [f"{worker.url}/faulty"], TOKEN, retries=2, backoff_s=0.0)
    img = torch.rand(2, 3, 16, 16)
    with pytest.raises(RewardValueError, match="NaN|nan|finite"):  # the server's 422
        rr.score(["ok", "nan-score"], img)
    with pytest.raises(RemoteRewardError, match="after 3 tries.*HTTP 500"):  # untyped server bug: retried, then raised
        rr.score(["raise-untyped", "ok"], img)
    with pytest.raises(ConfigError, match="bearer token"):
        RemoteReward("faulty", [f"{worker.url}/faulty"], "wrong-token", retries=0).score(["ok"], img[:1])


def test_a_transient_503_is_retried_and_the_scores_are_unchanged(worker):
    class Flaky(RewardWorker):
        failures = 2

        def handle(self, method, path, headers, body):
            if method == "POST" and self.failures > 0:
                self.failures -= 1
                body.read(int(headers["Content-Length"]))
                return 503, {"error": "overloaded"}
            return super().handle(method, path, headers, body)

    flaky = Flaky({"shapes-eval": mmreward.load("shapes-eval", mode="soft")}, token=TOKEN)
    flaky.start()
    try:
        img, prompts = torch.rand(3, 3, 32, 32), ["a red circle", "a blue square", "a green cross"]
        expected = mmreward.load("shapes-eval", mode="soft").score(prompts, img).scores
        assert torch.equal(RemoteReward("s", [flaky.url], TOKEN, retries=2, backoff_s=0.0).score(prompts, img).scores,
                           expected)
        assert flaky.failures == 0
        flaky.failures = 1
        with pytest.raises(RemoteRewardError, match="HTTP 503"):
            RemoteReward("s", [flaky.url], TOKEN, retries=0).score(prompts, img)
    finally:
        flaky.stop()


@pytest.mark.parametrize("raw, match", [
    ({"pickscore": {"url": "127.0.0.1:8000"}}, r"url must be an http"),
    ({"pickscore": {"url": "http://h:1", "replicas": 2}}, r"unknown keys \['replicas'\] for a server url"),
    ({"pickscore": {"replicas": 0}}, r"replicas must be >= 1"),
    ({"pickscore": {"replicas": 2, "devices": []}}, r"devices must be a device string"),
    ({"pickscore": {"url": "http://h:1", "timeout_s": "soon"}}, r"timeout_s must be a number"),
    ({"hpsv2": {"url": "http://h:1"}}, r"names rewards the run does not use: \['hpsv2'\]"),
    ({"pickscore": {"engine": "slurm"}}, r"engine must be 'process' .* or 'ray'"),
    ({"pickscore": {"num_gpus": 0.5}}, r"\['num_gpus'\] need engine: ray"),
    ({"pickscore": {"engine": "ray", "devices": ["cuda:0", "cuda:1"]}}, r"Ray places the replicas"),
    ({"pickscore": {"engine": "ray", "runtime_env": "pip"}}, r"runtime_env must be a mapping"),
])
def test_bad_remote_entries_are_config_errors_naming_the_key(raw, match):
    with pytest.raises(ConfigError, match=match):
        parse_remote_specs(raw, used={"pickscore"})


def test_options_for_a_served_reward_are_refused(monkeypatch):
    from diffusion_rl.config import RewardConfig
    from diffusion_rl.remote_rewards import connect_remote_rewards

    rcfg = RewardConfig(rewards={"shapes-eval": 1.0}, options={"shapes-eval": {"mode": "soft"}},
                        remote={"shapes-eval": {"url": "http://127.0.0.1:9"}})
    with pytest.raises(ConfigError, match="mmreward serve --option"):
        connect_remote_rewards(rcfg)


def test_a_local_pool_is_refused_in_a_multi_process_run(monkeypatch):
    from diffusion_rl.config import RewardConfig
    from diffusion_rl.remote_rewards import connect_remote_rewards

    monkeypatch.setenv("WORLD_SIZE", "7")
    rcfg = RewardConfig(rewards={"mock": 1.0}, remote={"mock": {"replicas": 1}})
    with pytest.raises(ConfigError, match="one per training process.*give its url"):
        connect_remote_rewards(rcfg)


def test_worker_cli_exits_2_with_one_line_for_an_unknown_reward(capsys):
    from diffusion_rl.remote_rewards import main

    assert main(["worker", "--reward", "no-such-reward"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("reward worker:") and "no-such-reward" in err[0]
    assert main(["neither"]) == 2


@pytest.mark.slow
def test_local_pool_of_worker_processes_gives_in_process_scores():
    """The trainer-started pool: 2 replicas of shapes-eval and a mock in the first replica's process."""
    from diffusion_rl.config import RewardConfig
    from diffusion_rl.remote_rewards import connect_remote_rewards

    rcfg = RewardConfig(rewards={"shapes-eval": 1.0, "mock": 1.0}, options={"shapes-eval": {"mode": "soft"}},
                        remote={"shapes-eval": {"replicas": 2}, "mock": {}})
    remote = connect_remote_rewards(rcfg)
    pool = remote["shapes-eval"]._pool_owner
    procs = list(pool.procs)
    try:
        assert len(pool.procs) == 2 and remote["mock"]._pool_owner is pool  # several rewards in one process
        img = torch.rand(5, 3, 32, 32)
        prompts = ["a red circle", "a blue square", "a green cross", "a white triangle", "a red square"]
        assert torch.equal(remote["shapes-eval"].score(prompts, img).scores,
                           mmreward.load("shapes-eval", mode="soft").score(prompts, img).scores)
        assert torch.equal(remote["mock"].score(prompts, img).scores, mmreward.load("mock").score(prompts, img).scores)
    finally:
        pool.stop()
    assert all(p.poll() is not None for p in procs)  # the workers are gone


def test_runtime_env_reaches_the_replicas_actor_options():
    pytest.importorskip("ray.serve")
    from diffusion_rl.remote_rewards import route_name
    from mmreward.serve import ServeConfig, build_app

    env = {"pip": ["some-pinned-dependency==1.0"], "env_vars": {"A": "1"}}
    opts = build_app(ServeConfig(reward="mock", runtime_env=env))._bound_deployment.ray_actor_options
    assert opts["runtime_env"] == env
    assert "runtime_env" not in build_app(ServeConfig(reward="mock"))._bound_deployment.ray_actor_options
    assert route_name("mmreward.testing.faulty:FaultyMockReward") == "mmreward.testing.faulty_FaultyMockReward"


@pytest.mark.slow
def test_local_ray_pool_gives_in_process_scores():
    """engine: ray: the trainer starts Ray Serve itself, 2 replicas with their own runtime_env."""
    pytest.importorskip("ray.serve")
    from diffusion_rl.config import RewardConfig
    from diffusion_rl.remote_rewards import connect_remote_rewards
    from mmreward.serve import shutdown

    rcfg = RewardConfig(rewards={"shapes-eval": 1.0}, options={"shapes-eval": {"mode": "soft"}},
                        remote={"shapes-eval": {"engine": "ray", "replicas": 2,
                                                "runtime_env": {"env_vars": {"MMREWARD_SIDE": "1"}}}})
    try:
        remote = connect_remote_rewards(rcfg)["shapes-eval"]
        img = torch.rand(5, 3, 32, 32)
        prompts = ["a red circle", "a blue square", "a green cross", "a white triangle", "a red square"]
        assert torch.equal(remote.score(prompts, img).scores,
                           mmreward.load("shapes-eval", mode="soft").score(prompts, img).scores)
    finally:
        shutdown()


@pytest.mark.slow
@needs_generator
def test_run_with_reward_on_mmreward_serve_equals_the_in_process_run(tmp_path, monkeypatch):
    """The done-when check against `mmreward serve` (Ray Serve) on loopback, serving two rewards in one server
    (the second with its own runtime_env)."""
    pytest.importorskip("ray.serve")
    from diffusion_rl.remote_rewards import serve_rewards
    from mmreward.serve import ServeConfig, shutdown

    cfgs = [ServeConfig(reward="shapes-eval", options={"mode": "soft"}, port=0, token=TOKEN),
            ServeConfig(reward="mock", port=0, token=TOKEN, runtime_env={"env_vars": {"MMREWARD_SIDE": "1"}})]
    urls = serve_rewards(cfgs, ray_init={"num_cpus": 2})
    try:
        assert urls["mock"] == urls["shapes-eval"] + "/mock"
        img, prompts = torch.rand(3, 3, 32, 32), ["a", "b", "c"]
        mock = RemoteReward("mock", [urls["mock"]], TOKEN)
        assert mock.name == "mock"
        assert torch.equal(mock.score(prompts, img).scores, mmreward.load("mock").score(prompts, img).scores)
        monkeypatch.setenv("MMREWARD_TOKEN", TOKEN)
        remote_cfg = json.dumps({"shapes-eval": {"url": urls["shapes-eval"]}})
        remote = _trainer(tmp_path / "remote", f"reward.remote={remote_cfg}", "reward.options={}")
        m_remote, p_remote = _train_and_params(remote)
    finally:
        shutdown()
    m_local, p_local = _train_and_params(_trainer(tmp_path / "local"))
    assert [m["reward/shapes-eval"] for m in m_local] == [m["reward/shapes-eval"] for m in m_remote]
    for n in p_local:
        assert torch.equal(p_local[n], p_remote[n]), n


@pytest.mark.slow
def test_serve_load_benchmark_rows(tmp_path):
    """benchmarks/serve_load.py at a tiny size: one in-process row and one per replica count, exact scores."""
    pytest.importorskip("ray.serve")
    from benchmarks import serve_load

    out = tmp_path / "load.json"
    assert serve_load.main(["--reward", "mock", "--clients", "2", "--requests", "3", "--items", "2", "--size", "16",
                            "--replicas", "1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["mode"] for r in rows] == ["in-process", "served, 1 replica(s)"]
    for r in rows:
        assert r["requests"] == 6 and r["requests_per_s"] == pytest.approx(6 / r["wall_s"], rel=1e-12)
        assert 0 < r["p50_ms"] <= r["p99_ms"]
    assert rows[1]["exact"] == 6 and rows[1]["max_abs_diff"] == 0
