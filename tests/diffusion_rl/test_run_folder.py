"""One run per output folder (issue 28 items 1 and 18): a rerun never mixes with an earlier run's files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from diffusion_rl import run_folder
from diffusion_rl.config import from_dict
from diffusion_rl.reporting import append_metrics
from diffusion_rl.trainer import Trainer
from mmreward.errors import ConfigError

PROMPTS = ["a red circle", "a blue square"]


@pytest.fixture(scope="module")
def sd3(tiny_pipeline_dir):
    """The session's tiny SD3 pipeline (conftest.tiny_pipeline_dir: built once per worker, shared read-only)."""
    return str(tiny_pipeline_dir("sd3"))


def _cfg(pipe: str, out: Path, iterations: int = 1, **log) -> dict:
    return {
        "model": {"pretrained": pipe, "height": 16, "width": 16, "lora_rank": 4, "lora_alpha": 4,
                  "max_sequence_length": 8},
        "sample": {"num_steps": 2, "guidance_scale": 2.0, "kernel": "flow_sde", "noise_level": 0.7,
                   "prompts_per_iteration": 2, "group_size": 2, "batch_size": 4},
        "train": {"algorithm": "grpo", "iterations": iterations, "learning_rate": 1e-2, "probe": "off",
                  "timestep_fraction": 0.5},
        "reward": {"rewards": {"mock": 1.0}},
        "prompts": {"train": PROMPTS},
        "log": {"output_dir": str(out), "eval_every": 0, "grid_every": 0, "progress": False, "save_every": 1,
                **log},
    }


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_rerun_into_a_used_folder_is_refused_then_overwrite_starts_clean(sd3, tmp_path):
    out = tmp_path / "run"
    first = Trainer(from_dict(_cfg(sd3, out, iterations=3)))
    first.fit()
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["iter_000001", "iter_000002", "iter_000003"]
    with pytest.raises(ConfigError, match=r"already holds files.*train\.resume_from=latest.*log\.overwrite=true"):
        Trainer(from_dict(_cfg(sd3, out, iterations=1)))
    assert [m["iteration"] for m in _metrics(out)] == [1, 2, 3]  # the refused run wrote nothing
    second = Trainer(from_dict(_cfg(sd3, out, iterations=1, overwrite=True)))
    second.fit()
    rows = _metrics(out)
    # issue 28's trace was [0,1,2,3,3,0,1,1] beside a stale iter_000003
    assert [m["iteration"] for m in rows] == [1]
    assert {m["run_id"] for m in rows} == {second.run_id} != {first.run_id}
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["iter_000001"]
    assert json.loads((out / "run.json").read_text())["run_id"] == second.run_id
    assert not (out / run_folder.LOCK_FILE).exists()  # released at the end


def test_new_run_suffix_writes_beside_the_earlier_run(sd3, tmp_path):
    out = tmp_path / "run"
    Trainer(from_dict(_cfg(sd3, out))).fit()
    t = Trainer(from_dict(_cfg(sd3, out, new_run_suffix=True)))
    assert t.out_dir == tmp_path / "run-2"
    t.fit()
    assert (tmp_path / "run-2" / "metrics.jsonl").is_file() and len(_metrics(out)) == 1
    # trackers (TensorBoard's logging_dir, W&B's dir) follow the folder the run really writes to
    assert t.accelerator.project_configuration.logging_dir == str(tmp_path / "run-2")
    with pytest.raises(ConfigError, match="choose one"):
        from_dict(_cfg(sd3, out, new_run_suffix=True, overwrite=True))


def test_latest_is_the_latest_of_this_run_and_resume_says_so(sd3, tmp_path, capfd):
    out = tmp_path / "run"
    Trainer(from_dict(_cfg(sd3, out, iterations=2))).fit()
    # a checkpoint another run left in the folder (copied in, run id rewritten): newer, but not this run's
    stray = out / "checkpoints" / "iter_000005"
    import shutil

    shutil.copytree(out / "checkpoints" / "iter_000002", stray)
    meta = json.loads((stray / "trainer_state.json").read_text())
    meta["run_id"], meta["iteration"] = "someone-else", 5
    (stray / "trainer_state.json").write_text(json.dumps(meta))
    capfd.readouterr()
    with pytest.warns(UserWarning, match=r"skipping .*iter_000005, saved by another run"):
        resumed = Trainer(from_dict({**_cfg(sd3, out, iterations=3),
                                     "train": {**_cfg(sd3, out, iterations=3)["train"], "resume_from": "latest"}}))
    assert resumed.iteration == 2 and resumed.run_id == json.loads((out / "run.json").read_text())["run_id"]
    err = capfd.readouterr().err
    assert f"resuming run {resumed.run_id} from {out / 'checkpoints' / 'iter_000002'} at iteration 2 of 3" in err
    resumed.fit()
    assert [m["iteration"] for m in _metrics(out)] == [1, 2, 3]
    assert {m["run_id"] for m in _metrics(out)} == {resumed.run_id}


def test_a_second_run_on_a_folder_in_use_is_refused(sd3, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (out / run_folder.LOCK_FILE).write_text(str(holder.pid))
        with pytest.raises(ConfigError, match=rf"in use by another run \(pid {holder.pid}"):
            Trainer(from_dict({**_cfg(sd3, out), "log": {**_cfg(sd3, out)["log"], "overwrite": True}}))
    finally:
        holder.kill()
        holder.wait()
    # the holder is gone: its lock is stale, and a new run takes it over
    t = Trainer(from_dict(_cfg(sd3, out)))
    t.fit()
    assert _metrics(out)[-1]["run_id"] == t.run_id


def test_a_failing_final_evaluation_keeps_the_trained_weights(sd3, tmp_path, monkeypatch):
    out = tmp_path / "run"
    cfg = _cfg(sd3, out, iterations=1)
    cfg["prompts"]["eval"] = ["a red circle"]
    cfg["log"]["save_every"] = 0
    cfg["log"]["eval_at_start"] = False
    t = Trainer(from_dict(cfg))

    def broken(tag: str = ""):
        raise RuntimeError("reward server went away")

    monkeypatch.setattr(t, "evaluate", broken)
    with pytest.raises(RuntimeError, match="went away"):
        t.fit()
    ckpt = out / "checkpoints" / "iter_000001"
    assert ckpt.is_dir()
    resumed = Trainer(from_dict({**cfg, "train": {**cfg["train"], "resume_from": "latest"}}))
    for a, b in zip(t.trainable, resumed.trainable, strict=True):
        assert torch.equal(a, b)


def test_a_full_disk_never_leaves_half_a_metrics_line(tmp_path, monkeypatch):
    append_metrics(tmp_path, {"iteration": 0, "reward/mock": 0.5})
    real_open = open

    class Full:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.f.close()

        def seek(self, *a):
            return self.f.seek(*a)

        def truncate(self, n):
            return self.f.truncate(n)

        def write(self, data):
            self.f.write(data[: len(data) // 2])
            self.f.flush()
            raise OSError(28, "No space left on device")

        def flush(self):
            self.f.flush()

    monkeypatch.setattr("builtins.open", lambda p, mode="r", *a, **k: Full(real_open(p, mode, *a, **k))
                        if str(p).endswith("metrics.jsonl") and "a" in mode else real_open(p, mode, *a, **k))
    with pytest.raises(OSError, match="No space"):
        append_metrics(tmp_path, {"iteration": 1, "reward/mock": 0.25})
    monkeypatch.undo()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["iteration"] for x in lines] == [0]


def test_output_dir_that_is_a_file_is_a_config_error(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        run_folder.choose_output_dir(f, resuming=False, overwrite=False, new_run_suffix=False)
    assert os.path.isfile(f)
