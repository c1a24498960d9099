"""mmreward: multimodal and generative-media rewards behind one API.

    >>> import mmreward
    >>> reward = mmreward.load("jpeg-compressibility")
    >>> out = reward.score("a photo", ["img.png"])      # out.scores: (B,) float tensor
"""

from mmreward.dependency_versions import check_installed_versions
from mmreward.errors import (
    CardOptionError,
    CheckpointError,
    ConfigError,
    DeviceError,
    MediaError,
    MissingExtraError,
    MMRewardError,
    OutputError,
    RewardInputError,
    RewardValueError,
    UnknownOptionError,
    UnknownRewardError,
)

check_installed_versions()  # an older transformers fails here, naming the upgrade, not deep in a model load

from mmreward.registry import RewardSpec, get_spec, list_rewards, load, register_reward  # noqa: E402
from mmreward.types import PairwiseOutput, ResponseReward, Reward, RewardOutput  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "CardOptionError",
    "CheckpointError",
    "ConfigError",
    "DeviceError",
    "MMRewardError",
    "MediaError",
    "MissingExtraError",
    "OutputError",
    "PairwiseOutput",
    "ResponseReward",
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
