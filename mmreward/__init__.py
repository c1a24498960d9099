"""mmreward: multimodal and generative-media rewards behind one API.

    >>> import mmreward
    >>> reward = mmreward.load("jpeg-compressibility")
    >>> out = reward.score("a photo", ["img.png"])      # out.scores: (B,) float tensor
"""

from mmreward.errors import (
    CheckpointError,
    ConfigError,
    MediaError,
    MissingExtraError,
    MMRewardError,
    RewardInputError,
    RewardValueError,
    UnknownOptionError,
    UnknownRewardError,
)
from mmreward.registry import RewardSpec, get_spec, list_rewards, load, register_reward
from mmreward.types import PairwiseOutput, Reward, RewardOutput

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "ConfigError",
    "MMRewardError",
    "MediaError",
    "MissingExtraError",
    "PairwiseOutput",
    "Reward",
    "RewardInputError",
    "RewardOutput",
    "RewardSpec",
    "RewardValueError",
    "UnknownOptionError",
    "UnknownRewardError",
    "get_spec",
    "list_rewards",
    "load",
    "register_reward",
]
