"""The reward registry: `load` and `list_rewards` over the built-in catalog plus `register_reward` entries.

The built-in specs are data in `mmreward.catalog`; a spec's loader is a "module:function" string imported
only when that reward is loaded, so `import mmreward` and `mmreward list` import no model family and
optional extras stay optional.

Loader contract: `loader(checkpoint: str | None, *, weights: "pretrained" | "random", **options) -> Reward`.
`checkpoint` is a local path or hub id (None only with weights="random").

Security: strings from configs, cards and requests only ever select registered specs or name a
`Reward` subclass ("pkg.module:Class"), which is checked before anything is called. The only loader
strings ever imported are the catalog's and those passed to `register_reward` in code. Naming a module
imports it, which runs its top-level code: treat configs that name `module:Class` as code.
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import inspect
import os
import re
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import torch

from mmreward.attention import check_choice
from mmreward.attention import configure as configure_attention
from mmreward.checkpoints import import_object, parse_source, read_json, resolve_device, resolve_dtype
from mmreward.errors import (
    CardOptionError,
    CheckpointError,
    ConfigError,
    MMRewardError,
    UnknownOptionError,
    UnknownRewardError,
)
from mmreward.types import Reward, RewardSpec

CARD_FILE = "mmreward.json"
# load()'s own arguments: an options mapping that names one would pass it twice (a bare TypeError)
LOAD_ARGUMENTS = ("checkpoint", "device", "dtype", "weights")


def refuse_load_arguments(options: dict[str, Any], where: str, fix: str,
                          arguments: tuple[str, ...] = LOAD_ARGUMENTS) -> None:
    """A ConfigError when a loader-options mapping names one of load()'s own arguments, saying where they go."""
    clash = [k for k in arguments if k in options]
    if clash:
        raise ConfigError(f"{where} sets {clash}, which are arguments of mmreward.load itself, not loader "
                          f"options; {fix}")


_REGISTRY: dict[str, RewardSpec] = {}
_builtins_loaded = False


def register_reward(spec: RewardSpec, *, overwrite: bool = False) -> RewardSpec:
    if not isinstance(spec, RewardSpec):
        raise TypeError(f"register_reward expects a RewardSpec, got {type(spec).__name__}")
    _ensure_builtins()  # so a user's spec never shadows a built-in unless asked to, whatever the call order
    if spec.name in _REGISTRY and not overwrite:
        raise ValueError(f"a reward named '{spec.name}' is already registered; pass overwrite=True to replace it")
    if ":" in spec.name or "/" in spec.name:
        raise ValueError(f"reward names may not contain ':' or '/', got '{spec.name}'")
    bad = {k: v for k, v in spec.card_options.items() if v not in CARD_KINDS}
    if bad:
        raise ValueError(f"card_options of '{spec.name}': unknown kinds {bad}; kinds are {sorted(CARD_KINDS)}")
    _REGISTRY[spec.name] = spec
    return spec


def list_rewards() -> list[str]:
    _ensure_builtins()
    return sorted(_REGISTRY)


def get_spec(name: str) -> RewardSpec:
    _ensure_builtins()
    try:
        return _REGISTRY[name]
    except KeyError:
        close = difflib.get_close_matches(name, _REGISTRY, n=3)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise UnknownRewardError(
            f"unknown reward '{name}'.{hint} Registered rewards: {', '.join(sorted(_REGISTRY))}. "
            "Run `mmreward list` for details, or pass 'pkg.module:Class' for your own."
        ) from None


def specs() -> dict[str, RewardSpec]:
    _ensure_builtins()
    return dict(_REGISTRY)


def _ensure_builtins() -> None:
    global _builtins_loaded
    if _builtins_loaded:
        return
    _builtins_loaded = True
    # imported on first use, not at module import: the catalog resolves the shipped asset folders
    from mmreward.catalog import BUILTIN_SPECS

    for spec in BUILTIN_SPECS:
        _REGISTRY.setdefault(spec.name, spec)


def resolve_loader(spec: RewardSpec) -> Callable[..., Reward]:
    """The spec's loader; a "module:function" string is imported here, on load, and must name a callable."""
    if isinstance(spec.loader, str):
        return import_object(spec.loader, callable, f"a callable loader for reward '{spec.name}'")
    return spec.loader


def _spec_for_repo(repo: str) -> tuple[RewardSpec, str | None]:
    for spec in _REGISTRY.values():
        if spec.default_checkpoint == repo:
            return spec, None
        for tag, ckpt in spec.tags.items():
            if ckpt == repo:
                return spec, tag
    raise UnknownRewardError(
        f"no registered reward uses the hub repo '{repo}'. Pass the reward name and the checkpoint: "
        f"mmreward.load('<reward>', checkpoint='hf-hub:{repo}')"
    )


def _read_card(folder: Path) -> dict[str, Any]:
    card = folder / CARD_FILE
    if not card.is_file():
        raise UnknownRewardError(
            f"cannot tell which reward the folder {folder} holds: it has no {CARD_FILE}. "
            "Pass the reward name: mmreward.load('<reward>', checkpoint='<folder>')"
        )
    data = read_json(card, "reward card")
    if not isinstance(data.get("reward"), str):
        raise CheckpointError(f"{card} must name the reward family under the key 'reward' (a registered name)")
    if not isinstance(data.get("options", {}), dict):
        raise CheckpointError(f"{card}: 'options' must be a JSON object of loader options")
    code_keys = sorted(set(data) & {"loader", "class", "module", "factory", "code"})
    if code_keys:
        # a folder from the internet must not be able to name code to import
        raise CheckpointError(
            f"{card} has keys {code_keys}, which mmreward does not support: a card names a registered reward "
            "under 'reward' and its loader options under 'options'. Register your own loader in code instead."
        )
    return data


_REGISTERED_ONLY: contextvars.ContextVar[str | None] = contextvars.ContextVar("registered_only", default=None)


@contextlib.contextmanager
def registered_only(why: str) -> Iterator[None]:
    """Within this block, `load` accepts registered names, hub ids and folders but no 'pkg.module:Class'.

    For strings that come from untrusted places (a downloaded folder's card, a network request): naming a
    class imports its module, which runs code. Nested loads (a backbone named in the options) inherit it.
    """
    token = _REGISTERED_ONLY.set(why)
    try:
        yield
    finally:
        _REGISTERED_ONLY.reset(token)


# What a card option's value may be. A card comes with a downloaded folder, so it is untrusted: it may tune
# how a reward scores, never where data goes (endpoints, keys), what code runs, or which files outside the
# folder are read. Families declare their card-settable options in RewardSpec.card_options.
CARD_KINDS: dict[str, str] = {
    "value": "plain JSON data that tunes scoring (numbers, strings, booleans, lists, objects)",
    "reward": "a registered reward name, loaded under the same card rules",
    "path": "a file or folder inside the card's folder, a hub id 'org/repo', or a shipped 'mmreward-assets:' folder",
    "nested": "a JSON object of options for a nested load, which checks them against its own reward's card options",
}

# (the card's folder, its reward) while a card's load runs: nested loads obey the card rules as well
_CARD_SCOPE: contextvars.ContextVar[tuple[Path, str] | None] = contextvars.ContextVar("card_scope", default=None)
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_PLAIN = (str, int, float, bool, type(None))


def _is_plain(value: Any) -> bool:
    if isinstance(value, _PLAIN):
        return True
    if isinstance(value, (list, tuple)):
        return all(_is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    return False


def _card_error(folder: Path, spec: RewardSpec, names: list[str], why: str) -> CardOptionError:
    allowed = ", ".join(sorted(spec.card_options)) or "none"
    scope = _CARD_SCOPE.get()
    if scope is None:  # the card's own options: the user may pass them to load(folder) explicitly
        fix = f"mmreward.load('{folder}', {', '.join(f'{n}=...' for n in names)})"
    else:  # an option of a nested load (a backbone's): the user loads the card's reward by name instead
        fix = f"mmreward.load('{scope[1]}', checkpoint='{folder}', <the options you choose>)"
    return CardOptionError(
        f"{folder / CARD_FILE} sets {', '.join(repr(n) for n in names)} for reward '{spec.name}', which {why}. "
        f"A downloaded folder's card may not choose endpoints, API keys, code or files outside the folder; for "
        f"'{spec.name}' it may set: {allowed}. If you trust this folder, pass the option(s) yourself: {fix}."
    )


def _card_path(value: Any, folder: Path, spec: RewardSpec, name: str) -> Any:
    """A path-valued card option: resolved inside the card's folder, or a hub id; anything else is refused."""
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise _card_error(folder, spec, [name], f"must be a path inside the folder or a hub id, not a "
                          f"{type(value).__name__}")
    text = os.fspath(value).strip()
    if text.startswith(("hf-hub:", "mmreward-assets:")):
        return text  # weights fetched through the cache-first hub resolver, or folders shipped with mmreward
    text = text.removeprefix("local-dir:")
    root = folder.resolve()
    path = Path(text)
    candidate = (path if path.is_absolute() else root / path).resolve()
    if candidate.exists() and candidate.is_relative_to(root):
        return str(candidate)  # relative paths mean the card's folder, wherever it was downloaded to
    if not path.is_absolute() and ".." not in path.parts and _HUB_ID.fullmatch(text):
        return text
    raise _card_error(folder, spec, [name], f"names the path {text!r} outside the card's folder {root}")


def _check_card_options(spec: RewardSpec, options: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The card-set `options` of `spec` with paths resolved in `folder`; a CardOptionError for any not allowed."""
    refused = sorted(set(options) - set(spec.card_options))
    if refused:
        raise _card_error(folder, spec, refused, "a card may not set")
    checked = {}
    for name, value in options.items():
        kind = spec.card_options[name]
        if kind == "path":
            value = _card_path(value, folder, spec, name)
        elif kind == "reward" and (not isinstance(value, str) or parse_source(value, _REGISTRY).kind != "name"):
            raise _card_error(folder, spec, [name], f"must be a registered reward name, got {value!r}")
        elif kind == "nested" and not (value is None or isinstance(value, dict) and _is_plain(value)):
            raise _card_error(folder, spec, [name], "must be a JSON object of options")
        elif not _is_plain(value):
            raise _card_error(folder, spec, [name], f"must be plain JSON data, got a {type(value).__name__}")
        checked[name] = value
    return checked


def is_reward_class(obj: Any) -> bool:
    return isinstance(obj, type) and issubclass(obj, Reward)


_SKIPPED_PARAMS = {"self", "checkpoint", "weights"}


def accepted_options(fn: Callable[..., Any]) -> tuple[list[str], bool]:
    """(the keyword options `fn` accepts, whether that list is exact).

    With **kwargs the list follows them into the class `fn` is annotated to return, and is a lower bound:
    loaders may consume more options themselves.
    """
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return [], False
    params = sig.parameters.values()
    names = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
             and p.name not in _SKIPPED_PARAMS]
    if not any(p.kind == p.VAR_KEYWORD for p in params):
        return sorted(names), True
    try:
        ret = typing.get_type_hints(fn).get("return")
    except Exception:  # noqa: BLE001 - unresolvable annotations: list what the signature shows
        ret = fn if isinstance(fn, type) else None
    for cls in ret.__mro__ if ret is not None and is_reward_class(ret) else ():
        init = cls.__dict__.get("__init__")
        if init is None:
            continue
        init_params = list(inspect.signature(init).parameters.values())
        # parameters without a default are the objects the loader builds (model, tokenizer), not options
        names += [p.name for p in init_params if p.default is not p.empty
                  and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        if not any(p.kind == p.VAR_KEYWORD for p in init_params):
            break
    return sorted(set(names)), False


def _unknown_option_error(what: str, unknown: list[str], accepted: list[str], exact: bool) -> UnknownOptionError:
    listing = f"It accepts: {', '.join(accepted) or 'no options'}." if exact else (
        f"Its options include: {', '.join(accepted)}." if accepted else "See its loader's docstring for its options."
    )
    hints = [m for u in unknown for m in difflib.get_close_matches(u, accepted, n=1)]
    hint = f" Did you mean {', '.join(repr(h) for h in hints)}?" if hints else ""
    return UnknownOptionError(f"{what} got unknown option(s) {', '.join(repr(u) for u in unknown)}.{hint} {listing}")


def _call_checked(fn: Callable[..., Any], what: str, args: tuple, fixed: dict[str, Any], options: dict[str, Any]) -> Any:
    """fn(*args, **fixed, **options); the user's `options` are checked first where fn's signature is exact."""
    accepted, exact = accepted_options(fn)
    if exact:
        unknown = sorted(set(options) - set(accepted))
        if unknown:
            raise _unknown_option_error(what, unknown, accepted, exact)
    try:
        return fn(*args, **fixed, **options)
    except TypeError as exc:
        if isinstance(exc, MMRewardError):
            raise
        # an option forwarded through **kwargs to a constructor that does not take it
        match = re.search(r"unexpected keyword argument '(\w+)'", str(exc))
        if match and match.group(1) in options:
            raise _unknown_option_error(what, [match.group(1)], accepted, exact) from exc
        raise


def load(
    name_or_source: str | os.PathLike,
    checkpoint: str | os.PathLike | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    weights: Literal["pretrained", "random"] = "pretrained",
    **options: Any,
) -> Reward:
    """Build a ready-to-score reward (eval mode, frozen parameters) on `device` in `dtype`.

    weights="random" builds the architecture with random weights and is only ever done on request:
    a silently random reward is the worst bug a reward library can ship. Pretrained weights load
    strictly (missing, extra or wrong-shaped keys are a CheckpointError) and never through pickle.

    `options` go to the reward's loader; an option it does not accept is an UnknownOptionError that
    lists the accepted ones. `attention` ("auto" | "sdpa" | "xformers" | "flash" | "math", see
    `mmreward.attention`) is handled here for every family: it configures each attention module of the
    built reward for its final device and dtype, and `reward.attention_backend` reports what runs.

    Security: a source "pkg.module:Class" imports `pkg.module` (running its top-level code, as
    transformers' trust_remote_code does) and must name a Reward subclass; anything else is refused
    before it is called. So a config or request that can name `module:Class` can run code: only load
    configs you trust, or pass registered names only.
    """
    if weights not in ("pretrained", "random"):
        raise CheckpointError(f"weights must be 'pretrained' or 'random', got {weights!r}")
    attention = check_choice(options.pop("attention", "auto"))  # checked before any (slow) model load
    _ensure_builtins()
    src = parse_source(name_or_source, _REGISTRY)
    scope = _CARD_SCOPE.get()
    card_folder = scope[0] if scope is not None else None
    if card_folder is not None and src.kind != "name":
        # a load triggered by a card (a backbone, a detector) names registered rewards only, never another folder
        raise UnknownRewardError(
            f"'{name_or_source}' is not a registered reward name, which loads triggered by "
            f"{card_folder / CARD_FILE} must use. Registered rewards: {', '.join(sorted(_REGISTRY))}"
        )
    if src.kind == "class":
        why = _REGISTERED_ONLY.get()
        if why is not None:
            raise UnknownRewardError(
                f"'{src.value}' names a Python class, which is not allowed in {why} (importing a module runs "
                f"its code). Use a registered reward name: {', '.join(sorted(_REGISTRY))}"
            )
        cls = import_object(src.value, is_reward_class, "an mmreward.Reward subclass")
        reward = _call_checked(cls, f"'{src.value}'", (), {}, options)
        return _finalize(reward, device, dtype, attention)
    if src.kind == "hub":
        spec, tag = _spec_for_repo(src.value)
        checkpoint = checkpoint or ("hf-hub:" + src.value + (f"@{src.revision}" if src.revision else ""))
    elif src.kind == "local":
        folder = Path(src.value)
        card = _read_card(folder)
        spec = get_spec(card["reward"])
        # the card's options pass its allow-list; options the user passes here are theirs and override it
        card_options = {k: v for k, v in card.get("options", {}).items() if k not in options}
        merged = {**_check_card_options(spec, card_options, folder), **options}
        with registered_only(f"the card {folder / CARD_FILE}"):
            token = _CARD_SCOPE.set((folder, spec.name))
            try:
                return _load_spec(spec, None, checkpoint or src.value, device, dtype, weights, attention, merged)
            finally:
                _CARD_SCOPE.reset(token)
    else:
        spec, tag = get_spec(src.value), src.tag
        if card_folder is not None:  # nested under a card: its options and checkpoint obey the card rules too
            options = _check_card_options(spec, options, card_folder)
            checkpoint = _card_path(checkpoint, card_folder, spec, "checkpoint")
    return _load_spec(spec, tag, checkpoint, device, dtype, weights, attention, options)


def _load_spec(spec: RewardSpec, tag: str | None, checkpoint: str | os.PathLike | None, device, dtype,
               weights: str, attention: str, options: dict[str, Any]) -> Reward:
    if tag is not None and checkpoint is None:
        if tag not in spec.tags:
            raise UnknownRewardError(
                f"reward '{spec.name}' has no tag '{tag}'; its tags are {sorted(spec.tags) or 'none'}"
            )
        checkpoint = spec.tags[tag]
    missing = spec.missing_requirements()
    if missing:
        from mmreward.errors import MissingExtraError

        raise MissingExtraError(
            f"reward '{spec.name}' needs {missing}, not installed. "
            f"Install with: {spec.install_command()}"
        )
    if checkpoint is None and weights == "pretrained" and spec.needs_weights:
        checkpoint = spec.default_checkpoint
        if checkpoint is None:
            raise CheckpointError(
                f"reward '{spec.name}' has no default checkpoint; pass checkpoint='<path or hub id>' "
                "(or weights='random' for a random-weight model in tests)"
            )
    if checkpoint is not None:
        checkpoint = os.fspath(checkpoint)
    from huggingface_hub.errors import HFValidationError

    try:
        reward = _call_checked(resolve_loader(spec), f"reward '{spec.name}'", (checkpoint,), {"weights": weights}, options)
    except HFValidationError as exc:  # a string that is no hub id reached from_pretrained/hf_hub_download
        raise CheckpointError(f"reward '{spec.name}': {exc} Pass an existing folder or a hub id 'org/name'.") from None
    if not isinstance(reward, Reward):
        raise CheckpointError(f"the loader of reward '{spec.name}' returned a {type(reward).__name__}, not a Reward")
    return _finalize(reward, device, dtype, attention)


def _finalize(reward: Reward, device, dtype, attention: str = "auto") -> Reward:
    reward = reward.to(device=resolve_device(device))
    if dtype is not None:
        reward = reward.to(dtype=resolve_dtype(dtype))
    # after the move: what works (xformers, flash) depends on the final device and dtype
    configure_attention(reward, attention)
    reward.eval()
    for p in reward.parameters():
        p.requires_grad_(False)
    return reward
