"""The built-in catalog is data: listing imports no model family, loaders resolve lazily, no import circles."""

from __future__ import annotations

import importlib
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

import mmreward
from mmreward import catalog, registry
from tests._helpers.import_graph import find_cycles

ROOT = Path(__file__).resolve().parents[2]

# `mmreward list` before the specs moved out of the model modules (issue 14)
BUILTIN_NAMES = [
    "aesthetic", "clipscore", "editreward", "editscore", "face-mtcnn", "geneval", "hpsv2", "hpsv2.1", "hpsv3", "imagenet-classifier",
    "imagereward", "jpeg-compressibility", "jpeg-incompressibility", "mock", "motion", "nudenet", "ocr", "open-nsfw",
    "paco-reward", "pickscore", "preference-head", "r1-reward", "realgen-detectors", "realism-classifier", "shapes-edit-eval", "shapes-eval",
    "shapes-video-eval", "shapes-vqa",
    "shapesworld-aesthetic", "shapesworld-pref", "skywork-vl-reward", "temporal-consistency", "unifiedreward", "unifiedreward-think",
    "univfd", "video-frames", "videoalign", "videoscore2", "visual-prm", "vqascore",
]
HEAVY = ("transformers", "open_clip", "diffusers", "onnxruntime", "torchvision")


def _modules_after(code: str) -> list[str]:
    """sys.modules at the end of `code`, run in a fresh interpreter (this one has imported everything)."""
    code = f"import sys, json\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_list_imports_no_model_family_and_no_heavy_dependency():
    loaded = _modules_after("from mmreward.cli import main\nmain(['list'])\nmain(['list', '--json'])")
    families = [m for m in loaded if m.startswith("mmreward.models.")]
    heavy = [m for m in loaded if m.split(".")[0] in HEAVY]
    assert not families and not heavy, (families, heavy)
    assert "mmreward.catalog" in loaded  # the listing did read the catalog


def test_load_imports_only_the_family_it_names():
    loaded = _modules_after("import mmreward\nmmreward.load('jpeg-compressibility')")
    assert [m for m in loaded if m.startswith("mmreward.models.")] == ["mmreward.models.compressibility"]
    # nor a heavy library it does not use (the attention wiring imported diffusers and open_clip for every load)
    assert not [m for m in loaded if m.split(".")[0] in HEAVY]


def test_catalog_holds_exactly_the_builtin_rewards():
    names = [s.name for s in catalog.BUILTIN_SPECS]
    assert len(names) == len(set(names)), "a name appears twice in the catalog"
    assert sorted(names) == BUILTIN_NAMES
    assert set(BUILTIN_NAMES) <= set(mmreward.list_rewards())


@pytest.mark.parametrize("spec", catalog.BUILTIN_SPECS, ids=lambda s: s.name)
def test_every_loader_string_names_a_function_of_its_module(spec):
    assert isinstance(spec.loader, str), "built-in loaders are strings, imported only on load"
    module_name, _, attr = spec.loader.partition(":")
    loader = registry.resolve_loader(spec)
    assert inspect.isfunction(loader) and loader is getattr(importlib.import_module(module_name), attr)
    assert "weights" in inspect.signature(loader).parameters


def _plain(value) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (str, int, float, bool))


@pytest.mark.parametrize("spec", catalog.BUILTIN_SPECS, ids=lambda s: s.name)
def test_catalog_entries_are_plain_data(spec):
    assert _plain(spec.tiny_options), spec.tiny_options
    assert _plain(spec.tags) and _plain(list(spec.modalities)) and _plain(list(spec.requires))


def test_checkpoint_ids_the_loaders_rely_on_match_the_catalog():
    from mmreward.models import compositional, hps

    assert mmreward.get_spec("geneval").default_checkpoint == compositional.OWLV2_CHECKPOINT
    assert {n for n in BUILTIN_NAMES if n.startswith("hpsv2")} == set(hps.FILES)


def test_no_import_circle_through_the_registry_catalog_or_models():
    core = {"mmreward.registry", "mmreward.catalog", "mmreward.models"}
    tangled = [group for group in find_cycles(ROOT / "mmreward") if core & set(group)]
    assert not tangled, tangled


def test_find_cycles_sees_lazy_and_import_module_circles(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n")
    (pkg / "c.py").write_text("import importlib\nimportlib.import_module('pkg.sub.d')\n")
    (pkg / "sub" / "d.py").write_text("from ..c import x\n")
    (pkg / "e.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n")
    assert find_cycles(pkg) == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.sub.d"]]
