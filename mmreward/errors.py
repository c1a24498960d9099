"""Typed errors. Every message names the argument, what was expected, what was received and the fix."""

from __future__ import annotations


class MMRewardError(Exception):
    """Base class of every error raised on purpose by mmreward."""


class RewardInputError(MMRewardError, ValueError):
    """Prompts or media passed to a reward have the wrong type, shape, length or values."""


class MediaError(MMRewardError, ValueError):
    """A medium could not be read or converted (missing or corrupt file, ambiguous value range, bad layout)."""


class UnknownRewardError(MMRewardError, KeyError):
    """A reward name, tag or source that the registry does not know."""

    def __str__(self) -> str:  # KeyError would repr() the message and add quotes
        return str(self.args[0]) if self.args else ""


class CheckpointError(MMRewardError, RuntimeError):
    """Weights that are missing, not cached offline, or do not match the model (missing/unexpected keys)."""


class RewardValueError(MMRewardError, ValueError):
    """A reward produced values that cannot be used (NaN or infinite) where finite values are required."""


class ConfigError(MMRewardError, ValueError):
    """An invalid configuration value."""


class UnknownOptionError(ConfigError, TypeError):
    """A keyword option that a reward's loader does not accept (a TypeError, as Python raises for one)."""


class CardOptionError(CheckpointError, UnknownOptionError):
    """A folder's mmreward.json sets an option that cards may not set (an endpoint, a key, code, a path outside it).

    Both a CheckpointError (the folder is refused) and an UnknownOptionError (the option is named).
    """


class MissingExtraError(MMRewardError, ImportError):
    """An optional dependency is not installed; the message names the extra to install."""


DIFFUSION_EXTRA = "diffusion"  # diffusers, peft, matplotlib: training and sampling, never needed to score


def require_installed(module: str, extra: str, feature: str) -> None:
    """Raise a MissingExtraError naming the extra when `module` is not installed, without importing it."""
    import importlib.util

    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module stubbed out as None
        found = False
    if not found:
        raise MissingExtraError(
            f"{feature} needs the optional package '{module}', which is not installed. "
            f"Install it with: pip install 'mmreward[{extra}]'"
        )


def require(module: str, extra: str, feature: str):
    """Import an optional dependency or raise a MissingExtraError naming the extra that provides it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"{feature} needs the optional package '{module}', which is not installed. "
            f"Install it with: pip install 'mmreward[{extra}]'"
        ) from exc


class DeviceError(ConfigError, CheckpointError):
    """A device string that torch does not know, or a device this machine does not have.

    Also a CheckpointError because loading raised that for an unavailable CUDA before this type existed.
    """


class OutputError(ConfigError):
    """An output path that cannot be written: a file where a folder is needed, a folder under a file, a
    read-only folder, a full disk. The message names the flag or config key and what to do."""
