"""The declared dependency ranges are true: pyproject's lower bounds are at least the versions whose APIs we call.

The table below is this test's own (not the product's MIN_VERSIONS), from the transformers release notes:
each API and the first release that has it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mmreward.dependency_versions import MIN_VERSIONS, check_installed_versions, version_tuple
from mmreward.errors import MissingExtraError

REPO = Path(__file__).resolve().parents[1]

# API we call -> (distribution, first version that has it, where we call it)
API_MIN_VERSION = {
    "Qwen2-VL model.language_model / model.visual layout": ("transformers", "4.52", "mmreward/backbones/qwen_vl.py"),
    "PreTrainedModel.set_attn_implementation": ("transformers", "4.54", "mmreward/attention.py"),
    "from_pretrained(dtype=...) / from_config(dtype=...)": ("transformers", "4.56", "mmreward/backbones/qwen_vl.py"),
}


def _declared_lower_bounds() -> dict[str, str]:
    text = (REPO / "pyproject.toml").read_text()
    deps = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
    return dict(re.findall(r'"([A-Za-z0-9_.\-]+)>=([0-9.]+)', deps))


def test_declared_lower_bounds_cover_the_apis_we_call():
    declared = _declared_lower_bounds()
    for api, (dist, version, where) in API_MIN_VERSION.items():
        assert dist in declared, f"{dist} is not a declared dependency"
        assert version_tuple(declared[dist]) >= version_tuple(version), (
            f"pyproject says {dist}>={declared[dist]}, but {where} calls {api} ({dist} {version}+)")
        assert version_tuple(MIN_VERSIONS[dist][0]) >= version_tuple(version), f"MIN_VERSIONS is below {api}"
    # the import-time check and the install-time bound say the same thing
    for dist, (minimum, _) in MIN_VERSIONS.items():
        assert version_tuple(declared[dist]) == version_tuple(minimum), (dist, declared[dist], minimum)


def test_the_apis_exist_in_the_installed_transformers():
    transformers = pytest.importorskip("transformers")
    assert hasattr(transformers.PreTrainedModel, "set_attn_implementation")
    assert version_tuple(transformers.__version__) >= version_tuple(MIN_VERSIONS["transformers"][0])


@pytest.mark.parametrize("old", ["4.46.3", "4.55.4", "4.52.0"])
def test_an_older_transformers_is_a_typed_error_naming_the_upgrade(old):
    with pytest.raises(MissingExtraError, match=rf"transformers>=4\.56.*transformers=={re.escape(old)}.*pip install"):
        check_installed_versions({"transformers": old})


@pytest.mark.parametrize("ok", ["4.56.0", "4.57.1", "5.0.0rc1", "5.24.0"])
def test_supported_versions_pass(ok):
    check_installed_versions({"transformers": ok})
    check_installed_versions({})  # absent: reported by the feature that imports it
    check_installed_versions()  # the real environment


def test_version_tuple():
    assert version_tuple("4.56.0.dev0") == (4, 56, 0)
    assert version_tuple("5.0.0rc1") == (5, 0, 0)
    assert version_tuple("4.52") < version_tuple("4.56.0") < version_tuple("10.0")
