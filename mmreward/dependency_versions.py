"""The oldest versions of our core dependencies whose APIs the code calls, checked once at import.

pyproject.toml's lower bounds must be at least these (tests/test_dependency_bounds.py checks it), so that
`pip install mmreward` into an older stack fails at install time; where pip was told to ignore the bounds
(`--no-deps`, a vendored environment), `import mmreward` stops with a MissingExtraError that names the
upgrade, instead of an AttributeError deep inside a model load.
"""

from __future__ import annotations

import re
from importlib import metadata

from mmreward.errors import MissingExtraError

# distribution -> (oldest version, the newest API that needs it). Raise an entry when code starts calling a
# newer API; the test compares this table with pyproject.toml.
MIN_VERSIONS: dict[str, tuple[str, str]] = {
    # 4.52: Qwen2-VL/2.5-VL modules under model.language_model / model.visual (the key layout we load);
    # 4.54: PreTrainedModel.set_attn_implementation (mmreward/attention.py);
    # 4.56: from_pretrained/from_config(dtype=...) (mmreward/backbones/qwen_vl.py; torch_dtype before)
    "transformers": ("4.56", "from_pretrained(dtype=...) and set_attn_implementation"),
}


def version_tuple(version: str) -> tuple[int, ...]:
    """The leading numeric release of a version string: '4.56.0.dev0' -> (4, 56, 0), '5.0.0rc1' -> (5, 0, 0)."""
    parts = []
    for piece in version.split("."):
        match = re.match(r"\d+", piece)
        if not match:
            break
        parts.append(int(match.group()))
        if match.group() != piece:  # '0rc1': the release ends here
            break
    return tuple(parts)


def check_installed_versions(installed: dict[str, str | None] | None = None) -> None:
    """Raise MissingExtraError when an installed core dependency is older than MIN_VERSIONS says.

    `installed` (name -> version or None when absent) is for tests; by default it is read from the
    installed distributions' metadata, without importing them (import stays fast)."""
    for name, (minimum, needs) in MIN_VERSIONS.items():
        if installed is not None:
            found = installed.get(name)
        else:
            try:
                found = metadata.version(name)
            except metadata.PackageNotFoundError:
                found = None
        if found is None:
            continue  # a missing package is reported by the feature that imports it
        if version_tuple(found) < version_tuple(minimum):
            raise MissingExtraError(
                f"mmreward needs {name}>={minimum} ({needs}), but {name}=={found} is installed. "
                f"Upgrade it: pip install '{name}>={minimum}'"
            )
