"""The adapter conformance suite: one tester mixin that every generator adapter passes on a tiny pipeline built from
config, in the spirit of diffusers' tests/pipelines/test_pipelines_common.py (PipelineTesterMixin).

A family's test class subclasses `AdapterConformance` and gives only what is family-specific: how to build and save
its tiny pipeline (`build`), the keyword arguments of the pipeline's own sampling (`pipeline_kwargs`, or
`pipeline_sample` where the call itself differs), the geometry and the tolerances. Each behaviour is one test
method, so the first failure does not hide the others:

1. the ODE rollout equals the pipeline's own sampling from the same initial latents and scheduler;
2. each SDE step's log-prob equals an independent Gaussian density, written here from the papers' code:
   Flow-GRPO's `sde_step_with_logprob` (yifan123/flow_grpo@54809b5 flow_grpo/diffusers_patch/sd3_sde_with_logprob.py)
   for flow models and DDPO's `ddim_step_with_logprob` (kvablack/ddpo-pytorch@main
   ddpo_pytorch/diffusers_patch/ddim_with_logprob.py) for DDIM models, both transcribed in float64. The velocity /
   epsilon fed to the density is the adapter's `predict`, which behaviour 1 checks against the pipeline; the
   density, its mean, its std and the schedule's alphas are computed here, never through diffusion_rl.kernels;
3. the LoRA export reloads with the pipeline's `load_lora_weights` and reproduces the trained policy's outputs;
4. one GRPO iteration and 5. one DiffusionNFT iteration run through `Trainer` from the saved folder and change
   the LoRA (DDIM families: NFT is a flow-matching method, so the config is a typed error naming the kernel);
6. resume is bit-exact (2 iterations straight == 1 + resume 1), for the subset with `resume = True`;
7. bad resolutions, bad frame counts and missing source images are typed `ConfigError`s (three methods);
8. every default LoRA target wraps a module of the trained denoiser;
9. the adapter's FSDP2 block classes (`block_classes`) each name a module class of the tiny transformer.

A family class may add family-specific checks as methods reading the shared `grpo_run` fixture (one
iteration per family for the whole class), so they cost no extra training.

A family that fails a behaviour marks that method `xfail(strict=True)` with the measured reason
(`known_failure(AdapterConformance.test_x, "...")`), so fixing the adapter turns the marker into a failure to remove.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import torch

from diffusion_rl.kernels import Kernel
from diffusion_rl.pipelines import load_pipeline, make_adapter
from diffusion_rl.rollout import rollout, step_log_prob
from mmreward.errors import ConfigError
from tests._helpers.tolerances import assert_close_scaled

PROMPTS = ["a red circle on the left of a blue square", "a cat"]

# one folder per family for the whole session: building a tiny pipeline costs more than every test using it
_FOLDERS: dict[str, Path] = {}


def known_failure(test: Any, reason: str) -> Any:
    """`test` (a mixin method) marked xfail(strict=True) for one subclass only (marking the mixin's function would
    mark every family)."""

    @functools.wraps(test)
    def wrapper(*args, **kwargs):
        return test(*args, **kwargs)

    wrapper.pytestmark = [*getattr(test, "pytestmark", []), pytest.mark.xfail(strict=True, reason=reason)]
    return wrapper


def _flow_grpo_log_prob(x: torch.Tensor, v: torch.Tensor, x_next: torch.Tensor, sigma: float, sigma_next: float,
                        sigma_max: float, noise_level: float) -> torch.Tensor:
    """Flow-GRPO's sde_step_with_logprob (yifan123/flow_grpo@54809b5), transcribed in float64: std_dev_t =
    a sqrt(sigma / (1 - sigma)) with sigma = 1 replaced by sigma_max (the schedule's second sigma), the Euler-Maruyama
    mean of the marginal-preserving SDE, and the Gaussian log-density averaged over every latent element."""
    x, v, x_next = x.double(), v.double(), x_next.double()
    s, s_prev = torch.tensor(sigma, dtype=torch.float64), torch.tensor(sigma_next, dtype=torch.float64)
    dt = s_prev - s
    std_dev_t = torch.sqrt(s / (1 - torch.where(s == 1, torch.tensor(sigma_max, dtype=torch.float64), s))) * noise_level
    mean = x * (1 + std_dev_t**2 / (2 * s) * dt) + v * (1 + std_dev_t**2 * (1 - s) / (2 * s)) * dt
    std = std_dev_t * torch.sqrt(-dt)
    log_prob = -((x_next - mean) ** 2) / (2 * std**2) - torch.log(std) - math.log(math.sqrt(2 * math.pi))
    return log_prob.mean(dim=tuple(range(1, log_prob.ndim)))


def _ddpo_log_prob(x: torch.Tensor, out: torch.Tensor, x_next: torch.Tensor, a_t: float, a_prev: float, eta: float,
                   prediction_type: str, clip: float | None) -> torch.Tensor:
    """DDPO's ddim_step_with_logprob (kvablack/ddpo-pytorch ddpo_pytorch/diffusers_patch/ddim_with_logprob.py),
    transcribed in float64: x0 and eps from the prediction type, the clip, sigma_t = eta sqrt(variance) with the
    scheduler's _get_variance, the DDIM mean (Song et al. eq. 12) and the Gaussian log-density averaged."""
    x, out, x_next = x.double(), out.double(), x_next.double()
    beta_t = 1 - a_t
    if prediction_type == "epsilon":
        x0, eps = (x - beta_t**0.5 * out) / a_t**0.5, out
    else:  # v_prediction
        x0, eps = a_t**0.5 * x - beta_t**0.5 * out, a_t**0.5 * out + beta_t**0.5 * x
    if clip is not None:
        x0 = x0.clamp(-clip, clip)
    variance = (1 - a_prev) / (1 - a_t) * (1 - a_t / a_prev)
    std = eta * variance**0.5
    mean = a_prev**0.5 * x0 + max(1 - a_prev - std**2, 0.0) ** 0.5 * eps
    log_prob = -((x_next - mean) ** 2) / (2 * std**2) - math.log(std) - math.log(math.sqrt(2 * math.pi))
    return log_prob.mean(dim=tuple(range(1, log_prob.ndim)))


class AdapterConformance:
    """Mix into a `Test<Family>` class; set `family` and implement `build` (and the hooks below where needed)."""

    family: ClassVar[str] = ""
    height: ClassVar[int] = 16
    width: ClassVar[int] = 16
    num_frames: ClassVar[int | None] = None  # video families
    max_sequence_length: ClassVar[int | None] = 8
    steps: ClassVar[int] = 2
    guidance_scale: ClassVar[float] = 2.0
    source_size: ClassVar[tuple[int, int] | None] = None  # edit / I2V sources (W, H); None: the output size
    latents_rel: ClassVar[float] = 1e-5
    images_atol: ClassVar[float] = 2e-6  # decoded pixels in [0, 1]
    resume: ClassVar[bool] = False  # behaviour 6 is costly: a representative subset runs it
    # a kind of tests/conftest.py's session `tiny_pipeline_dir` ("sd", "sdxl", "sd3", "flux"): the class reads that
    # folder (read-only) instead of building and saving the same tiny pipeline again with `build`
    session_pipeline: ClassVar[str | None] = None
    # default LoRA targets the tiny transformer cannot have (its shape, not the adapter's): asserted missing exactly
    tiny_absent_lora_targets: ClassVar[tuple[str, ...]] = ()

    # -- hooks --------------------------------------------------------------------------------------------------
    def build(self, folder: Path) -> None:
        """Build the tiny pipeline from config and save it in the diffusers layout under `folder`."""
        raise NotImplementedError

    def pipeline_kwargs(self) -> dict[str, Any]:
        """Family-specific keywords of the pipeline's own `__call__` (max_sequence_length, num_frames, ...)."""
        kw: dict[str, Any] = {}
        if self.max_sequence_length is not None:
            kw["max_sequence_length"] = self.max_sequence_length
        if self.num_frames is not None:
            kw["num_frames"] = self.num_frames
        return kw

    def prepare_pipeline(self, pipe: Any) -> Any:
        """The pipeline as the reference sampler (e.g. with the scheduler the adapter samples with)."""
        return pipe

    def pipeline_latents(self, x: torch.Tensor) -> torch.Tensor:
        """Our latents (B, *latent_shape) in the layout the pipeline's `latents=` takes."""
        return x

    def load_lora(self, pipe: Any, final: Path) -> None:
        """Load the exported LoRA folder the way a user of this pipeline does."""
        pipe.load_lora_weights(str(final))

    def output_latents(self, x: torch.Tensor) -> torch.Tensor | None:
        """Our final latents in the layout of the pipeline's `output_type="latent"` result (None: that result is
        not the sampled state, e.g. un-patchified latents; the decoded comparison then covers the family)."""
        return self.pipeline_latents(x)

    def pipeline_sample(self, pipe: Any, prompts: list, x0: torch.Tensor, output_type: str,
                        guidance_scale: float) -> torch.Tensor:
        """The pipeline's own sampling from `x0` (our layout); `.images` or `.frames`."""
        kw = {"height": self.height, "width": self.width, "num_inference_steps": self.steps,
              "guidance_scale": guidance_scale, "output_type": output_type, **self.pipeline_kwargs()}
        if self.is_edit:
            from PIL import Image

            kw["image"] = [Image.open(p.source).convert("RGB") for p in prompts]
        out = pipe(prompt=[str(p) for p in prompts], latents=self.pipeline_latents(x0).clone(), **kw)
        return out.frames if hasattr(out, "frames") else out.images

    # -- fixtures -----------------------------------------------------------------------------------------------
    @property
    def is_video(self) -> bool:
        return self.num_frames is not None

    @property
    def is_edit(self) -> bool:
        from diffusion_rl.adapters import ADAPTERS

        return bool(ADAPTERS[self.family].is_edit)

    @pytest.fixture(scope="class")
    def folder(self, tmp_path_factory, request) -> Path:
        if self.session_pipeline is not None:  # the session's copy (tests/conftest.py), which other files use too
            return Path(request.getfixturevalue("tiny_pipeline_dir")(self.session_pipeline))
        key = type(self).__name__
        if key not in _FOLDERS:
            path = tmp_path_factory.mktemp(f"conformance_{self.family}") / "pipe"
            self.build(path)
            _FOLDERS[key] = path
        return _FOLDERS[key]

    @pytest.fixture(scope="class")
    def pipe(self, folder) -> Any:
        """Loaded back frozen through the real loader, as a run loads model.pretrained."""
        pipe = load_pipeline(str(folder))
        pipe.set_progress_bar_config(disable=True)
        return pipe

    @pytest.fixture(scope="class")
    def prompts(self, tmp_path_factory) -> list:
        """Plain prompts, or edit records whose source images are random pictures on disk."""
        if not self.is_edit:
            return list(PROMPTS)
        from PIL import Image

        from mmreward.edit import EditPrompt

        root = tmp_path_factory.mktemp(f"sources_{self.family}")
        w, h = self.source_size or (self.width, self.height)
        rng = np.random.default_rng(0)
        out = []
        for i, text in enumerate(PROMPTS):
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(root / f"src{i}.png")
            out.append(EditPrompt(text, root / f"src{i}.png"))
        return out

    def adapter(self, pipe: Any) -> Any:
        return make_adapter(pipe, self.height, self.width, self.max_sequence_length, num_frames=self.num_frames)

    def sde_kernel(self, adapter: Any) -> Kernel:
        return Kernel("flow_sde", 0.7) if adapter.is_flow else Kernel("ddim", 1.0)

    def ode_kernel(self, adapter: Any) -> Kernel:
        return Kernel("ode", 0.0) if adapter.is_flow else Kernel("ddim", 0.0)

    def run_config(self, folder: Path, out: Path, prompts: list, algorithm: str = "grpo", iterations: int = 1,
                   **train: Any) -> Any:
        """A run on the saved tiny pipeline with the mock reward: the config a user writes, at tiny sizes."""
        from diffusion_rl.config import from_dict

        if self.is_edit:
            rows = out.parent / f"{out.name}_edits.jsonl"
            rows.parent.mkdir(parents=True, exist_ok=True)
            rows.write_text("".join(json.dumps({"source_image": str(p.source), "instruction": str(p)}) + "\n"
                                    for p in prompts))
            train_prompts: Any = str(rows)
        else:
            train_prompts = list(prompts)
        flow = self._is_flow()
        model = {"pretrained": str(folder), "height": self.height, "width": self.width, "lora_rank": 4,
                 "lora_alpha": 16, "max_sequence_length": self.max_sequence_length}
        if self.num_frames is not None:
            model["num_frames"] = self.num_frames
        cfg: dict[str, Any] = {
            "model": model,
            "sample": {"num_steps": self.steps, "guidance_scale": self.guidance_scale,
                       "kernel": "flow_sde" if flow else "ddim", "noise_level": 0.7 if flow else 1.0,
                       "prompts_per_iteration": 2, "group_size": 2, "batch_size": 4},
            "train": {"algorithm": algorithm, "iterations": iterations, "learning_rate": 3e-2, "probe": "error",
                      "timestep_fraction": 1.0, **train},
            "advantage": {"min_count": 2},
            "reward": {"rewards": {"mock": 1.0}},
            "prompts": {"train": train_prompts},
            "log": {"output_dir": str(out), "eval_every": 0, "grid_every": 0, "progress": False},
        }
        if algorithm == "nft":
            cfg["preset"] = "diffusion_nft"
            cfg["sample"] = {k: v for k, v in cfg["sample"].items() if k not in ("kernel", "noise_level",
                                                                                 "guidance_scale")}
            cfg["train"].pop("probe")
        return from_dict(cfg)

    def _is_flow(self) -> bool:
        from diffusion_rl.adapters import ADAPTERS

        return bool(ADAPTERS[self.family].is_flow)

    @pytest.fixture(scope="class")
    def grpo_run(self, folder, prompts, tmp_path_factory) -> dict[str, Any]:
        """One GRPO iteration through Trainer.fit() from the saved folder (behaviours 3 and 4 read it)."""
        from diffusion_rl.trainer import Trainer

        out = tmp_path_factory.mktemp(f"grpo_{self.family}") / "run"
        trainer = Trainer(self.run_config(folder, out, prompts))
        before = [p.detach().clone() for p in trainer.trainable]
        trainer.fit()
        return {"trainer": trainer, "before": before, "out": out}

    # -- 1. ODE rollout == the pipeline's own sampling -----------------------------------------------------------
    @pytest.mark.parity
    @torch.no_grad()
    def test_ode_rollout_equals_the_pipelines_sampling(self, pipe, prompts):
        from tests._helpers.parity_record import record_parity

        adapter = self.adapter(pipe)
        assert adapter.family == self.family
        traj = rollout(adapter, adapter.encode(prompts), [0, 1], [0, 0], num_steps=self.steps,
                       guidance_scale=self.guidance_scale, kernel=self.ode_kernel(adapter))
        assert (traj.log_probs == 0).all()
        ref_pipe = self.prepare_pipeline(pipe)
        x0 = traj.latents[:, 0]
        ours = self.output_latents(traj.latents[:, -1])
        if ours is not None:
            ref_lat = self.pipeline_sample(ref_pipe, prompts, x0, "latent", self.guidance_scale)
            assert_close_scaled(ours, ref_lat, rel=self.latents_rel)
        ref = self.pipeline_sample(ref_pipe, prompts, x0, "pt", self.guidance_scale)
        record_parity(f"conformance/{self.family}", original=f"diffusers {type(pipe).__name__}.__call__",
                      how="package", actual=traj.images, expected=ref,
                      cases=[f"{self.steps} steps, guidance {self.guidance_scale}"])
        assert traj.images.shape == ref.shape
        torch.testing.assert_close(traj.images, ref.float(), atol=self.images_atol, rtol=0)
        assert traj.images.min() >= 0 and traj.images.max() <= 1
        assert float(traj.images.std()) > 1e-3  # content, not a constant

    # -- 2. each SDE step's log-prob == an independent Gaussian density -----------------------------------------
    @torch.no_grad()
    def test_sde_log_probs_are_independent_gaussian_densities(self, pipe, prompts):
        adapter = self.adapter(pipe)
        emb = adapter.encode(prompts)
        kernel = self.sde_kernel(adapter)
        traj = rollout(adapter, emb, [0, 1], [0, 1], num_steps=self.steps, guidance_scale=self.guidance_scale,
                       kernel=kernel, sde_steps=list(range(self.steps)), decode=False)
        sched = traj.schedule
        for j in range(self.steps):
            x, x_next = traj.latents[:, j], traj.latents[:, j + 1]
            t = sched.timesteps[j].expand(2)
            out = adapter.predict(adapter.denoiser, x, t, emb, self.guidance_scale)
            if adapter.is_flow:
                density = _flow_grpo_log_prob(x, out, x_next, float(sched.a[j]), float(sched.b[j]),
                                              float(sched.a[1]) if self.steps > 1 else float(sched.b[0]),
                                              kernel.noise_level)
            else:
                scheduler = pipe.scheduler
                cumprod = scheduler.alphas_cumprod.double()
                tt = int(sched.timesteps[j])
                prev = tt - scheduler.config.num_train_timesteps // self.steps
                a_prev = float(cumprod[prev]) if prev >= 0 else float(scheduler.final_alpha_cumprod)
                clip = (scheduler.config.clip_sample_range if getattr(scheduler.config, "clip_sample", False)
                        else None)
                a_t = float(cumprod[tt])
                if (1 - a_prev) / (1 - a_t) * (1 - a_t / a_prev) <= 0:
                    # a final step onto alpha_prev = 1 (set_alpha_to_one, CogVideoX) has sigma_t = 0: a point mass,
                    # whose log-prob the kernels define as 0, and the deterministic DDIM step
                    assert (traj.log_probs[:, j] == 0).all()
                    continue
                density = _ddpo_log_prob(x, out, x_next, a_t, a_prev, kernel.noise_level,
                                         scheduler.config.prediction_type, clip)
            assert (traj.log_probs[:, j] != 0).all()
            assert_close_scaled(traj.log_probs[:, j].double(), density, rel=1e-5)
            # the training path recomputes the rollout's log-prob
            res = step_log_prob(adapter, adapter.denoiser, x, x_next, torch.full((2,), j), sched, emb,
                                self.guidance_scale, kernel)
            assert_close_scaled(res.log_prob, traj.log_probs[:, j], rel=1e-6)

    # -- 3. LoRA export reloads with load_lora_weights to the trained outputs -----------------------------------
    @torch.no_grad()
    def test_lora_export_reloads_with_load_lora_weights(self, grpo_run, folder, prompts):
        trainer = grpo_run["trainer"]
        final = grpo_run["out"] / "final"
        assert final.is_dir(), "fit() wrote no final/ LoRA export"
        kernel = self.ode_kernel(trainer.adapter)

        # the text encoders are frozen and every copy loads the same folder: encode once (Qwen-Image-Edit's source
        # encodings are the slowest step of that family's class)
        emb = trainer.adapter.encode(prompts)

        def sample(adapter: Any, model: Any = None) -> torch.Tensor:
            return rollout(adapter, emb, [0, 1], [0, 0], num_steps=self.steps,
                           guidance_scale=self.guidance_scale, kernel=kernel, model=model, decode=False,
                           seed=7).latents[:, -1]

        trained = sample(trainer.adapter)
        base = sample(self.adapter(load_pipeline(str(folder))))
        scale = float(trained.abs().max())
        assert float((trained - base).abs().max()) > 1e-4 * scale, "training did not move the samples"
        loaded = load_pipeline(str(folder))
        self.load_lora(loaded, final)
        assert_close_scaled(sample(self.adapter(loaded)), trained, rel=1e-5)

    # -- 4. one GRPO iteration -----------------------------------------------------------------------------------
    def test_one_grpo_iteration_changes_the_lora(self, grpo_run):
        trainer = grpo_run["trainer"]
        assert trainer.adapter.family == self.family
        (metrics,) = trainer.history
        assert math.isfinite(metrics["train/loss"])
        assert metrics["train/probe/max_abs_log_ratio"] < 1e-5  # the training path reproduces the rollout
        changed = sum(not torch.equal(a, p.detach()) for a, p in zip(grpo_run["before"], trainer.trainable))
        assert changed > 0, "the GRPO step moved no LoRA parameter"

    # -- 5. one DiffusionNFT iteration ---------------------------------------------------------------------------
    def test_one_nft_iteration_changes_the_lora(self, folder, prompts, tmp_path):
        from diffusion_rl.trainer import Trainer

        if not self._is_flow():  # NFT trains a velocity field: DDIM families get a typed error naming the family
            # (raised at the first iteration, after the pipeline is loaded, not when the Trainer is built)
            with pytest.raises(ConfigError, match=f"flow model's velocity.*{self.family}"):
                Trainer(self.run_config(folder, tmp_path / "run", prompts, algorithm="nft",
                                        micro_batch_size=2)).train_iteration(0)
            return
        trainer = Trainer(self.run_config(folder, tmp_path / "run", prompts, algorithm="nft", micro_batch_size=2))
        before = [p.detach().clone() for p in trainer.trainable]
        metrics = trainer.train_iteration(0)
        assert math.isfinite(metrics["train/loss"]) and metrics["train/grad_norm"] > 0
        assert any(not torch.equal(a, p.detach()) for a, p in zip(before, trainer.trainable))

    # -- 6. resume is bit-exact ----------------------------------------------------------------------------------
    def test_resume_is_bit_exact(self, folder, prompts, tmp_path):
        if not self.resume:
            pytest.skip("resume runs for a representative subset (sd, flux_kontext, wan, wan 2.2 two experts; sd3 in the "
                        "algorithm tests) to keep the suite fast")
        from diffusion_rl.trainer import Trainer

        straight = Trainer(self.run_config(folder, tmp_path / "a", prompts, iterations=2))
        straight.fit()
        first = Trainer(self.run_config(folder, tmp_path / "b", prompts, iterations=1))
        first.fit()
        ckpt = tmp_path / "b" / "checkpoints" / "iter_000001"
        resumed = Trainer(self.run_config(folder, tmp_path / "b", prompts, iterations=2, resume_from=str(ckpt)))
        assert resumed.iteration == 1
        resumed.fit()
        for a, b in zip(straight.trainable, resumed.trainable, strict=True):
            assert torch.equal(a, b)

        def without_times(history: list[dict]) -> list[dict]:
            return [{k: v for k, v in h.items() if not k.startswith("time/")} for h in history]

        assert without_times(resumed.history) == without_times(straight.history)

    # -- 7. typed errors, one method per input so the first failure hides none of the others -------------------
    def test_bad_resolution_is_a_config_error(self, pipe):
        h, w, msl, frames = self.height, self.width, self.max_sequence_length, self.num_frames
        with pytest.raises(ConfigError, match="multiple"):
            make_adapter(pipe, h + 1, w, msl, num_frames=frames)
        with pytest.raises(ConfigError, match="multiple"):
            make_adapter(pipe, h, w + 1, msl, num_frames=frames)

    def test_bad_frame_count_is_a_config_error(self, pipe):
        h, w, msl, frames = self.height, self.width, self.max_sequence_length, self.num_frames
        if frames is not None:  # a count the VAE's temporal factor cannot make
            with pytest.raises(ConfigError, match="num_frames"):
                make_adapter(pipe, h, w, msl, num_frames=frames + 1)
        else:  # any frame count for an image pipeline
            with pytest.raises(ConfigError, match="makes images"):
                make_adapter(pipe, h, w, msl, num_frames=5)

    def test_missing_source_image_is_a_config_error(self, pipe):
        if not self.is_edit:
            pytest.skip("a text-to-image/video family takes plain prompts")
        with pytest.raises(ConfigError, match="has no source image"):
            self.adapter(pipe).encode(["make the circle blue"])

    # -- LoRA targets and FSDP block classes name modules of this transformer ---------------------------------
    def test_every_lora_target_wraps_a_module(self, grpo_run):
        """Every default LoRA target of the family wraps at least one module of the trained denoiser (a target
        that matches nothing is silently dropped by PEFT when another one matches)."""
        from diffusion_rl.adapters import DEFAULT_LORA_TARGETS

        trainer = grpo_run["trainer"]
        wrapped = {n.split(".lora_A")[0] for n, _ in trainer.adapter.denoiser.named_parameters() if ".lora_A" in n}
        missing = [t for t in DEFAULT_LORA_TARGETS[self.family] if not any(w.endswith("." + t) for w in wrapped)]
        assert wrapped and missing == list(self.tiny_absent_lora_targets), f"LoRA targets wrapping no module: {missing}"

    def test_fsdp_block_classes_name_modules_of_the_transformer(self, pipe):
        """The adapter's `block_classes` (the FSDP2 wrap policy's transformer_cls_names_to_wrap) each name a module
        class found in the tiny transformer, as accelerate's get_module_class_from_name looks them up."""
        from accelerate.utils.dataclasses import get_module_class_from_name

        adapter = self.adapter(pipe)
        names = adapter.block_classes
        assert names, f"{type(adapter).__name__}.block_classes is empty"
        for name in names:
            cls = get_module_class_from_name(adapter.denoiser, name)
            assert cls is not None, f"no {name} module in {type(adapter.denoiser).__name__}"
            assert sum(isinstance(m, cls) for m in adapter.denoiser.modules()) >= 1
