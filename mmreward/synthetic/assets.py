"""Where the shipped assets (ShapesWorld checkpoints, sample images) live.

Looked up, in order: the folder named by $MMREWARD_ASSETS (when set, only there); the repository's
top-level `assets/` (a checkout or an editable install); `mmreward/_assets/` inside an installed
wheel, which ships the same folder. Checkpoints name them as `mmreward-assets:<path>`, e.g.
`mmreward-assets:shapesworld/pref`, so that a default checkpoint works wherever mmreward is installed.
`ROOT`, `CLIP_DIR`, `GENERATOR_DIR`, `PREF_DIR` and `AESTHETIC_DIR` are resolved on access.
"""

from __future__ import annotations

import os
from pathlib import Path

from mmreward.errors import CheckpointError

ENV_VAR = "MMREWARD_ASSETS"
PREFIX = "mmreward-assets:"
_PACKAGE = Path(__file__).resolve().parents[1]  # the mmreward package folder

_NAMED = {
    "ROOT": "shapesworld",
    "CLIP_DIR": "shapesworld/clip",
    "GENERATOR_DIR": "shapesworld/generator",
    "PREF_DIR": "shapesworld/pref",
    "AESTHETIC_DIR": "shapesworld/aesthetic",
}


def asset_roots() -> list[tuple[str, Path]]:
    """(where, folder) candidates for the assets root, in lookup order."""
    override = os.environ.get(ENV_VAR)
    if override:
        # an explicit override is the only place looked at, so a wrong path is reported, not papered over
        return [(f"${ENV_VAR}", Path(override).expanduser())]
    return [("the source checkout", _PACKAGE.parent / "assets"), ("the installed package", _PACKAGE / "_assets")]


def asset_path(relative: str) -> Path:
    """The shipped asset `relative` (e.g. 'shapesworld/pref'), or a CheckpointError saying where it was sought."""
    rel = relative.strip().strip("/")
    if not rel or ".." in Path(rel).parts:
        raise CheckpointError(f"asset path: expected a path inside the assets folder such as 'shapesworld/pref', "
                              f"got {relative!r}")
    tried = []
    for where, root in asset_roots():
        path = root / rel
        if path.exists():
            return path
        tried.append(f"{path} ({where})")
    raise CheckpointError(
        f"the shipped asset '{rel}' was not found; looked in {'; '.join(tried)}. Set {ENV_VAR}=/path/to/assets "
        "(the folder holding shapesworld/ and samples/, e.g. the repository's assets/), or reinstall mmreward "
        "from a wheel (it ships them)."
    )


def resolve_asset(checkpoint: str) -> str:
    """`mmreward-assets:<path>` -> the local path of that asset; any other checkpoint unchanged."""
    if isinstance(checkpoint, str) and checkpoint.startswith(PREFIX):
        return str(asset_path(checkpoint[len(PREFIX) :]))
    return checkpoint


def __getattr__(name: str) -> Path:
    if name in _NAMED:
        return asset_path(_NAMED[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
