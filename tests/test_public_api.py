"""Issue 33 item 4: the packages' public names, and that importing a package stays cheap."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

import diffusion_rl
import mmreward
import vlm_rm
from mmreward import errors


@pytest.mark.parametrize("package", [mmreward, diffusion_rl, vlm_rm], ids=lambda m: m.__name__)
def test_every_exported_name_resolves(package):
    missing = [name for name in package.__all__ if getattr(package, name, None) is None]
    assert not missing, f"{package.__name__}.__all__ names {missing}, which do not resolve"
    with pytest.raises(AttributeError, match="no attribute"):
        package.not_a_public_name  # noqa: B018


def test_mmreward_exports_every_public_error():
    """Every exception class `mmreward.errors` defines (not underscored) is importable from `mmreward`."""
    defined = {name for name, obj in vars(errors).items()
               if inspect.isclass(obj) and issubclass(obj, Exception) and obj.__module__ == errors.__name__
               and not name.startswith("_")}
    assert defined <= set(mmreward.__all__), f"not exported from mmreward: {sorted(defined - set(mmreward.__all__))}"
    assert mmreward.DeviceError is errors.DeviceError


def test_trainer_entry_points_are_the_implementations():
    from diffusion_rl.config import RunConfig, load_config
    from diffusion_rl.trainer import Trainer, train
    from vlm_rm.adapters import verl
    from vlm_rm.adapters.trl import trl_reward_function

    assert (diffusion_rl.RunConfig, diffusion_rl.load_config) == (RunConfig, load_config)
    assert (diffusion_rl.Trainer, diffusion_rl.train) == (Trainer, train)
    assert vlm_rm.trl_reward_function is trl_reward_function and vlm_rm.verl is verl


def test_importing_the_packages_imports_no_heavy_library():
    code = ("import sys, diffusion_rl, vlm_rm; "
            "print(sorted(m for m in ('diffusers', 'peft', 'trl', 'open_clip') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


@pytest.mark.parametrize("package", ["mmreward", "diffusion_rl", "vlm_rm"])
def test_packages_are_typed(package):
    import importlib.resources

    assert importlib.resources.files(package).joinpath("py.typed").is_file()


def test_lazy_tables_match_all():
    assert set(diffusion_rl.__all__) == set(diffusion_rl._EXPORTS)
    assert set(vlm_rm.__all__) == set(vlm_rm._EXPORTS) | {"easyr1", "verl"}
