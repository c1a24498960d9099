"""Packaging: the wheel ships the assets and scores outside the checkout; reward-only installs need no diffusion extra."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

import mmreward
from mmreward.checkpoints import resolve_files
from mmreward.errors import CheckpointError
from mmreward.synthetic import assets

REPO = Path(__file__).resolve().parents[1]
DIFFUSION_ONLY = ("diffusers", "peft", "matplotlib")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MMREWARD_ASSETS")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1", **extra)
    return env


_IGNORED_EVERYWHERE = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__")
# at the top of the checkout, what a build never reads: hidden folders (.git, .venv, .mypy_cache: hundreds of MB
# that made the copy most of this fixture's time) and the git-ignored run / docs-site outputs
_IGNORED_AT_TOP = {"runs", "outputs", "wandb", "site"}


def _copy_ignore(folder: str, names: list[str]) -> set[str]:
    skip = set(_IGNORED_EVERYWHERE(folder, names))
    if Path(folder) == REPO:
        skip |= {n for n in names if n.startswith(".") or n in _IGNORED_AT_TOP}
    return skip


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # a copy, so that the build leaves no build/ or egg-info in the checkout (and reuses no stale build/lib)
    src = out / "src"
    shutil.copytree(REPO, src, ignore=_copy_ignore)
    # --no-build-isolation: offline, with the setuptools/wheel of this environment
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--disable-pip-version-check",
         "-q", "-w", str(out), str(src)],
        capture_output=True, text=True, env=_env(), cwd=out, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (built,) = out.glob("mmreward-*.whl")
    return built


def test_wheel_metadata_and_files(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        (meta_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = Parser().parsestr(zf.read(meta_name).decode())
    # every shipped asset is in the wheel, under the importable mmreward package
    shipped = {str(p.relative_to(REPO / "assets")) for p in (REPO / "assets").rglob("*") if p.is_file()}
    packaged = {n[len("mmreward/_assets/"):] for n in names if n.startswith("mmreward/_assets/")}
    assert shipped and shipped == packaged
    assert "mmreward/_assets/shapesworld/pref/model.safetensors" in names
    assert not any(n.startswith(("tests/", "assets/")) for n in names)
    requires = meta.get_all("Requires-Dist")
    core = [r for r in requires if "extra ==" not in r]
    # a range, not a pin: installing into an existing verl / vLLM stack must keep its torch
    torch_req = next(r for r in core if r.startswith("torch") and not r.startswith("torchvision"))
    assert "==" not in torch_req and ">=" in torch_req
    assert not any(r.split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip() in DIFFUSION_ONLY for r in core)
    for extra, pkg in (("diffusion", "diffusers"), ("diffusion", "peft"), ("tracking", "wandb"),
                       ("tracking", "tensorboard"), ("datasets", "datasets"), ("dev", "diffusers")):
        assert any(r.startswith(pkg) and f'extra == "{extra}"' in r for r in requires), (extra, pkg)


def test_installed_wheel_scores_shapesworld_outside_the_checkout(wheel, tmp_path):
    target, work = tmp_path / "site", tmp_path / "elsewhere"
    work.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", "-q", "--target",
         str(target), str(wheel)],
        capture_output=True, text=True, env=_env(), timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    image = target / "mmreward" / "_assets" / "samples" / "red_circle.png"
    # one interpreter (torch is imported once): say where mmreward came from, then run `python -m mmreward score`
    # in it (runpy, as -m does)
    proc = subprocess.run(
        [sys.executable, "-c",
         "import runpy, sys, mmreward\nprint('FROM', mmreward.__file__)\nsys.argv[0] = 'mmreward'\n"
         "runpy.run_module('mmreward', run_name='__main__', alter_sys=True)\n",
         "score", "--reward", "shapesworld-pref", "--device", "cpu", "--prompt", "a red circle", "--no-progress",
         str(image)],
        capture_output=True, text=True, env=_env(PYTHONPATH=str(target)), cwd=work, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (where,) = [line[len("FROM "):] for line in proc.stdout.splitlines() if line.startswith("FROM ")]
    assert Path(where).resolve().is_relative_to(target.resolve()), proc.stdout
    (row,) = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert row["error"] is None and math.isfinite(row["score"])
    # the same image through the checkout's own copy of the assets gives the same score
    local = mmreward.load("shapesworld-pref", device="cpu").score(["a red circle"], [str(image)]).scores.item()
    assert row["score"] == pytest.approx(local, rel=1e-5, abs=1e-5 * max(1.0, abs(local)))


def _blocked(code: str, *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """Run `code` with diffusers, peft and matplotlib not importable (a reward-only install)."""
    prelude = f"import sys\nfor m in {DIFFUSION_ONLY!r}:\n    sys.modules[m] = None\n"
    return subprocess.run([sys.executable, "-c", prelude + code, *args], capture_output=True, text=True,
                          env=_env(PYTHONPATH=str(REPO)), cwd=cwd, timeout=300)


# One interpreter runs every step of the reward-only check (torch is imported once, not six times): each step's
# exit code, stdout and stderr are captured on its own and printed as one JSON line. Warnings are shown every time
# ("always"), so a warning a step prints reaches its captured stderr even when an earlier step printed it first.
_STEPS = """
import contextlib, io, json, runpy, warnings
warnings.simplefilter("always")

def step(fn):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = fn()
        except SystemExit as exc:
            rc = 0 if exc.code is None else exc.code
    return {"rc": rc, "out": out.getvalue(), "err": err.getvalue()}

def score():
    sys.argv = ["mmreward", "score", "--reward", "jpeg-compressibility", "--no-progress", IMAGE]
    runpy.run_module("mmreward", run_name="__main__")

def missing_extras():
    from mmreward.errors import MissingExtraError
    from diffusion_rl.inference.noise_to_image import NoiseToImage
    for mod in ("diffusion_rl.rollout", "diffusion_rl.trainer"):
        try:
            __import__(mod)
        except MissingExtraError as exc:
            print(mod, "->", exc)
    try:
        NoiseToImage.from_pretrained("some/pipeline")
    except MissingExtraError as exc:
        print("from_pretrained ->", exc)

import mmreward, mmreward.cli, vlm_rm.adapters.verl, vlm_rm.adapters.trl, vlm_rm.adapters.easyr1
import diffusion_rl.advantages, diffusion_rl.losses  # pure torch: usable without the extra
results = {"score": step(score), "missing": step(missing_extras)}
from diffusion_rl.cli import main
results.update({name: step(lambda argv=argv: main(argv)) for name, argv in json.loads(CLI_CALLS).items()})
print(json.dumps(results))
"""


def test_reward_only_install_scores_and_diffusion_rl_names_its_extra(tmp_path):
    """A reward-only install (no diffusers/peft/matplotlib): scoring works, diffusion_rl says what to install."""
    image = REPO / "assets" / "samples" / "red_circle.png"
    config = str(REPO / "configs" / "shapes_grpo.yaml")
    calls = {"train": ["train", "--config", config], "config": ["config", "--config", config]}
    # best-of-n and reno too (issue 28 item 5), before any reward is loaded (reno loaded its reward first)
    for command in ("best-of-n", "reno"):
        calls[command] = [command, "--pipeline", "some/pipeline", "--reward", "no-such-reward=1",
                          "--prompt", "a cat", "--output", str(tmp_path / command)]
    proc = _blocked(f"IMAGE = {str(image)!r}\nCLI_CALLS = {json.dumps(calls)!r}\n" + _STEPS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.splitlines()[-1])
    assert res["score"]["rc"] == 0, res["score"]["err"][-3000:]
    assert math.isfinite(json.loads(res["score"]["out"].splitlines()[-1])["score"])
    lines = res["missing"]["out"].strip().splitlines()
    assert res["missing"]["rc"] is None, res["missing"]
    assert len(lines) == 3 and all("pip install 'mmreward[diffusion]'" in line for line in lines), lines
    # the CLI: one line on stderr, exit 2 (a set-up error), no traceback; `config` needs no diffusers
    train = res["train"]
    assert train["rc"] == 2, train["err"][-3000:]
    assert train["err"].count("\n") == 1 and "mmreward[diffusion]" in train["err"] and "Traceback" not in train["err"]
    assert res["config"]["rc"] == 0, res["config"]["err"][-3000:]
    for command in ("best-of-n", "reno"):
        err = res[command]["err"]
        assert res[command]["rc"] == 2, (command, err[-3000:])
        assert err.count("\n") == 1 and "mmreward[diffusion]" in err, (command, err)
        assert "Traceback" not in err and not (tmp_path / command).exists()


def test_asset_lookup_env_override_and_clear_error(tmp_path, monkeypatch):
    # the checkout's assets/ is found without any set-up
    assert assets.asset_path("shapesworld/pref") == REPO / "assets" / "shapesworld" / "pref"
    found = resolve_files("mmreward-assets:shapesworld/clip", ["config.json"])
    assert found["config.json"] == REPO / "assets" / "shapesworld" / "clip" / "config.json"
    # MMREWARD_ASSETS wins, and is the only place looked at
    copy = tmp_path / "my-assets"
    (copy / "shapesworld").mkdir(parents=True)
    (copy / "shapesworld" / "pref").symlink_to(REPO / "assets" / "shapesworld" / "pref")
    monkeypatch.setenv("MMREWARD_ASSETS", str(copy))
    assert assets.PREF_DIR == copy / "shapesworld" / "pref"
    with pytest.raises(CheckpointError, match=r"shapesworld/aesthetic.*MMREWARD_ASSETS"):
        mmreward.load("shapesworld-aesthetic", device="cpu")
    # neither a checkout nor a wheel copy: the error says how to fix it
    monkeypatch.delenv("MMREWARD_ASSETS")
    monkeypatch.setattr(assets, "_PACKAGE", tmp_path / "site-packages" / "mmreward")
    with pytest.raises(CheckpointError, match=r"MMREWARD_ASSETS=/path/to/assets") as info:
        mmreward.load("shapesworld-pref", device="cpu")
    assert "source checkout" in str(info.value) and "installed package" in str(info.value)
    with pytest.raises(CheckpointError, match="inside the assets folder"):
        assets.asset_path("../pyproject.toml")
