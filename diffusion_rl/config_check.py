"""`diffusion-rl config --help-keys` and `--check`: every key with its help, and an offline check of a config.

`--check` resolves everything a run needs except weights: the config's types and presets (done by
`load_config`), every reward name against the registry (without importing a model family when the loader is
not importable, and without loading weights), the loader options where the loader's signature is exact, the
prompt files (a published set named by a pinned URL is reported as fetched at the first run, never downloaded), the pipeline (a local folder with model_index.json of a supported family, or a syntactically
valid hub id, whose model_index.json is read from the local cache when it is there) and the data-parallel
split for `--num-processes`. Errors are the typed errors of `mmreward.errors`; the CLI prints them on one line.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diffusion_rl.config import _SECTION_CLASSES, RunConfig, _hints
from mmreward.errors import CheckpointError, ConfigError


def _supported_pipelines() -> dict[str, str]:
    """Pipeline class name -> family, from the adapter table (diffusion_rl.adapters), registered adapters included."""
    from diffusion_rl.adapters import PIPELINE_ADAPTERS

    return {name: family for name, (family, _) in PIPELINE_ADAPTERS.items()}


@dataclass(frozen=True)
class KeyHelp:
    key: str  # section.field
    type: str
    default: str
    help: str


def _type_name(tp: Any) -> str:
    text = getattr(tp, "__name__", None) if not typing.get_args(tp) else None
    return text or str(tp).replace("typing.", "")


def config_keys() -> list[KeyHelp]:
    """Every settable key, `section.field`, with its type, default and help, from the dataclass fields."""
    out = [KeyHelp("preset", "str | None", "None", dataclasses.fields(RunConfig)[0].metadata["help"])]
    for section, cls in _SECTION_CLASSES.items():
        hints = _hints(cls)
        for f in dataclasses.fields(cls):
            if f.metadata.get("required"):
                default = "(required)"
            elif f.default is not dataclasses.MISSING:
                default = repr(f.default)
            else:
                default = repr(f.default_factory())  # type: ignore[misc]
            out.append(KeyHelp(f"{section}.{f.name}", _type_name(hints[f.name]), default, f.metadata.get("help", "")))
    return out


def format_keys(keys: list[KeyHelp]) -> str:
    width_k = max(len(k.key) for k in keys)
    width_t = max(len(k.type) for k in keys)
    width_d = min(max(len(k.default) for k in keys), 28)
    return "\n".join(f"{k.key:<{width_k}}  {k.type:<{width_t}}  {k.default:<{width_d}}  {k.help}" for k in keys)


# ----------------------------------------------------------------------------------------------
# --check
# ----------------------------------------------------------------------------------------------
def _check_reward(name: str, options: dict[str, Any]) -> str:
    """A one-word description of where `name` comes from; an error if the registry cannot resolve it."""
    from mmreward import registry
    from mmreward.checkpoints import parse_source
    from mmreward.errors import UnknownRewardError

    src = parse_source(name, registry.specs())
    if src.kind == "class":
        return "class (imported at train time)"
    if src.kind == "local":
        card = registry._read_card(Path(src.value))
        spec = registry.get_spec(card["reward"])
    elif src.kind == "hub":
        spec, _ = registry._spec_for_repo(src.value)
    else:
        spec = registry.get_spec(src.value)
        if src.tag is not None and "checkpoint" not in options and src.tag not in spec.tags:
            raise UnknownRewardError(f"reward '{spec.name}' has no tag '{src.tag}'; its tags are "
                                     f"{sorted(spec.tags) or 'none'}")
    checkpoint = options.get("checkpoint")
    if isinstance(checkpoint, str) and checkpoint.startswith(("/", "local-dir:")):
        folder = Path(checkpoint.removeprefix("local-dir:"))
        if not folder.exists():
            raise CheckpointError(f"reward.options.{name}.checkpoint: {checkpoint!r} does not exist")
    missing = spec.missing_requirements()
    if missing:
        return f"{spec.name} (needs {', '.join(missing)}: {spec.install_command()})"
    try:
        loader = registry.resolve_loader(spec)
    except ImportError:  # an optional dependency of the family: reported by the check above when declared
        return spec.name
    accepted, exact = registry.accepted_options(loader)
    unknown = sorted(set(options) - set(accepted) - {"checkpoint", "weights", "device", "dtype"})
    if exact and unknown:
        raise registry._unknown_option_error(f"reward.options.{name}: reward '{spec.name}'", unknown, accepted, exact)
    for (family, key, value), what in USER_WEIGHTS.items():
        if spec.name == family and options.get(key) == value and not checkpoint:
            return (f"{spec.name} ({key}={value}: NEEDS {what}; add reward.options.{name}.checkpoint=PATH, "
                    "the run stops at load without it)")
    source = checkpoint or (spec.tags.get(src.tag) if src.tag else None) or spec.default_checkpoint or "no weights"
    return f"{spec.name} ({source})"


# options that switch a reward to weights the user must supply (no hub copy exists to download)
USER_WEIGHTS = {
    ("geneval", "detector", "mask2former"): "mmdet's Mask2Former Swin-S .pth (GenEval's detector)",
    ("ocr", "preset", "flow_grpo"): "the PaddleOCR 2.9.1 English ONNX folder (Flow-GRPO's OCR)",
}


def _check_pipeline(pretrained: str) -> str:
    """'family (where)' for model.pretrained, or a typed error; reads model_index.json, never weights."""
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    source = pretrained.strip()
    if not source:
        raise ConfigError("model.pretrained is empty: set it to a diffusers pipeline folder or hub id")
    local = Path(source).expanduser()
    index: Path | None = None
    if local.is_dir():
        index = local / "model_index.json"
        if not index.is_file():
            raise CheckpointError(f"model.pretrained: {source!r} has no model_index.json, so it is not a diffusers "
                                  "pipeline folder; give the folder written by pipeline.save_pretrained(...)")
        where = "local folder"
    elif local.is_absolute() or source.startswith((".", "~")):
        raise CheckpointError(f"model.pretrained: {source!r} does not exist; give a diffusers pipeline folder or a hub "
                              "id (a relative folder in a YAML file is relative to the file)")
    else:
        try:
            validate_repo_id(source)
        except HFValidationError as exc:
            raise ConfigError(f"model.pretrained: {source!r} is neither a local folder nor a valid hub id "
                              f"(org/name): {exc}") from None
        if source.count("/") != 1:
            raise ConfigError(f"model.pretrained: {source!r} is neither a local folder nor a hub id of the form "
                              "org/name")
        cached = try_to_load_from_cache(source, "model_index.json")
        if isinstance(cached, str):
            index, where = Path(cached), "hub id, in the local cache"
        else:
            return f"hub id (not in the local cache: downloaded by the first run; family checked then) {source}"
    try:
        cls = json.loads(index.read_text()).get("_class_name")
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"model.pretrained: cannot read {index}: {exc}") from None
    supported = _supported_pipelines()
    family = supported.get(cls)
    if family is None:
        raise ConfigError(f"model.pretrained: {source!r} is a {cls}, which reward fine-tuning does not support; "
                          f"supported: {', '.join(supported)}")
    return f"{family} ({cls}, {where}) {source}"


def _check_prompts(cfg: RunConfig, which: str) -> str:
    """'N prompts', or how a published (url) set resolves: it is fetched at the first run, like weights, so the
    check never downloads; a local file that does not exist is an error."""
    from mmreward.prompt_sources import describe_remote

    source = getattr(cfg.prompts, which)
    if source is None:
        return "none"
    remote = describe_remote(source, f"prompts.{which}")
    if remote is not None:
        return remote
    loaded = cfg.prompts.load(which)
    if which == "train" and not loaded:
        raise ConfigError("prompts.train is empty: give a list of prompts or a text file with one per line")
    return f"{len(loaded)} prompts" + (" with metadata" if loaded.has_metadata else "")


def check_config(cfg: RunConfig, num_processes: int = 1) -> list[str]:
    """Summary lines of a config that resolves offline (everything but weights); raises a typed error if not."""
    from diffusion_rl import context_parallel, sample_assignment

    if num_processes < 1:
        raise ConfigError(f"--num-processes must be >= 1, got {num_processes}")
    context_parallel.check_training(cfg)
    cp_degree = context_parallel.degree(cfg.model.context_parallel)
    sample_assignment.check_divisible(cfg.sample, cfg.train, num_processes, cp_degree)
    prompts = {which: _check_prompts(cfg, which) for which in ("train", "eval")}
    pipeline = _check_pipeline(cfg.model.pretrained)
    rc = cfg.reward
    names = dict.fromkeys([*rc.rewards, *(rc.eval_rewards or []), *([rc.pairwise] if rc.pairwise else []),
                           *cfg.log.gold_rewards])
    rewards = {n: _check_reward(n, rc.options.get(n, {})) for n in names}
    from mmreward.edit import check_edit_run

    family = pipeline.split(" ", 1)[0]
    # published (url) sets are fetched at the first run, which checks them then
    from mmreward.prompt_sources import describe_remote

    local = {which: cfg.prompts.load(which) for which in ("train", "eval") if getattr(cfg.prompts, which) is not None
             and describe_remote(getattr(cfg.prompts, which), f"prompts.{which}") is None}
    check_edit_run(family if family in _supported_pipelines().values() else None, local, list(names))
    if cfg.train.algorithm == "pref_grpo" and rc.pairwise and rc.pairwise not in names:
        raise ConfigError(f"reward.pairwise {rc.pairwise!r} is not a reward of this config")
    weights = ", ".join(f"{n} x {w:g}" for n, w in rc.rewards.items())
    s, t = cfg.sample, cfg.train
    return [
        f"preset     {cfg.preset or '-'}; algorithm {t.algorithm}",
        f"model      {pipeline}",
        f"rewards    {weights}; " + "; ".join(f"{n}: {d}" for n, d in rewards.items()),
        f"prompts    train: {prompts['train']}; eval: {prompts['eval']}",
        f"batch      {s.prompts_per_iteration} prompts x {s.group_size} samples per iteration over "
        f"{num_processes} process(es); {t.num_minibatches} optimizer step(s) per iteration",
        f"outputs    {Path(cfg.log.output_dir).resolve()}",
    ]
