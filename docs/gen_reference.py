"""Generate the reference pages from the code at build time (mkdocs-gen-files runs this on every build).

Nothing here is written to the repository: the reward catalog, the config keys, the CLIs and the Python API
are read from `mmreward.catalog`, the config dataclasses, the argparse parsers and the packages' `__all__`,
so a page cannot fall out of step with the code.
"""

from __future__ import annotations

import argparse

import mkdocs_gen_files


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def reward_catalog() -> str:
    from mmreward.registry import specs

    out = ["# Reward catalog", "",
           "Every built-in reward, generated from `mmreward/catalog.py` (`mmreward list` prints the same). "
           "Load one with `mmreward.load(name)`; the extra installs what its loader needs.", "",
           "| name | what it scores | media | differentiable | scale | default weights | extra | preprocessing |",
           "|---|---|---|---|---|---|---|---|"]
    for name, spec in sorted(specs().items()):
        out.append("| " + " | ".join(_cell(v) for v in (
            f"`{name}`", spec.description, ", ".join(spec.modalities), "yes" if spec.differentiable else "no",
            spec.score_range or "", f"`{spec.default_checkpoint}`" if spec.default_checkpoint else "",
            spec.extra or "", spec.preprocess or "")) + " |")
    return "\n".join(out) + "\n"


def config_keys() -> str:
    from diffusion_rl.config import METHOD_SECTIONS
    from diffusion_rl.config_check import config_keys as keys

    out = ["# Configuration keys", "",
           "Every key a `diffusion-rl` config sets, generated from the config dataclasses in "
           "`diffusion_rl/config.py` (`diffusion-rl config --help-keys` prints the same). Set them in YAML or "
           "on the command line as `section.key=value`.", "",
           "`train` holds the loop, the optimizer and the keys several methods share; each method's own keys are "
           "in its section (`ppo`, `draft`, `nft`, `dpo`, `prdp`, `raft`, `awm`, `dgpo`, `crd`, `refl`). A key of a "
           "section that `train.algorithm` does not read is a config error, as is a flat key of earlier versions "
           "(`train.nft_beta`: now `nft.beta`).", ""]
    section = None
    for k in keys():
        head = k.key.split(".")[0] if "." in k.key else "top level"
        if head != section:
            section = head
            out += ["", f"## `{section}`" if section != "top level" else "## top level", ""]
            cls = METHOD_SECTIONS.get(section)
            if cls is not None:
                out += [f"{cls.__doc__.strip()} Read by: {', '.join(f'`{a}`' for a in cls.READERS)}.", ""]
            out += ["| key | type | default | help |", "|---|---|---|---|"]
        out.append(f"| `{k.key}` | `{_cell(k.type)}` | `{_cell(k.default)}` | {_cell(k.help)} |")
    return "\n".join(out) + "\n"


def _parser_help(parser: argparse.ArgumentParser, prog: str, level: int) -> list[str]:
    out = [f"{'#' * level} `{prog}`", "", "```text", parser.format_help().rstrip(), "```", ""]
    for action in parser._actions:  # argparse has no public walk over sub-commands
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _parser_help(sub, f"{prog} {name}", min(level + 1, 4))
    return out


def command_lines() -> str:
    import os

    os.environ["COLUMNS"] = "110"  # argparse wraps at the terminal width: fix it for a stable page
    from diffusion_rl.cli import build_parser as diffusion_rl_parser
    from mmreward.cli import build_parser as mmreward_parser
    from vlm_rm.cli import build_parser as vlm_rm_parser

    out = ["# Command lines", "",
           "Generated from the argparse parsers of the three console scripts. Usage and config errors print one "
           "line and exit 2; exit 1 means some items failed.", ""]
    for prog, build in (("mmreward", mmreward_parser), ("diffusion-rl", diffusion_rl_parser),
                        ("vlm-rm", vlm_rm_parser)):
        out += _parser_help(build(), prog, 2)
    return "\n".join(out) + "\n"


API = {
    "mmreward": "Rewards: load, score, compare; the `Reward` contract and every public error.",
    "diffusion_rl": "Reward fine-tuning: configs, the trainer, algorithms and generator adapters.",
    "vlm_rm": "VLM-RM rewards, the reward-model benchmark, trainer adapters.",
}


def api_pages() -> dict[str, str]:
    import importlib

    pages = {}
    for package, blurb in API.items():
        module = importlib.import_module(package)
        lines = [f"# `{package}`", "", blurb, "",
                 "Generated from the package's `__all__` and the docstrings.", ""]
        for name in module.__all__:
            obj = getattr(module, name)
            target = f"{getattr(obj, '__module__', package)}.{getattr(obj, '__name__', name)}"
            if type(obj).__name__ == "module":
                target = obj.__name__
            lines += [f"::: {target}", "    options:", "      heading_level: 2", ""]
        pages[f"reference/api/{package}.md"] = "\n".join(lines)
    return pages


def home_page() -> str:
    """The site's home page is the README, with its links made relative to docs/."""
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    return text.replace("](docs/", "](")


for path, text in {"index.md": home_page(), "reference/rewards.md": reward_catalog(), "reference/config.md": config_keys(),
                   "reference/cli.md": command_lines(), **api_pages()}.items():
    with mkdocs_gen_files.open(path, "w") as fh:
        fh.write(text)
