"""Loading one configured reward, shared by the trainer (`diffusion_rl.rewards`) and the remote reward workers
(`diffusion_rl.remote_rewards`), which load rewards exactly as the trainer would."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mmreward.errors import ConfigError, UnknownOptionError

if TYPE_CHECKING:
    from diffusion_rl.config import RewardConfig


def load_reward(name: str, cfg: RewardConfig, device: Any, attention: str = "auto") -> Any:
    """`mmreward.load(name, **reward.options[name])`; an option the loader does not take is an error that names
    the config key. One attention choice for the run: rewards follow `attention` (model.attention) unless
    their options say otherwise."""
    import mmreward

    options = cfg.options.get(name, {})
    try:
        return mmreward.load(name, device=device, **{"attention": attention, **options})
    except UnknownOptionError as exc:
        # the registry names the reward and its options; the user also needs the config key to edit
        raise UnknownOptionError(f"reward.options.{name}: {exc}") from None
    except TypeError as exc:
        if "keyword argument" not in str(exc):
            raise
        # a loader that does not take one of reward.options: a config error, not a crash
        raise ConfigError(f"reward.options.{name} = {options}: {exc}; remove the option or check its "
                          f"spelling in the reward's documentation") from None
