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
from mmreward.errors import CheckpointError, MMRewardError, UnknownOptionError, UnknownRewardError
from mmreward.types import Reward, RewardSpec

CARD_FILE = "mmreward.json"


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
    for cls in ret.__mro__ if is_reward_class(ret) else ():
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
        card = _read_card(Path(src.value))
        spec, tag = get_spec(card["reward"]), None
        checkpoint = checkpoint or src.value
        with registered_only(f"the card {Path(src.value) / CARD_FILE}"):
            return load(spec.name, checkpoint, device, dtype, weights,
                        **{**card.get("options", {}), **options, "attention": attention})
    else:
        spec, tag = get_spec(src.value), src.tag
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
    reward = _call_checked(resolve_loader(spec), f"reward '{spec.name}'", (checkpoint,), {"weights": weights}, options)
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
