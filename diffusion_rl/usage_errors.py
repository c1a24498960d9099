"""How both `diffusion-rl` command lines (training and inference) report a mistake the user can fix."""

from __future__ import annotations


def _usage_errors() -> tuple[type[Exception], ...]:
    from mmreward.errors import (
        CheckpointError,
        ConfigError,
        MissingExtraError,
        RewardInputError,
        UnknownRewardError,
    )

    # what a user fixes in the command or the config: bad values, unknown rewards or reward options,
    # a model or checkpoint that is not there, a missing optional package
    return (ConfigError, UnknownRewardError, CheckpointError, RewardInputError, MissingExtraError)


USAGE_ERRORS = _usage_errors()


def one_line(exc: BaseException) -> str:
    """The error's message on one line (messages quoting YAML or a loader's error can span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__
