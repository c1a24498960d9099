"""The library does not depend on its experiments or on the scripts that build its assets."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# ShapesWorld modules a runtime reward, environment or inference method may import
SYNTHETIC_RUNTIME = {"captions", "checker", "prompts", "scenes", "tokenizer", "identity_vae", "assets", "models",
                     "motion", "edits", "vqa", "vqa_policy"}
SYNTHETIC_MODULES = {p.stem for p in (ROOT / "mmreward" / "synthetic").rglob("*.py")} | {"build"}
OFF_LIMITS = ("mmreward.synthetic.build", "diffusion_rl.experiments")


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return names


def _library_files() -> list[Path]:
    experiments = ROOT / "diffusion_rl" / "experiments"
    build = ROOT / "mmreward" / "synthetic" / "build"
    return [p for pkg in ("mmreward", "diffusion_rl", "vlm_rm") for p in (ROOT / pkg).rglob("*.py")
            if experiments not in p.parents and build not in p.parents and "demos" not in p.parts]


def test_library_modules_import_no_experiment_and_no_asset_training_script():
    bad = []
    for path in _library_files():
        for name in _imports(path):
            parts = name.split(".")
            # a name imported from the package ("from mmreward.synthetic import caption") is not a module
            training_script = (parts[:2] == ["mmreward", "synthetic"] and len(parts) > 2
                               and parts[2] not in SYNTHETIC_RUNTIME and parts[2] in SYNTHETIC_MODULES)
            if name.startswith(OFF_LIMITS) or training_script:
                bad.append(f"{path.relative_to(ROOT)}: {name}")
    assert not bad, "library code imports an experiment or an asset-training script:\n" + "\n".join(bad)


def test_shapesworld_rewards_load_without_the_training_scripts():
    code = ("import sys, mmreward\n"
            "for name in ('shapesworld-pref', 'shapesworld-aesthetic'):\n"
            "    mmreward.load(name, weights='random')\n"
            "print(sorted(m for m in sys.modules if m.startswith('mmreward.synthetic.')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = ast.literal_eval(out.stdout.strip().splitlines()[-1])
    assert not [m for m in loaded if m.split(".")[2] not in SYNTHETIC_RUNTIME], loaded


def test_studies_run_as_modules_of_the_experiments_package():
    # one interpreter runs the three `python -m diffusion_rl.experiments.<name> --help` (runpy, as -m does;
    # torch is imported once, not three times); each exit code and stdout is captured on its own
    code = ("import contextlib, io, json, runpy, sys\nres = {}\n"
            "for name in ('shapesworld', 'harden_clip', 'adversarial_pool'):\n"
            "    sys.argv = [name, '--help']\n    out = io.StringIO()\n"
            "    with contextlib.redirect_stdout(out):\n"
            "        try:\n"
            "            runpy.run_module(f'diffusion_rl.experiments.{name}', run_name='__main__', alter_sys=True)\n"
            "            rc = 0\n"
            "        except SystemExit as exc:\n            rc = 0 if exc.code is None else exc.code\n"
            "    res[name] = [rc, out.getvalue()]\nprint(json.dumps(res))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(proc.stdout.splitlines()[-1])
    for name in ("shapesworld", "harden_clip", "adversarial_pool"):
        rc, out = res[name]
        assert rc == 0 and "usage:" in out, (name, rc, proc.stderr[-1000:])
    assert not (ROOT / "diffusion_rl" / "inference" / "shapesworld.py").exists()


# issue 14: preprocessing had three homes; these are the retired module names
RETIRED_PREPROCESS_MODULES = ("mmreward.transforms", "mmreward.pil_resize", "mmreward.models._image_preprocess")


def test_preprocessing_has_one_home():
    import importlib
    from importlib.machinery import PathFinder

    import mmreward.preprocess as pre

    for name in RETIRED_PREPROCESS_MODULES:
        parent, _, leaf = name.rpartition(".")
        assert PathFinder.find_spec(leaf, [str(ROOT.joinpath(*parent.split(".")))]) is None, (
            f"{name} still exists: preprocessing lives in mmreward.preprocess")
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError:
            continue
        # an editable install of another checkout can still serve the name: it must not come from this tree
        assert ROOT not in Path(module.__file__).resolve().parents, f"{name} imports from {module.__file__}"
    # what the three modules held is reachable from the one home
    for name in ("resize", "center_crop", "resize_longest_and_pad", "normalize", "map_groups", "pil_resize",
                 "to_uint8", "quantize_uint8", "ImagePreprocess", "parse_alpha", "ALPHA_CONVENTIONS"):
        assert hasattr(pre, name), name
    files = _library_files() + [*(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py"),
                                *(ROOT / "scripts").rglob("*.py")]
    bad = []
    for path in files:
        for name in _imports(path):
            # "from mmreward import transforms" shows up as "mmreward.transforms" here too
            if name.startswith(RETIRED_PREPROCESS_MODULES):
                bad.append(f"{path.relative_to(ROOT)}: {name}")
    assert not bad, "code imports a retired preprocessing module:\n" + "\n".join(bad)


def _test_kit_imports(source: str, module: str) -> list[str]:
    """Imports of mmreward.testing in `source`, the code of `module` (relative imports resolved, lazy ones too)."""
    package = module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            parent = ".".join(base + ([node.module] if node.module else []))
            names = [parent] + [f"{parent}.{a.name}" for a in node.names]
        else:
            continue
        found += [n for n in names if n == "mmreward.testing" or n.startswith("mmreward.testing.")]
    return sorted(set(found))


def test_product_never_imports_the_test_kit():
    # the scanner must see lazy, aliased and relative imports, or the scan below proves nothing
    sample = "def f():\n    from ..testing import qwen_vl\n    import mmreward.testing.faulty as m\n"
    assert _test_kit_imports(sample, "mmreward.models.x") == [
        "mmreward.testing", "mmreward.testing.faulty", "mmreward.testing.qwen_vl"]
    assert _test_kit_imports("from . import testing_utils\n", "mmreward.x") == []

    kit = ROOT / "mmreward" / "testing"
    bad = []
    for path in _library_files():
        if kit == path or kit in path.parents:
            continue
        rel = path.relative_to(ROOT)
        module = ".".join(rel.with_suffix("").parts)
        if path.name == "__init__.py":
            module += ".__init__"  # its relative imports resolve against the package itself
        bad += [f"{rel}: {name}" for name in _test_kit_imports(path.read_text(), module)]
    assert not bad, "product code imports the test kit (it may only be imported by tests, demos and benchmarks):\n" + (
        "\n".join(bad))


def _module_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere in its body (lazy and TYPE_CHECKING imports too:
    each is a dependency a reader has to follow). `from a import b` counts as importing a.b when that is a
    module, else a; importing a submodule does not count as importing its parent package (as grimp does)."""
    files = {".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p
             for p in (root / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        is_pkg = path.name == "__init__.py"
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = mod.split(".")[: len(mod.split(".")) - node.level + is_pkg]
                    base = ".".join(parts + ([base] if base else []))
                for a in node.names:
                    deps.add(f"{base}.{a.name}" if f"{base}.{a.name}" in files else base)
        graph[mod] = {d for d in deps if d in files and d != mod}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_finds_a_cycle(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import g\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n")
    (pkg / "d.py").write_text("import pkg.a\n")
    assert _cycles(_module_graph(tmp_path, "pkg")) == [["pkg.a", "pkg.c", "pkg.sub.b"]]


def test_diffusion_rl_has_no_import_cycles():
    graph = _module_graph(ROOT, "diffusion_rl")
    assert graph["diffusion_rl.trainer"] >= {"diffusion_rl.algorithms", "diffusion_rl.rollout"}  # the graph is real
    assert not _cycles(graph), f"import cycles among diffusion_rl modules: {_cycles(graph)}"


@pytest.mark.parametrize("package", ["mmreward", "vlm_rm"])
def test_mmreward_and_vlm_rm_have_no_import_cycles(package):
    # media <-> types (a device check) and the Qwen-VL families <-> their tiny test model (prompt texts) were
    # the last two; both now read from modules of their own (mmreward.devices, prompt_templates/vlm.py)
    graph = _module_graph(ROOT, package)
    assert len(graph) > 10 and any(graph.values())  # the graph is real
    assert not _cycles(graph), f"import cycles among {package} modules: {_cycles(graph)}"


def test_tests_mirror_the_packages():
    """Tests live under tests/<package>/ (shared code in tests/_helpers/); only cross-cutting checks stay at the top."""
    tests = ROOT / "tests"
    top = {p.name for p in tests.glob("*.py")}
    cross_cutting = {"conftest.py", "test_layout.py", "test_packaging.py", "test_install_keeps_torch.py",
                     "test_setup_env.py", "test_public_api.py", "test_dependency_bounds.py", "test_benchmarks_smoke.py",
                     "test_benchmark_gradient_agreement.py", "test_benchmark_sde_exploration.py", "test_tolerances.py",
                     "test_supported_models_page.py", "test_stale_outputs.py"}
    assert top <= cross_cutting, f"put these under tests/<package>/ or tests/_helpers/: {sorted(top - cross_cutting)}"
    for package in ("mmreward", "diffusion_rl", "vlm_rm"):
        assert list((tests / package).glob("test_*.py")), f"tests/{package}/ holds no tests"
    helpers = [p.name for p in (tests / "_helpers").glob("test_*.py")]
    assert not helpers, f"tests/_helpers/ holds shared code, not tests: {helpers}"
