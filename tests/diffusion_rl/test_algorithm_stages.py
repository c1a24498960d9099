"""Every algorithm has the one shape of `diffusion_rl.algorithms.base.Algorithm`, and the trainer runs its stages
by name (prompt -> rollout + reward -> advantages -> loss and step -> report) without asking which method it is."""

import inspect

import torch

from diffusion_rl.algorithms import BUILDERS, OfflineDiffusionDPO
from diffusion_rl.algorithms.base import Algorithm, Inputs, Run, Samples, Timings
from diffusion_rl.config import ALGORITHMS, from_dict

STAGES = {"rollout": ["self", "run", "inputs"], "advantages": ["self", "samples"],
          "update": ["self", "samples", "run"], "report": ["self", "samples", "timings"]}


def _registered_classes():
    """(train.algorithm, class) of every method `make_algorithm` builds, offline DPO included."""
    for name in ALGORITHMS:
        cfg = from_dict({"train": {"algorithm": name}, "reward": {"rewards": {"mock": 1.0}},
                         "prompts": {"train": ["a red circle"]}})
        yield name, type(BUILDERS[name](cfg, {"mock": None}, None))
    yield "dpo", OfflineDiffusionDPO  # chosen when dpo.pairs names a dataset (it loads the dataset when built)


def test_every_registered_algorithm_implements_the_stages_of_the_base():
    assert sorted(BUILDERS) == sorted(ALGORITHMS)
    classes = list(_registered_classes())
    assert len({cls for _, cls in classes}) == len(ALGORITHMS) + 1  # one class per method
    for name, cls in classes:
        assert issubclass(cls, Algorithm) and cls.name == name, cls
        # the base has no usable rollout or update (it raises NotImplementedError): every method brings both
        assert cls.rollout is not Algorithm.rollout and cls.update is not Algorithm.update, cls
        for stage, params in STAGES.items():
            assert list(inspect.signature(getattr(cls, stage)).parameters) == params, (cls, stage)
        # the capability flags and the 8-argument iteration of the old three shapes are gone
        assert not any(hasattr(cls, old) for old in ("owns_iteration", "owns_update", "iteration")), cls


class _Recorded(Samples):
    pass


class _Recording(Algorithm[_Recorded]):
    """Records what the trainer hands each stage, and in which order."""

    name = "grpo"

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def rollout(self, run: Run, inputs: Inputs) -> _Recorded:
        self.calls.append(("rollout", (run, inputs)))
        samples = _Recorded()
        samples.images = torch.full((len(inputs.prompts), 3, 4, 4), 0.5)
        return samples

    def advantages(self, samples: _Recorded) -> tuple[torch.Tensor, dict[str, float]]:
        self.calls.append(("advantages", samples))
        return torch.tensor([1.0, -1.0, 0.5, -0.5]), {"adv/x": 1.0}

    def update(self, samples: _Recorded, run: Run) -> dict[str, float]:
        self.calls.append(("update", (samples, samples.advantages.clone(), run)))
        return {"train/loss": 2.0}

    def report(self, samples: _Recorded, timings: Timings) -> dict[str, float]:
        self.calls.append(("report", (samples, timings)))
        return {"reward/x": 3.0}


def test_train_iteration_runs_the_stages_by_name_on_any_algorithm(tmp_path, tiny_pipeline_dir):
    from diffusion_rl.trainer import Trainer

    cfg = from_dict({
        "model": {"pretrained": str(tiny_pipeline_dir("sd3")), "height": 16, "width": 16, "max_sequence_length": 8},
        "sample": {"num_steps": 2, "group_size": 2, "prompts_per_iteration": 2, "batch_size": 4},
        "train": {"algorithm": "grpo", "iterations": 1}, "reward": {"rewards": {"mock": 1.0}},
        "prompts": {"train": ["a red circle", "a blue square", "two green dots"]},
        "log": {"output_dir": str(tmp_path), "progress": False}})
    algorithm = _Recording()
    trainer = Trainer(cfg, algorithm=algorithm)
    metrics = trainer.train_iteration(1)

    assert [stage for stage, _ in algorithm.calls] == ["rollout", "advantages", "update", "report"]
    run, inputs = algorithm.calls[0][1]
    samples = algorithm.calls[1][1]
    # what a method may use of the run, and never the trainer itself
    assert isinstance(run, Run) and run.policy is trainer.policy and run.adapter is trainer.adapter
    assert run.kernel is trainer.kernel and run.accelerator is trainer.accelerator and run.scorer is trainer.scorer
    assert not any(value is trainer for value in vars(run).values())
    # the prompt stage: this process's share of iteration 1's prompts, and their embeddings
    slot_prompts, prompts, slots, sample_ids = trainer.local_prompts(1)
    assert inputs.it == 1 and inputs.prompts == prompts and inputs.slot_prompts == slot_prompts
    assert torch.equal(inputs.slots, slots) and torch.equal(inputs.sample_ids, sample_ids)
    expected = trainer.embeds_for(prompts).tensors
    assert inputs.embeds.tensors.keys() == expected.keys()
    assert all(torch.equal(inputs.embeds.tensors[k], expected[k]) for k in expected)
    # the advantages reach the update on the samples; the report gets the same samples and the stage timings
    updated, advantages, update_run = algorithm.calls[2][1]
    assert updated is samples and update_run is run
    assert advantages.tolist() == [1.0, -1.0, 0.5, -0.5]
    reported, timings = algorithm.calls[3][1]
    assert reported is samples and timings.rollout_s >= 0 and timings.update_s >= 0
    # the metrics are the stages' own, in stage order; the grids show the rollout's samples
    assert list(metrics.items()) == [("adv/x", 1.0), ("train/loss", 2.0), ("reward/x", 3.0)]
    assert trainer.last_images is samples.images
