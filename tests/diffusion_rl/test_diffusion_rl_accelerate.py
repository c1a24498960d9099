"""The trainer on accelerate as accelerate users expect: launch flags, trackers, launch configs, and FSDP."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from accelerate import Accelerator
from accelerate.tracking import GeneralTracker

from diffusion_rl.checkpointing import read_checkpoint
from diffusion_rl.config import from_dict
from diffusion_rl.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]
MOCK = {"reward": {"rewards": {"mock": 1.0}}}  # a config must name its reward
PROMPTS = ["a red circle", "a blue square", "a green star"]


@pytest.fixture(scope="module")
def sd3(tiny_pipeline_dir):
    """The session's tiny SD3 pipeline (conftest.tiny_pipeline_dir: built once per worker, shared read-only)."""
    return str(tiny_pipeline_dir("sd3"))


def _cfg(pipe: str, out: Path, **train) -> dict:
    return {
        "model": {"pretrained": pipe, "height": 16, "width": 16, "lora_rank": 4, "lora_alpha": 4, "max_sequence_length": 8},
        "sample": {"num_steps": 2, "guidance_scale": 2.0, "kernel": "flow_sde", "noise_level": 0.7,
                   "prompts_per_iteration": 2, "group_size": 2, "batch_size": 4},
        "train": {"algorithm": "grpo", "iterations": 1, "learning_rate": 1e-3, "probe": "error",
                  "timestep_fraction": 0.5, **train},
        "prompts": {"train": PROMPTS},
        "log": {"output_dir": str(out), "eval_every": 0, "grid_every": 0, "progress": False},
        **MOCK,
    }


@pytest.fixture
def fresh_accelerate_state():
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def test_launch_mixed_precision_is_honoured_unless_the_config_sets_it(monkeypatch, fresh_accelerate_state):
    """`accelerate launch --mixed_precision bf16` reaches the process as ACCELERATE_MIXED_PRECISION."""
    from accelerate.state import AcceleratorState

    from diffusion_rl.accelerator import make_accelerator

    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    assert make_accelerator(from_dict(MOCK)).mixed_precision == "bf16"
    AcceleratorState._reset_state(reset_partial_state=True)
    assert make_accelerator(from_dict({**MOCK, "train": {"mixed_precision": "no"}})).mixed_precision == "no"


class Recorder(GeneralTracker):
    """A custom accelerate tracker that records what the trainer sends it."""

    name = "recorder"
    requires_logging_directory = False

    def __init__(self) -> None:
        super().__init__()
        self.config: dict | None = None
        self.scalars: list[tuple[int, dict]] = []
        self.images: list[tuple[int, str, list]] = []
        self.finished = False

    @property
    def tracker(self):
        return self

    def store_init_configuration(self, values: dict) -> None:
        self.config = values

    def log(self, values: dict, step: int | None = None, **kwargs) -> None:
        self.scalars.append((step, values))

    def log_images(self, values: dict, step: int | None = None, **kwargs) -> None:
        self.images += [(step, k, v) for k, v in values.items()]

    def finish(self) -> None:
        self.finished = True


def test_trackers_get_config_metrics_grids_and_are_closed(sd3, tmp_path):
    from PIL import Image

    rec = Recorder()
    cfg = _cfg(sd3, tmp_path, iterations=2)
    cfg["log"].update(grid_every=1, eval_every=2, project="shapes")
    cfg["prompts"]["eval"] = ["a red square"]
    trainer = Trainer(from_dict(cfg), accelerator=Accelerator(log_with=[rec]))
    trainer.fit()
    assert rec.config is not None and rec.config["train.learning_rate"] == 1e-3 and rec.config["log.project"] == "shapes"
    steps = [s for s, _ in rec.scalars]
    assert steps == [0, 1, 2]  # the baseline evaluation, then one entry per iteration
    assert "reward/mock" in rec.scalars[1][1] and "eval/mock" in rec.scalars[2][1]
    tags = {(s, k) for s, k, _ in rec.images}
    assert {(1, "train/samples"), (2, "train/samples"), (0, "eval/samples"), (2, "eval/samples")} <= tags
    step, _, [img] = next(i for i in rec.images if i[:2] == (2, "train/samples"))
    png = np.asarray(Image.open(tmp_path / "grids" / "train_000002.png").convert("RGB"))
    assert img.dtype == np.uint8 and np.array_equal(img, png)  # the grid itself, as (H, W, 3)
    assert rec.finished


def test_tracker_config_keys():
    from diffusion_rl.accelerator import tracker_init_kwargs

    log = from_dict({**MOCK, "log": {"trackers": ["wandb"], "run_name": "r1", "tags": ["sd3", "grpo"]}}).log
    assert tracker_init_kwargs(log) == {"wandb": {"name": "r1", "tags": ["sd3", "grpo"]}}
    # W&B writes its wandb/ folder under the run's folder, not the working directory (issue 28 item 11)
    assert tracker_init_kwargs(log, "runs/x")["wandb"]["dir"] == "runs/x"
    assert from_dict({**MOCK, "log": {"tensorboard": True, "trackers": ["tensorboard", "aim"]}}).log.all_trackers() == [
        "tensorboard", "aim"]
    from mmreward.errors import ConfigError

    with pytest.raises(ConfigError, match=r"log.trackers\[\] must be one of"):
        from_dict({**MOCK, "log": {"trackers": ["tensorbord"]}})


@pytest.mark.parametrize("name,kind,check", [
    ("ddp", "MULTI_GPU", lambda c: c.num_processes == 2),
    ("fsdp", "FSDP", lambda c: c.fsdp_config["fsdp_version"] == 2),
    ("deepspeed_zero2", "DEEPSPEED", lambda c: c.deepspeed_config["zero_stage"] == 2),
])
def test_shipped_accelerate_configs_parse(name, kind, check):
    from accelerate.commands.config.config_args import load_config_from_file

    cfg = load_config_from_file(str(REPO / "configs" / "accelerate" / f"{name}.yaml"))
    assert str(cfg.distributed_type).endswith(kind) and check(cfg)


@pytest.mark.parametrize("env,message", [
    ({"ACCELERATE_USE_DEEPSPEED": "true"}, "DeepSpeed needs CUDA GPUs"),
    ({"ACCELERATE_USE_FSDP": "true", "ACCELERATE_USE_CPU": "1"}, "FSDP needs GPUs under accelerate"),
])
def test_gpu_only_launch_configs_on_cpu_are_one_line_exit_2(sd3, tmp_path, monkeypatch, capsys, env, message):
    from diffusion_rl.cli import main

    if torch.cuda.is_available():
        monkeypatch.setenv("ACCELERATE_USE_CPU", "1")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(_cfg(sd3, tmp_path / "out")))
    assert main(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and "configs/accelerate/ddp.yaml" in err


def write_fsdp_config(sd3: str, tmp_path: Path) -> tuple[Path, dict]:
    """tests/_helpers/fsdp_cpu_run.py's config (its runs go to tmp_path/out): its path and the dict."""
    cfg = _cfg(sd3, tmp_path / "unused", iterations=2, ema=True, ema_update_every=1)
    cfg["model"]["lora"] = False
    cfg["sample"]["prompts_per_iteration"] = 4
    cfg["advantage"] = {"std_scope": "global"}
    cfg["log"]["save_every"] = 1
    path = tmp_path / "fsdp.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, cfg


@pytest.mark.slow
def test_fsdp_two_processes_save_resume_and_equal_ddp(sd3, tmp_path):
    """A full fine-tune sharded with FSDP2 over 2 CPU processes (gloo): checkpoint at 1, resume to 2, equals the
    uninterrupted FSDP run bit for bit, and the DDP run (same global batch) to float precision; its final/ is a
    pipeline folder that reproduces the trained model's samples, as is a LoRA run's adapter.

    Slow as its own torchrun launch: the default suite runs the same runner and check_fsdp_run in the 2-process
    launch of test_diffusion_rl_train.py::test_two_process_data_parallel_equals_one_process."""
    path, cfg = write_fsdp_config(sd3, tmp_path)
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    torchrun = Path(sys.executable).parent / "torchrun"
    proc = subprocess.run([str(torchrun), "--nproc_per_node", "2", str(REPO / "tests" / "_helpers" / "fsdp_cpu_run.py"), str(path),
                           str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    check_fsdp_run(sd3, tmp_path, cfg)


def check_fsdp_run(sd3: str, tmp_path: Path, cfg: dict) -> None:
    """What tests/_helpers/fsdp_cpu_run.py wrote to tmp_path/out (see the test above)."""
    # FSDP2 shards each of SD3's transformer blocks on its own, then the root: the adapter's block_classes reach the
    # TRANSFORMER_BASED_WRAP policy (diffusion_rl.accelerator.name_fsdp_blocks), as a GPU launch config does
    import json

    for run in ("fsdp_straight", "fsdp_lora"):
        units = json.loads((tmp_path / "out" / run / "fsdp_units.json").read_text())
        assert units[0] == "SD3Transformer2DModel" and len(units) > 1
        assert set(units[1:]) == {"JointTransformerBlock"}
    straight, resumed, ddp = (read_checkpoint(tmp_path / "out" / run / "checkpoints" / "iter_000002")
                              for run in ("fsdp_straight", "fsdp_resumed", "ddp"))
    assert len(straight["params"]) > 10  # every weight of the denoiser, gathered whole
    for n, p in straight["params"].items():
        assert torch.equal(p, resumed["params"][n]), n
        # DDP reduces gradients with all-reduce, FSDP with reduce-scatter: equal up to float rounding, which
        # Adam can amplify near its eps, so the tolerance is 1% of the total step (iterations x learning rate)
        torch.testing.assert_close(p, ddp["params"][n], rtol=0, atol=1e-2 * 2 * cfg["train"]["learning_rate"])
    for a, b in zip(straight["ema"]["shadow"], resumed["ema"]["shadow"], strict=True):
        assert torch.equal(a, b)
    assert [{k: v for k, v in h.items() if not k.startswith("time/")} for h in resumed["history"]] == \
        [{k: v for k, v in h.items() if not k.startswith("time/")} for h in straight["history"]]
    assert straight["history"][1]["train/grad_norm"] == pytest.approx(ddp["history"][1]["train/grad_norm"], rel=1e-5)
    # final/ of the FSDP full fine-tune is a complete pipeline folder that diffusers loads, and it is the trained
    # model: its samples equal those of the sharded model with its EMA weights (sampled in the run itself)
    from diffusers import DiffusionPipeline, StableDiffusion3Pipeline
    from safetensors.torch import load_file

    from diffusion_rl.pipelines import load_pipeline
    from tests._helpers.fsdp_cpu_run import sample
    from tests._helpers.tolerances import assert_close_scaled

    final = tmp_path / "out" / "fsdp_straight" / "final"
    assert (final / "model_index.json").is_file() and not list(final.rglob("*.bin"))
    loaded = DiffusionPipeline.from_pretrained(str(final))
    assert isinstance(loaded, StableDiffusion3Pipeline)
    assert type(loaded.transformer).__name__ == "SD3Transformer2DModel"  # not fully_shard's FSDP<Class>
    trained = load_file(str(tmp_path / "out" / "fsdp_straight" / "trained_samples.safetensors"))["images"]
    base = sample(load_pipeline(sd3))
    # images in [0, 1]; the same ops on the same (gathered) weights: measured equal, 1e-6 leaves room for a
    # reordered float sum; training must have moved the samples far more than that for this to mean anything
    assert float((trained - base).abs().max()) > 1e-3
    assert_close_scaled(sample(loaded), trained, rel=1e-6, scale=1.0)
    # a LoRA run under FSDP: the gathered adapter (written once, by the main process) loads with load_lora_weights
    lora_trained = load_file(str(tmp_path / "out" / "fsdp_lora" / "trained_samples.safetensors"))["images"]
    assert float((lora_trained - base).abs().max()) > 1e-3
    with_lora = load_pipeline(sd3)
    with_lora.load_lora_weights(str(tmp_path / "out" / "fsdp_lora" / "final"))
    assert_close_scaled(sample(with_lora), lora_trained, rel=1e-6, scale=1.0)
