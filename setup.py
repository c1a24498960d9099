"""Only what pyproject.toml cannot say: the top-level assets/ folder ships in the wheel as mmreward/_assets.

The repository keeps assets/ at the top (demos, tests and configs use that path); setuptools' package
discovery cannot add a package that lives outside its parent's folder, so the list is built here.
Everything else (metadata, dependencies, extras, entry points) is in pyproject.toml.
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["mmreward*", "diffusion_rl*", "vlm_rm*"]), "mmreward._assets"],
    package_dir={"mmreward._assets": "assets"},
    package_data={"mmreward._assets": ["**/*"], "mmreward": ["py.typed"], "diffusion_rl": ["py.typed"],
                  "vlm_rm": ["py.typed"]},
)
