"""Run the original packages themselves (hpsv3, image-reward, hpsv2, torchmetrics, ...) on the same tiny random
checkpoints as ours, each in its own pinned virtual environment, and record the differences for docs/parity.md.

For each family: (1) make or reuse a venv under --venv-root (default ~/.cache/mmreward/parity-venvs/<family>)
with the package at a pinned version and the versions it pins; torch is not downloaded again: a .pth file
appends this project's site-packages AFTER the venv's own, so the venv's pinned packages (transformers 4.45.2
for hpsv3, ...) win and everything else, torch included, comes from here. (2) Write a tiny random checkpoint
in the official format with our test builders, and a fixed set of images (RGB, grayscale, odd size, RGBA).
(3) Score them with the package, in its venv, through a small runner (scripts/parity_runners/run_<family>.py,
which imports nothing of ours and prints JSON), and with `mmreward.load(...)`. (4) Append one row per family
to the parity log (tests/_helpers/parity_record.py's JSON lines, how="package") and print a summary.

A family whose package cannot be installed or run offline is reported with the reason, not silently skipped.
Exit status: 0 when every family that ran is within its tolerance, 1 otherwise (2: setup failed).
Usage: python scripts/parity_packages.py [--only hpsv3,imagereward] [--log FILE] [--json OUT]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RUNNERS = ROOT / "scripts" / "parity_runners"
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
IMAGE_CASES = ["RGB", "grayscale", "odd size (37x61, 333x517)", "RGBA (alpha 0-255)"]


@dataclass
class Family:
    """One original package: how to install it, how to build its checkpoint, how to score both sides."""

    name: str
    original: str  # "package==version (pins)" for the parity table
    install: list[str]  # pip requirements, resolved with this project's packages visible (nothing re-downloaded)
    no_deps: list[str]  # installed with --no-deps (packages whose declared deps are training-only or too broad)
    build: Callable[[Path, dict], dict]  # (workdir, images) -> runner spec (checkpoint paths, prompts ...)
    ours: Callable[[dict], np.ndarray]  # spec -> our scores, same shape as the runner's
    rel: float  # tolerance: max |ours - package| / max |package|
    no_build_isolation: list[str] = field(default_factory=list)  # sdists built against the venv's own torch
    not_checked: str = ""
    columns: list[str] = field(default_factory=lambda: ["score"])


# ------------------------------------------------------------------------------------------------
# inputs shared by every family
# ------------------------------------------------------------------------------------------------
def write_images(folder: Path) -> list[str]:
    """RGB, grayscale, odd-size RGB and RGBA PNGs with smooth structure plus noise (so resampling matters)."""
    from PIL import Image

    rng = np.random.default_rng(23)
    specs = [("rgb.png", "RGB", (64, 80)), ("gray.png", "L", (50, 40)), ("odd.png", "RGB", (37, 61)),
             ("rgba.png", "RGBA", (45, 45)), ("large_odd.png", "RGB", (333, 517))]
    paths = []
    for name, mode, (h, w) in specs:
        yy, xx = np.mgrid[:h, :w]
        base = 127 + 100 * np.sin(xx / 5.0 + yy / 9.0)
        chans = {"RGB": 3, "L": 1, "RGBA": 4}[mode]
        arr = np.stack([base * (0.5 + 0.25 * c) for c in range(chans)], axis=-1)
        arr = np.clip(arr + rng.normal(0, 25, arr.shape), 0, 255).astype(np.uint8)
        if mode == "RGBA":
            arr[..., 3] = np.linspace(0, 255, w).round().astype(np.uint8)[None, :]
        Image.fromarray(arr[..., 0] if mode == "L" else arr, mode).save(folder / name)
        paths.append(str(folder / name))
    return paths


PROMPTS = ["a cat", "a dog in the rain", "two red apples on a table", "a city at night", "a green triangle"]


# ------------------------------------------------------------------------------------------------
# HPSv3 (MizzenAI/HPSv3, pip hpsv3==1.0.0)
# ------------------------------------------------------------------------------------------------
def _legacy_keys(sd: dict) -> dict:
    """Current transformers keys -> the 4.x names HPSv3.safetensors was saved with (visual.*, model.*)."""
    out = {}
    for k, v in sd.items():
        if k.startswith("model.visual."):
            k = "visual." + k[len("model.visual."):]
        elif k.startswith("model.language_model."):
            k = "model." + k[len("model.language_model."):]
        out[k] = v.contiguous()
    return out


def build_hpsv3(work: Path, images: list[str]) -> dict:
    import torch
    from safetensors.torch import save_file
    from torch import nn
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from mmreward.testing.qwen_vl import build_tiny_qwen_vl

    base = work / "hpsv3-base"
    build_tiny_qwen_vl(base, variant="qwen2_vl", seed=11, max_pixels=28 * 28 * 1280)
    proc = AutoProcessor.from_pretrained(base)
    proc.tokenizer.add_special_tokens({"additional_special_tokens": ["<|Reward|>"]})
    vlm = AutoModelForImageTextToText.from_pretrained(base).eval()
    vlm.resize_token_embeddings(len(proc.tokenizer), mean_resizing=False)
    g = torch.Generator().manual_seed(21)
    with torch.no_grad():
        emb = vlm.get_input_embeddings().weight
        emb[-1:] = torch.randn(1, emb.shape[1], generator=g)
    hidden = vlm.config.text_config.hidden_size
    torch.manual_seed(22)  # HPSv3_7B.yaml's "ranknet" head: Linear 1024, ReLU, Dropout, Linear 16, ReLU, Linear 2
    head = nn.Sequential(nn.Linear(hidden, 1024), nn.ReLU(), nn.Dropout(0.05), nn.Linear(1024, 16), nn.ReLU(),
                         nn.Linear(16, 2))
    with torch.no_grad():  # larger weights so that the scores spread visibly on a random backbone
        for layer in (head[0], head[3], head[5]):
            layer.weight.mul_(4.0)
    sd = _legacy_keys(vlm.state_dict())
    sd.update({f"rm_head.{k}": v.contiguous() for k, v in head.state_dict().items()})
    ckpt = work / "hpsv3-ckpt"
    ckpt.mkdir()
    save_file(sd, str(ckpt / "HPSv3.safetensors"))
    return {"checkpoint": str(ckpt / "HPSv3.safetensors"), "base": str(base), "base_445": str(_as_445(base)),
            "images": images[:4], "prompts": PROMPTS[:4]}


def _as_445(base: Path) -> Path:
    """The same base checkpoint (same weight file, hard-linked) under the file names transformers 4.45 reads,
    as Qwen/Qwen2-VL-7B-Instruct on the hub has them: text settings at the top level of config.json,
    preprocessor_config.json with min/max_pixels, chat_template.json."""
    out = base.with_name(base.name + "-445")
    out.mkdir()
    for f in base.iterdir():
        if f.name != "processor_config.json":  # 4.45 would read it as the processor's own arguments
            os.link(f, out / f.name)
    cfg = json.loads((base / "config.json").read_text())
    for k, v in cfg.pop("text_config", {}).items():
        cfg.setdefault(k, v)
    rope = cfg.pop("rope_parameters")  # transformers 5's name; 4.45 reads rope_scaling + rope_theta
    cfg.update(rope_theta=rope["rope_theta"], rope_scaling={"type": "mrope", "mrope_section": rope["mrope_section"]},
               model_type="qwen2_vl")
    (out / "config.json").unlink()
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    image = json.loads((base / "processor_config.json").read_text())["image_processor"]
    size = image.pop("size")
    image.update(min_pixels=size["shortest_edge"], max_pixels=size["longest_edge"], processor_class="Qwen2VLProcessor")
    (out / "preprocessor_config.json").write_text(json.dumps(image, indent=2))
    template = (base / "chat_template.jinja").read_text()
    (out / "chat_template.json").write_text(json.dumps({"chat_template": template}))
    return out


def ours_hpsv3(spec: dict) -> np.ndarray:
    import torch

    import mmreward

    reward = mmreward.load("hpsv3", checkpoint=str(Path(spec["checkpoint"]).parent), base_model=spec["base"])
    out = reward.score(spec["prompts"], spec["images"])
    return torch.stack([out.scores, out.details["sigma"]], dim=1).double().numpy()


# ------------------------------------------------------------------------------------------------
# ImageReward (THUDM/ImageReward, pip image-reward==1.5)
# ------------------------------------------------------------------------------------------------
def _redraw(sd: dict, seed: int) -> dict:
    """Well-scaled random values, so that every part of the network moves the score."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, v in sd.items():
        if not v.is_floating_point():
            out[k] = v
        elif v.ndim >= 2:
            scale = 0.5 if "embed" in k else v[0].numel() ** -0.5
            out[k] = torch.randn(v.shape, generator=g) * scale
        elif k.endswith("weight"):
            out[k] = 1 + 0.1 * torch.randn(v.shape, generator=g)
        else:
            out[k] = 0.1 * torch.randn(v.shape, generator=g)
    return out


def _hub_cache(home: Path, repo: str, folder: Path, names: list[str]) -> None:
    """A Hugging Face hub cache entry for `repo` holding files of `folder`, so that offline
    `from_pretrained(repo)` finds them (the layout huggingface_hub writes: refs/main -> snapshots/<rev>)."""
    entry = home / "hub" / f"models--{repo.replace('/', '--')}"
    rev = "0" * 40
    (entry / "refs").mkdir(parents=True)
    (entry / "refs" / "main").write_text(rev)
    snap = entry / "snapshots" / rev
    snap.mkdir(parents=True)
    for n in names:
        (snap / n).write_bytes((folder / n).read_bytes())


def build_imagereward(work: Path, images: list[str]) -> dict:
    """The package builds BLIP ViT-L/16 and a 768-wide MLP whatever the file holds, so the vision tower has
    the official geometry (random, 303M parameters); the BERT text encoder is 2 layers (from med_config)."""
    import torch

    from mmreward.models.image_reward import ImageRewardModel
    from mmreward.tokenizers import build_bert_tokenizer

    folder = work / "imagereward-ckpt"
    tok = build_bert_tokenizer(folder)
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))  # what BertTokenizer reads
    tok.add_special_tokens({"bos_token": "[DEC]"})
    tok.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
    med = {"architectures": ["BertModel"], "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
           "hidden_dropout_prob": 0.1, "initializer_range": 0.02, "layer_norm_eps": 1e-12,
           "max_position_embeddings": 512, "model_type": "bert", "pad_token_id": 0, "type_vocab_size": 2,
           "vocab_size": len(tok), "encoder_width": 1024, "add_cross_attention": True, "hidden_size": 768,
           "intermediate_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 12}
    (folder / "med_config.json").write_text(json.dumps(med))
    vit = {"image_size": 224, "patch_size": 16, "embed_dim": 1024, "depth": 24, "num_heads": 16}
    sd = _redraw(ImageRewardModel(vit, med).state_dict(), seed=31)
    torch.save(sd, folder / "ImageReward.pt")
    home = work / "hf-home"
    _hub_cache(home, "bert-base-uncased", folder, ["vocab.txt", "tokenizer_config.json"])
    return {"checkpoint": str(folder / "ImageReward.pt"), "med_config": str(folder / "med_config.json"),
            "images": images, "prompts": PROMPTS[: len(images)], "env": {"HF_HOME": str(home)}}


def ours_imagereward(spec: dict) -> np.ndarray:
    import mmreward

    reward = mmreward.load("imagereward", checkpoint=str(Path(spec["checkpoint"]).parent))
    return reward.score(spec["prompts"], spec["images"]).scores.double().numpy()


# ------------------------------------------------------------------------------------------------
# CLIPScore (torchmetrics.multimodal.CLIPScore, pip torchmetrics==1.9.0)
# ------------------------------------------------------------------------------------------------
def build_clipscore(work: Path, images: list[str]) -> dict:
    from mmreward.testing.tiny_models import save_tiny_transformers_clip

    # torchmetrics loads CLIPModel/CLIPProcessor only for names containing "openai" (its openai/clip-vit-* path)
    folder = work / "openai" / "clip-vit-tiny-patch32"
    save_tiny_transformers_clip(folder, image_size=224, patch_size=32, seed=3)
    keep = [p for p in images if not p.endswith("rgba.png")]  # torchmetrics takes 3-channel tensors only
    return {"checkpoint": str(folder), "images": keep, "prompts": PROMPTS[: len(keep)]}


def ours_clipscore(spec: dict) -> np.ndarray:
    from PIL import Image

    import mmreward

    reward = mmreward.load("clipscore", checkpoint=spec["checkpoint"])
    pil = [Image.open(p).convert("RGB") for p in spec["images"]]  # the pixels torchmetrics is given
    return reward.score(spec["prompts"], pil).scores.double().numpy()


# ------------------------------------------------------------------------------------------------
# the families, in priority order
# ------------------------------------------------------------------------------------------------
FAMILIES: dict[str, Family] = {
    "hpsv3": Family(
        name="hpsv3", original="hpsv3==1.0.0 (transformers==4.45.2)",
        install=["transformers==4.45.2", "peft==0.13.2", "trl==0.11.4", "omegaconf", "fire", "tensorboard",
                 "einops"],
        # its declared deps include deepspeed and training tools; inference needs the ones listed above
        no_deps=["hpsv3==1.0.0"],
        build=build_hpsv3, ours=ours_hpsv3, rel=2e-5, columns=["mu", "sigma"],
        not_checked="bf16 on GPU (the package runs bf16; both keep the head in fp32)",
    ),
    "imagereward": Family(
        name="imagereward", original="image-reward==1.5 (timm==0.6.13, transformers==4.30.2, fairscale==0.4.13)",
        # setuptools<70 keeps the pkg_resources.packaging that openai-clip imports (--no-deps: torch asks newer)
        no_deps=["image-reward==1.5", "openai-clip==1.0.1", "setuptools<70"],
        # timm 0.6.13 is the package's own pin; transformers 4.30.2 is of its release (its med.py imports
        # helpers that transformers 5 removed)
        install=["wheel", "timm==0.6.13", "transformers==4.30.2"],
        no_build_isolation=["fairscale==0.4.13"],
        build=build_imagereward, ours=ours_imagereward, rel=1e-5,
        not_checked="ReFL.py (fine-tuning script) not imported; batch ranking (inference_rank) not compared",
    ),
    "clipscore": Family(
        name="clipscore", original="torchmetrics==1.9.0 multimodal.CLIPScore (transformers==4.57.1)",
        no_deps=[], install=["torchmetrics==1.9.0", "transformers==4.57.1"],  # 1.9.0 breaks on 5.x
        build=build_clipscore, ours=ours_clipscore, rel=1e-5,
        not_checked="RGBA (torchmetrics takes 3-channel tensors; both get the image converted to RGB)",
    ),
}


# ------------------------------------------------------------------------------------------------
# venvs and runners
# ------------------------------------------------------------------------------------------------
def _site_packages(python: str) -> str:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return subprocess.run([python, "-c", code], check=True, capture_output=True, text=True).stdout.strip()


def ensure_venv(fam: Family, root: Path, log: Callable[[str], None]) -> Path:
    """The family's venv, made once per install spec (a stamp holds its hash); returns its python."""
    venv = root / fam.name
    py = venv / "bin" / "python"
    want = hashlib.sha256(json.dumps([fam.install, fam.no_deps, fam.no_build_isolation, sys.prefix, 3]).encode()).hexdigest()[:16]
    stamp = venv / ".mmreward-parity-stamp"
    if stamp.exists() and stamp.read_text().strip() == want and py.exists():
        return py
    log(f"[{fam.name}] creating {venv}")
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--clear", str(venv)], check=True)
    # appended after the venv's own site-packages: the pins installed there win; torch & co. come from here
    ours = _site_packages(sys.executable)
    Path(_site_packages(str(py)), "zz_mmreward_shared.pth").write_text(ours + "\n")
    # torch and torchvision stay ours: a constraint at our versions, so that no requirement pulls another build
    import torch
    import torchvision

    pins = venv / "constraints.txt"
    pins.write_text("".join(f"{m.__name__}=={m.__version__.split('+')[0]}\n" for m in (torch, torchvision)))
    pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-c", str(pins)]
    if fam.install:
        # pip sees this project's packages through the .pth: it installs only what the pins need, into the
        # venv, and never touches a package outside it ("Not uninstalling ..., outside environment")
        _pip([*pip, *fam.install])
    if fam.no_build_isolation:  # an isolated build would download a torch of its own (GBs)
        _pip([*pip, "--no-build-isolation", "--no-deps", *fam.no_build_isolation])
    if fam.no_deps:  # last, so that nothing resolved above replaces them
        _pip([*pip, "--no-deps", *fam.no_deps])
    where = subprocess.run([str(py), "-c", "import torch; print(torch.__file__)"], capture_output=True, text=True)
    if not where.stdout.startswith(ours):
        raise subprocess.CalledProcessError(1, ["check torch"], "", f"the venv imports another torch: {where.stdout}")
    stamp.write_text(want + "\n")
    return py


def _pip(cmd: list[str]) -> None:
    """pip, quiet unless it fails (its resolver warns about this project's unrelated pins on every run)."""
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        err = "\n".join(ln for ln in proc.stderr.splitlines() if "is ignored: it is neither" not in ln)
        raise subprocess.CalledProcessError(proc.returncode, cmd, proc.stdout, err[-2000:])


def run_package(py: Path, fam: Family, spec_path: Path, timeout: float) -> dict:
    env = {**os.environ, **OFFLINE, "PYTHONNOUSERSITE": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([str(py), str(RUNNERS / f"run_{fam.name}.py"), str(spec_path)], capture_output=True, text=True,
                          env=env, cwd=spec_path.parent, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"the {fam.name} package runner failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError(f"the {fam.name} runner printed no JSON:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return json.loads(lines[-1])


def check_family(fam: Family, venv_root: Path, work: Path, images: list[str], timeout: float,
                 log: Callable[[str], None]) -> dict:
    """Install, build, score both sides; returns a result dict (status ok / differs / failed)."""
    t0 = time.time()
    result: dict = {"family": fam.name, "original": fam.original, "rel_tolerance": fam.rel}
    try:
        py = ensure_venv(fam, venv_root, log)
    except subprocess.CalledProcessError as e:
        return {**result, "status": "install failed", "reason": f"{' '.join(map(str, e.cmd))[-300:]} exited {e.returncode}: {e.stderr}",
                "seconds": time.time() - t0}
    fam_dir = work / fam.name
    fam_dir.mkdir()
    spec = fam.build(fam_dir, images)
    spec_path = fam_dir / "spec.json"
    spec_path.write_text(json.dumps(spec))
    try:
        theirs = run_package(py, fam, spec_path, timeout)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        return {**result, "status": "package failed", "reason": str(e)[-1500:], "seconds": time.time() - t0}
    bad_keys = theirs.get("missing_keys", []) + theirs.get("unexpected_keys", [])
    if bad_keys:  # a package that loads non-strictly would otherwise score with random tensors
        return {**result, "status": "package failed", "reason": f"checkpoint keys not matched: {bad_keys[:10]}",
                "seconds": time.time() - t0}
    expected = np.asarray(theirs["scores"], dtype=np.float64)
    actual = np.asarray(fam.ours(spec), dtype=np.float64).reshape(expected.shape)
    max_abs = float(np.abs(actual - expected).max())
    scale = float(np.abs(expected).max())
    max_rel = max_abs / scale if scale > 0 else max_abs
    spread = float(expected.reshape(len(expected), -1)[:, 0].max() - expected.reshape(len(expected), -1)[:, 0].min())
    versions = theirs.get("versions", {})
    return {**result, "status": "ok" if max_rel <= fam.rel else "differs", "max_abs": max_abs, "max_rel": max_rel,
            "spread": spread, "ours": actual.tolist(), "package": expected.tolist(), "columns": fam.columns,
            "versions": versions, "cases": IMAGE_CASES[: len(spec.get("images", images))],
            "seconds": time.time() - t0}


def _record(res: dict, fam: Family) -> None:
    """Append the family's row to MMREWARD_PARITY_LOG in tests/_helpers/parity_record.py's format."""
    sys.path.insert(0, str(ROOT))
    from tests._helpers.parity_record import record_parity

    if "max_abs" in res:
        versions = ", ".join(f"{k}=={v}" for k, v in res["versions"].items())
        record_parity(fam.name, original=f"{fam.original}; ran {versions}", how="package", actual=res["ours"],
                      expected=res["package"], cases=res["cases"], not_checked=fam.not_checked)
    else:  # could not run: a row that says why, with no numbers to mislead
        path = os.environ.get("MMREWARD_PARITY_LOG")
        if path:
            # its own family name: one failure's NaN must not hide the numbers of the family's other checks
            row = {"family": f"{fam.name} (package not run)", "original": fam.original, "how": "package",
                   "max_abs": float("nan"), "max_rel": float("nan"), "cases": [],
                   "not_checked": f"{res['status']}: {res['reason'].splitlines()[-1][:200]}"}
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="", help="comma-separated families (default: all): " + ", ".join(FAMILIES))
    p.add_argument("--venv-root", default=os.environ.get("MMREWARD_PARITY_VENVS",
                                                         str(Path.home() / ".cache/mmreward/parity-venvs")))
    p.add_argument("--log", default=os.environ.get("MMREWARD_PARITY_LOG", ""),
                   help="parity log (JSON lines) to append to; default $MMREWARD_PARITY_LOG")
    p.add_argument("--json", default="", help="also write every family's full result here")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per package run")
    args = p.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(FAMILIES)
    unknown = sorted(set(names) - set(FAMILIES))
    if unknown:
        p.error(f"unknown families {unknown}; choose from {sorted(FAMILIES)}")
    if args.log:
        os.environ["MMREWARD_PARITY_LOG"] = args.log
    os.environ.update(OFFLINE)
    venv_root = Path(args.venv_root).expanduser()
    venv_root.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    t0 = time.time()
    results = []
    with tempfile.TemporaryDirectory(prefix="mmreward-parity-pkgs-") as tmp:
        work = Path(tmp)
        (work / "images").mkdir()
        images = write_images(work / "images")
        for name in names:
            fam = FAMILIES[name]
            res = check_family(fam, venv_root, work, images, args.timeout, log)
            _record(res, fam)
            results.append(res)
            if "max_abs" in res:
                log(f"[{name}] {res['status']}: max abs {res['max_abs']:.3g}, max rel {res['max_rel']:.3g} "
                    f"(tolerance {fam.rel:g}; spread of the package's scores {res['spread']:.3g}) in {res['seconds']:.0f}s")
            else:
                log(f"[{name}] {res['status']} in {res['seconds']:.0f}s: {res['reason'][-600:]}")
    log(f"parity_packages: {len(results)} families in {time.time() - t0:.0f}s")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0 if all(r["status"] == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
