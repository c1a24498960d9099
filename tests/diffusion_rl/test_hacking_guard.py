"""The online reward-hacking monitor (diffusion_rl.hacking_guard): the trend/alarm rule against hand-computed
cases, warn/stop/rollback through the real trainer on a tiny SD3 pipeline with scripted reward sequences, the
config errors, and the ShapesWorld demonstration (slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import mmreward
from diffusion_rl.config import from_dict, load_config
from diffusion_rl.hacking_guard import falling_gold, fitted_change, pairwise_distances
from mmreward.errors import ConfigError, UnknownRewardError
from mmreward.models.mock import MockReward
from mmreward.registry import RewardSpec, register_reward
from mmreward.types import Reward, RewardOutput
from tests._helpers.inference_fixtures import one_thread  # noqa: F401 - shared fixtures

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------------
# the rule
# ------------------------------------------------------------------------------------------------
def test_fitted_change_is_the_least_squares_rise_over_the_window():
    # x = 0, 5, 10; y = 1, 2, 4: slope = sum((x - 5)(y - 7/3)) / sum((x - 5)^2) = 15 / 50 = 0.3; over 10 -> 3.0
    assert fitted_change([0, 5, 10], [1, 2, 4]) == pytest.approx(3.0, rel=1e-12)
    # x = 0..3, y = 0, 1, 0, 1: slope = (-1.5*0 - 0.5*1 + 0.5*0 + 1.5*1) / 5 = 0.2; over 3 -> 0.6
    assert fitted_change([0, 1, 2, 3], [0, 1, 0, 1]) == pytest.approx(0.6, rel=1e-12)
    assert fitted_change([3], [1.0]) == 0.0


def _first_alarm(iterations, train, gold, **kw):
    """The iteration of the first evaluation at which the rule fires, feeding evaluations one at a time."""
    for n in range(1, len(iterations) + 1):
        if falling_gold(iterations[:n], train[:n], {k: v[:n] for k, v in gold.items()}, **kw):
            return iterations[n - 1]
    return None


def test_rising_reward_and_falling_gold_alarm_at_the_right_evaluation():
    its = [0, 5, 10, 15, 20]
    train = [1.0, 2.0, 3.0, 4.0, 5.0]
    # with three equally spaced points the fitted change is last - first: 0.01 at 10, -0.07 at 15
    gold = {"shapes-eval": [0.60, 0.62, 0.61, 0.55, 0.50]}
    assert _first_alarm(its, train, gold, window=3, tolerance=0.02) == 15
    # a tolerance above that fall (0.07) delays the alarm to 20, where the fall is 0.50 - 0.61 = -0.11
    assert _first_alarm(its, train, gold, window=3, tolerance=0.08) == 20
    # only the falling gold reward is named
    both = {"a": gold["shapes-eval"], "b": [0.1, 0.2, 0.3, 0.4, 0.5]}
    assert falling_gold(its[:4], train[:4], {k: v[:4] for k, v in both.items()}, window=3, tolerance=0.02) == ["a"]


def test_both_rising_or_flat_training_reward_give_no_alarm():
    its = [0, 5, 10, 15, 20]
    assert _first_alarm(its, [1, 2, 3, 4, 5], {"g": [0.5, 0.55, 0.6, 0.62, 0.7]}, window=3, tolerance=0.0) is None
    # gold falls, but the training reward does not rise: bad training, not reward hacking
    assert _first_alarm(its, [5, 5, 5, 5, 5], {"g": [0.7, 0.6, 0.5, 0.4, 0.3]}, window=3, tolerance=0.0) is None
    # the reward must rise by more than min_rise: 1.0 over the window here, so min_rise 1.5 silences it
    assert _first_alarm(its, [1, 1.5, 2, 2.5, 3], {"g": [0.7, 0.6, 0.5, 0.4, 0.3]}, window=3, tolerance=0.0,
                        min_rise=1.5) is None


def test_noise_within_tolerance_gives_no_alarm():
    its = [0, 5, 10, 15, 20]
    gold = {"g": [0.60, 0.58, 0.61, 0.59, 0.60]}  # fitted changes over 3: +0.01, +0.01, -0.01
    assert _first_alarm(its, [1, 2, 3, 4, 5], gold, window=3, tolerance=0.02) is None
    assert _first_alarm(its, [1, 2, 3, 4, 5], gold, window=3, tolerance=0.0) == 20  # the same noise, no tolerance
    # a longer window averages a single bad evaluation away: W=5 over 0.60, 0.62, 0.61, 0.52, 0.63 gives
    # slope sum((x-10)(y-0.596)) / 250 = (-10*0.004 - 5*0.024 + 0 + 5*-0.076 + 10*0.034) / 250 = -0.0008 -> -0.016
    dip = {"g": [0.60, 0.62, 0.61, 0.52, 0.63]}
    assert fitted_change(its, dip["g"]) == pytest.approx(-0.016, rel=1e-9)
    assert _first_alarm(its, [1, 2, 3, 4, 5], dip, window=5, tolerance=0.02) is None
    assert _first_alarm(its, [1, 2, 3, 4, 5], dip, window=2, tolerance=0.02) == 15  # W=2: the dip alone fires


def test_pairwise_distances_within_groups():
    imgs = torch.stack([torch.full((3, 2, 2), v) for v in (0.0, 1.0, 0.3, 0.0, 0.5, 0.2)])
    # group 0: |0 - 1| = 1.0; group 1 has one image (no pair); group 2: 0.5, 0.2, 0.3
    d = pairwise_distances(imgs, [0, 0, 1, 2, 2, 2])
    assert d == pytest.approx([1.0, 0.5, 0.2, 0.3], rel=1e-6)  # the inputs are float32


# ------------------------------------------------------------------------------------------------
# through the trainer: scripted rewards on a tiny SD3
# ------------------------------------------------------------------------------------------------
# evaluations at iterations 0..5 (eval_every 1); the proxy rises throughout, gold peaks at iteration 2.
# W=3, tolerance 0.02: gold's fitted change is 0.2 at 2, 0.05 at 3, then 0.5 - 0.7 = -0.2 at 4 -> first alarm at 4
PROXY = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
GOLD = [0.5, 0.6, 0.7, 0.65, 0.5, 0.4, 0.3]


class _Scripted(Reward):
    """Evaluation (no grad): the next value of a script; training (grad): the mock colour reward, so DRaFT
    really changes the weights and a rollback has something to undo."""

    modalities = ("image",)
    differentiable = True
    requires_prompt = False

    def __init__(self, script: list[float], **kwargs) -> None:
        super().__init__()
        self.script, self.calls, self.mock = script, 0, MockReward()

    def _score(self, prompts, media):
        if torch.is_grad_enabled():
            return self.mock._score(prompts, media)
        value = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        return RewardOutput(torch.full((len(prompts),), value) + 0 * media.flatten(1).mean(1))


@pytest.fixture(autouse=True, scope="module")  # module scope: before the module-scoped warn run
def _scripted_rewards():
    for name, script in (("test-proxy", PROXY), ("test-gold", GOLD)):
        register_reward(RewardSpec(name, lambda checkpoint=None, s=script, **kw: _Scripted(s), "scripted",
                                   differentiable=True, needs_weights=False), overwrite=True)


def _cfg(tmp_path, tiny_pipeline_dir, name, mode="off", **train):
    return from_dict({
        "model": {"pretrained": str(tiny_pipeline_dir("sd3")), "height": 16, "width": 16, "lora_rank": 4,
                  "lora_alpha": 4},
        "sample": {"num_steps": 2, "guidance_scale": 1.0, "kernel": "ode", "noise_level": 0.0, "group_size": 2,
                   "prompts_per_iteration": 1, "batch_size": 4},
        "reward": {"rewards": {"test-proxy": 1.0}},
        "train": {"algorithm": "draft", "iterations": 5, "learning_rate": 3e-2, "micro_batch_size": 2, **train},
        "guard": {"mode": mode, "window": 3, "tolerance": 0.02},
        "prompts": {"train": ["a red circle"], "eval": ["a blue square"], "eval_samples_per_prompt": 2},
        "log": {"output_dir": str(tmp_path / name), "progress": False, "grid_every": 0, "eval_every": 1,
                "gold_rewards": ["test-gold"]},
    })


def _params(path):
    from diffusion_rl.checkpointing import read_checkpoint

    return read_checkpoint(path)["params"]


def _alarms(history):
    return [h["iteration"] for h in history if h.get("hacking_alarm")]


@pytest.fixture(scope="module")
def warn_run(tmp_path_factory, tiny_pipeline_dir):
    """The warn-mode run, saving every iteration's weights for the stop and rollback runs to be compared with."""
    from diffusion_rl.trainer import Trainer

    trainer = Trainer(_cfg(tmp_path_factory.mktemp("guard"), tiny_pipeline_dir, "warn", mode="warn"))
    trainer.cfg.log.save_every = 1
    return trainer, trainer.fit()


def test_warn_logs_gold_diversity_and_the_alarm_and_keeps_training(warn_run):
    warn, hist = warn_run
    evals = [h for h in hist if "gold/test-gold" in h]
    assert [h["iteration"] for h in evals] == list(range(6))
    assert [h["gold/test-gold"] for h in evals] == pytest.approx(GOLD[:6])
    assert [h["guard/train_reward"] for h in evals] == pytest.approx(PROXY[:6])
    assert _alarms(hist) == [4, 5]  # warn keeps training; the fall continues
    assert all(h["hacking_alarm"] == 0.0 for h in evals[:4])
    assert evals[-1]["guard/best_iteration"] == 2
    assert all(h["diversity"] >= 0 for h in evals) and "eval/_diversity" not in evals[0]
    assert max(h["iteration"] for h in hist) == 5
    ckpts = warn.out_dir / "checkpoints"
    best = _params(ckpts / "best_gold")
    for n, v in _params(ckpts / "iter_000002").items():
        assert torch.equal(best[n], v), n  # best-by-gold is the iteration-2 model
    from PIL import Image

    with Image.open(warn.out_dir / "reward_curve.png") as im:
        assert im.size[0] == 1500  # the monitor's third panel (two panels are 1000 px wide)


def test_stop_ends_at_the_alarm_iteration(warn_run, tmp_path, tiny_pipeline_dir):
    from diffusion_rl.trainer import Trainer

    stop = Trainer(_cfg(tmp_path, tiny_pipeline_dir, "stop", mode="stop"))
    hist = stop.fit()
    assert max(h["iteration"] for h in hist) == 4 and stop.iteration == 4
    assert _alarms(hist) == [4]
    assert sorted(p.name for p in (stop.out_dir / "checkpoints").iterdir()) == ["best_gold", "iter_000004"]
    at_alarm = _params(warn_run[0].out_dir / "checkpoints" / "iter_000004")
    for n, v in _params(stop.out_dir / "checkpoints" / "iter_000004").items():
        assert torch.equal(at_alarm[n], v), n  # the stopped run saved the model of the alarm's iteration


def test_rollback_restores_the_best_by_gold_checkpoint(warn_run, tmp_path, tiny_pipeline_dir):
    from diffusion_rl.trainer import Trainer

    rb = Trainer(_cfg(tmp_path, tiny_pipeline_dir, "rollback", mode="rollback"))
    hist = rb.fit()
    assert rb.iteration == 4 and _alarms(hist) == [4]
    assert [h["guard/rolled_back_to"] for h in hist if "guard/rolled_back_to" in h] == [2]
    ckpts = warn_run[0].out_dir / "checkpoints"
    best, at_alarm = _params(ckpts / "iter_000002"), _params(ckpts / "iter_000004")
    names = dict(rb.policy.unwrapped.named_parameters())
    assert best.keys() and all(torch.equal(names[n].detach().cpu(), v) for n, v in best.items())
    assert any(not torch.equal(best[n], at_alarm[n]) for n in best)  # the rollback undid real training
    final = _params(rb.out_dir / "checkpoints" / "iter_000004")  # the run's last checkpoint holds the kept model
    assert all(torch.equal(final[n], v) for n, v in best.items())
    lines = [json.loads(x) for x in (rb.out_dir / "metrics.jsonl").read_text().splitlines()]
    assert _alarms(lines) == [4]


class _AntiMock(MockReward):
    """A gold reward that disagrees with the training reward: the pixels' distance from the prompt's colour."""

    def _score(self, prompts, media):
        out = super()._score(prompts, media)
        return RewardOutput(-out.scores, out.details)


@pytest.mark.slow  # three tiny runs: ~30 s on an idle core, more on a shared one
def test_a_resumed_run_alarms_where_the_uninterrupted_one_does(tmp_path, tiny_pipeline_dir):
    # real (not scripted) rewards: DRaFT raises the mock colour reward, so the anti-mock gold falls with it
    from diffusion_rl.trainer import Trainer

    register_reward(RewardSpec("test-anti-mock", lambda checkpoint=None, **kw: _AntiMock(), "anti-mock",
                               needs_weights=False), overwrite=True)

    def cfg(name, iterations, **log):
        c = _cfg(tmp_path, tiny_pipeline_dir, name, mode="warn", iterations=iterations)
        c.reward.rewards = {"mock": 1.0}
        c.prompts.eval = ["a red square"]
        c.log.gold_rewards = ["test-anti-mock"]
        c.guard.tolerance = 0.0
        for k, v in log.items():
            setattr(c.log, k, v)
        return c

    whole = Trainer(cfg("whole", 4)).fit()
    assert _alarms(whole) == [2, 3, 4]  # W=3: from the third evaluation on
    Trainer(cfg("parts", 2)).fit()
    c = cfg("parts", 4)
    c.train.resume_from = "latest"
    hist = Trainer(c).fit()
    assert _alarms(hist) == [2, 3, 4]
    for a, b in zip([h for h in whole if "gold/test-anti-mock" in h], [h for h in hist if "gold/test-anti-mock" in h],
                    strict=True):
        assert a["iteration"] == b["iteration"] and a["gold/test-anti-mock"] == b["gold/test-anti-mock"]


def test_the_monitor_does_not_change_training(warn_run, tmp_path, tiny_pipeline_dir):
    from diffusion_rl.trainer import Trainer

    cfg = _cfg(tmp_path, tiny_pipeline_dir, "off")
    cfg.log.gold_rewards = []
    plain = Trainer(cfg)
    hist = plain.fit()
    assert not any(k.startswith(("gold/", "hacking", "diversity", "guard/")) for h in hist for k in h)
    # the warn run saved its best-by-gold checkpoint at iteration 0, before the first optimizer step, and every
    # iteration after: its weights must still be those of the run without the monitor, bit for bit
    watched = _params(warn_run[0].out_dir / "checkpoints" / "iter_000005")
    assert all(torch.equal(v, _params(plain.out_dir / "checkpoints" / "iter_000005")[n]) for n, v in watched.items())


def test_config_errors(tmp_path, tiny_pipeline_dir):
    from diffusion_rl.cli import main
    from diffusion_rl.trainer import Trainer

    with pytest.raises(ConfigError, match=r"guard.mode must be one of \['off', 'warn', 'stop', 'rollback'\]"):
        from_dict({"reward": {"rewards": {"mock": 1}}, "guard": {"mode": "panic"},
                   "log": {"gold_rewards": ["shapes-eval"]}})
    with pytest.raises(ConfigError, match="needs gold rewards to watch: set log.gold_rewards"):
        from_dict({"reward": {"rewards": {"mock": 1}}, "guard": {"mode": "stop"}})
    with pytest.raises(ConfigError, match="guard.window must be >= 2"):
        from_dict({"reward": {"rewards": {"mock": 1}}, "guard": {"window": 1}})
    with pytest.raises(ConfigError, match="log.eval_every is 0"):
        from_dict({"reward": {"rewards": {"mock": 1}}, "guard": {"mode": "warn"},
                   "log": {"gold_rewards": ["mock"], "eval_every": 0}})
    with pytest.raises(ConfigError, match="guard.tolerance must be >= 0"):
        from_dict({"reward": {"rewards": {"mock": 1}}, "guard": {"tolerance": -0.1}})
    with pytest.raises(ConfigError, match="train.hacking_guard moved to guard.mode"):
        from_dict({"reward": {"rewards": {"mock": 1}}, "train": {"hacking_guard": "warn"}})
    cfg = _cfg(tmp_path, tiny_pipeline_dir, "bad")
    cfg.log.gold_rewards = ["shapes-evl"]
    with pytest.raises(UnknownRewardError, match="log.gold_rewards: unknown reward 'shapes-evl'. Did you mean 'shapes-eval'"):
        Trainer(cfg)
    cfg = _cfg(tmp_path, tiny_pipeline_dir, "noeval")
    cfg.prompts.eval = None
    with pytest.raises(ConfigError, match="prompts.eval is empty"):
        Trainer(cfg)
    # the command line: one line, exit 2, for both the offline check and a run
    args = ["--config", str(ROOT / "configs/shapes_draft.yaml"), "log.gold_rewards=[shapes-evl]"]
    assert main(["config", "--check", *args]) == 2
    assert main(["train", *args, f"log.output_dir={tmp_path / 'cli'}"]) == 2
    assert main(["config", "--config", str(ROOT / "configs/shapes_draft.yaml"), "guard.mode=stop"]) == 2


def test_guarded_config_resolves():
    cfg = load_config(ROOT / "configs/shapes_draft_guarded.yaml")
    assert cfg.log.gold_rewards == ["shapes-eval"] and cfg.guard.mode == "rollback"
    assert cfg.reward.rewards == {"shapesworld-pref": 1.0}
    assert mmreward.list_rewards().count("shapes-eval") == 1


# ------------------------------------------------------------------------------------------------
# ShapesWorld: the preference-reward DRaFT run, guarded
# ------------------------------------------------------------------------------------------------
UNGUARDED_FINAL_STRICT = 0.476  # the unguarded run at 60 it. (README; a rerun here gave 0.441: this is the higher bar)


@pytest.mark.slow
@pytest.mark.skipif(not (ROOT / "assets/shapesworld/generator/model_index.json").is_file(),
                    reason="needs the ShapesWorld generator asset")
def test_guard_catches_the_preference_reward_draft_run(tmp_path):
    from diffusion_rl.trainer import Trainer

    cfg = load_config(ROOT / "configs/shapes_draft_guarded.yaml", [f"log.output_dir={tmp_path}", "log.progress=false"])
    trainer = Trainer(cfg)
    hist = trainer.fit()
    assert _alarms(hist), "the alarm did not fire"
    alarm = _alarms(hist)[0]
    assert trainer.iteration == alarm < cfg.train.iterations
    kept = [h for h in hist if "gold/shapes-eval" in h and h["iteration"] == hist[-1]["guard/rolled_back_to"]][0]
    se = kept["gold/shapes-eval_se"]
    # the kept model's held-out strict accuracy beats the unguarded run's final one by more than 2 SE
    assert kept["gold/shapes-eval"] - UNGUARDED_FINAL_STRICT > 2 * se
    from diffusion_rl.evaluation import evaluate

    again = evaluate(trainer.cfg, trainer.policy, trainer.adapter, trainer.kernel, trainer.eval_prompts,
                     {"shapes-eval": trainer.rewards.eval["shapes-eval"]}, trainer.embeds_for, None)
    # the restored weights are the kept model: the same fixed-noise evaluation gives the same score
    assert again["eval/shapes-eval"] == pytest.approx(kept["gold/shapes-eval"], abs=0.5 / 288)
