"""Write docs/supported_models.md from the adapter registry (diffusion_rl.adapters): one row per pipeline class.

The pipeline class, family, modality, kernels, conditioning and LoRA targets come from the registered adapters;
the recipes are the configs/ whose model.pretrained names a model of that family (HUB_FAMILY below, the same
map tests/diffusion_rl/test_recipes.py keeps), and "tested" lists the test files that exercise the family. A test checks that
the committed page equals what this script writes, so a new adapter without a row fails.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
# hub ids of the recipes in configs/ -> family (kept in step with tests/diffusion_rl/test_recipes.py's FAMILY)
HUB_FAMILY = {
    "stabilityai/stable-diffusion-3.5-medium": "sd3", "black-forest-labs/FLUX.1-dev": "flux",
    "stable-diffusion-v1-5/stable-diffusion-v1-5": "sd", "stabilityai/stable-diffusion-xl-base-1.0": "sdxl",
    "hunyuanvideo-community/HunyuanVideo": "hunyuan_video", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers": "wan",
    "THUDM/CogVideoX-2b": "cogvideox", "Lightricks/LTX-Video": "ltx",
    "black-forest-labs/FLUX.2-klein-9B": "flux2_klein", "Tongyi-MAI/Z-Image-Turbo": "z_image",
    "Qwen/Qwen-Image-2512": "qwen_image", "black-forest-labs/FLUX.2-dev": "flux2",
    # Wan 2.2 A14B T2V is a WanPipeline (the "wan" row; tests/diffusion_rl/test_recipes.py builds its two-expert tiny as "wan22")
    "Wan-AI/Wan2.2-T2V-A14B-Diffusers": "wan", "Wan-AI/Wan2.2-I2V-A14B-Diffusers": "wan_i2v",
    "hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v": "hunyuan_video15", "Lightricks/LTX-2": "ltx2",
    "Qwen/Qwen-Image-2.1": "qwen_image21",
}


def _recipes() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        raw = yaml.safe_load(path.read_text()) or {}
        hub = (raw.get("model") or {}).get("pretrained", "")
        family = HUB_FAMILY.get(hub)
        if family:
            out.setdefault(family, []).append(f"`configs/{path.name}`")
    return out


# the per-family rollout tests of the adapters written before tests/test_adapter_<family>.py became the rule
OLDER_TESTS = {
    "sd": ["test_diffusion_rl_rollout.py"], "sdxl": ["test_diffusion_rl_rollout.py"],
    "sd3": ["test_diffusion_rl_rollout.py"], "flux": ["test_diffusion_rl_rollout.py"],
    "flux_kontext": ["test_edit_rollout.py"], "qwen_image_edit": ["test_edit_rollout.py"],
    "wan": ["test_video_rollout.py", "test_adapter_wan22.py"], "hunyuan_video": ["test_hunyuan_video_rollout.py"],
    "cogvideox": ["test_video_adapters.py"], "ltx": ["test_video_adapters.py"],
}
NOTES = {"wan": "Wan 2.1; Wan 2.2 A14B's two experts (`transformer_2`, `boundary_ratio`) go to `Wan22Adapter`, "
                "`model.lora_experts`, `model.guidance_scale_2`",
         "wan_i2v": "Wan 2.1 I2V (CLIP image embeds) and Wan 2.2 I2V-A14B (two experts)",
         "flux2": "guidance embedding; edit records' source images as reference images (the same number in "
                  "every record of a run)",
         "qwen_image_edit_plus": "the same number and sizes of source images in every record of a run",
         "flux2_klein": "true CFG, or none when step-distilled", "z_image": "`model.cfg_normalization`, "
         "`model.cfg_truncation`", "qwen_image": "true CFG with the norm rescale",
         "qwen_image21": "plain true CFG; one forward per sequence layout; edit records' source images as "
                        "the condition images (any number per record, at the output's aspect ratio); RGBA "
                        "composited over white",
         "ltx2": "joint video + audio state; LTX2Pipeline's guidance terms as `model.*` keys (`stg_scale`, "
                 "`spatio_temporal_guidance_blocks`, `modality_scale`, `guidance_rescale`, `audio_*`)"}


def _tests(family: str) -> list[str]:
    names = list(OLDER_TESTS.get(family, []))
    base = family.removesuffix("_klein").removesuffix("_i2v")
    for candidate in (f"test_adapter_{family}.py", f"test_adapter_{base}.py", "test_adapter_wan22.py"
                      if family in ("wan_i2v",) else ""):
        if candidate and (ROOT / "tests" / "diffusion_rl" / candidate).is_file() and candidate not in names:
            names.append(candidate)
    conformance = ROOT / "tests" / "diffusion_rl" / "test_adapter_conformance.py"
    if conformance.is_file() and f'"{family}"' in conformance.read_text():
        names.append(conformance.name)
    return [f"`{n}`" for n in names]


def build() -> str:
    from diffusion_rl.adapters import DEFAULT_LORA_TARGETS, PIPELINE_ADAPTERS

    recipes = _recipes()
    lines = [
        "# Supported generators",
        "",
        "Written by `python scripts/models_table.py` from the adapter registry (`diffusion_rl/adapters/`); a test",
        "keeps it in step. Every adapter presents latents to the same kernels and log-probs (docs/adding_a_model.md).",
        "Kernels: flow models take `flow_sde`, `dance_sde`, `cps`, `cps_gaussian` and the ODE; UNet models `ddim`.",
        "",
        "| pipeline class | family | makes | kernels | conditioning | default LoRA targets | recipes | tested in | notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for cls_name, (family, adapter) in sorted(PIPELINE_ADAPTERS.items(), key=lambda kv: (kv[1][0], kv[0])):
        kernels = "flow_sde, dance_sde, cps, ODE" if adapter.is_flow else "ddim"
        cond = "source image (edit records)" if adapter.is_edit else "text"
        if adapter.source_images != "one":  # edit records with several source images (docs/how-to/editing.md)
            cond = ("" if adapter.is_edit else "text; ") + "1 or more source images (edit records)"
        if family.endswith("i2v"):
            cond = "first frame (edit records)"
        targets = ", ".join(f"`{t}`" for t in DEFAULT_LORA_TARGETS.get(family, []))
        lines.append(f"| `{cls_name}` | {family} | {adapter.modality} | {kernels} | {cond} | {targets} | "
                     f"{', '.join(recipes.get(family, [])) or '-'} | {', '.join(_tests(family)) or '-'} | "
                     f"{NOTES.get(family, '')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default=str(ROOT / "docs" / "supported_models.md"))
    args = p.parse_args(argv)
    Path(args.out).write_text(build())
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
