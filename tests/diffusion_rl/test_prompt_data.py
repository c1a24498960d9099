"""The recipes' prompt sets: shipped copies are verbatim and listed in configs/prompts/SOURCES.json, published
sets are pinned URLs fetched at first use into a verified cache, and `--check` resolves every recipe offline."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from diffusion_rl.cli import main
from mmreward import published_data
from mmreward.errors import CheckpointError, ConfigError
from mmreward.prompt_sources import load_prompts

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ROOT / "configs" / "prompts"
RECIPES = sorted((ROOT / "configs").glob("*.yaml"))
SOURCES = json.loads((PROMPTS / "SOURCES.json").read_text())
# git's own id of the blob "hello\nworld\n" (`printf 'hello\nworld\n' | git hash-object --stdin`)
HELLO = b"hello\nworld\n"
HELLO_BLOB = "94954abda49de8615a048f8d2e64b5de848e27a1"
HELLO_SHA256 = hashlib.sha256(HELLO).hexdigest()


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv(published_data.CACHE_ENV, str(root))
    return root


@pytest.fixture
def hello(tmp_path) -> Path:
    path = tmp_path / "published" / "hello.txt"
    path.parent.mkdir()
    path.write_bytes(HELLO)
    return path


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


# ----------------------------------------------------------------------------------------------
# every recipe validates offline, in a fresh process that cannot reach the network
# ----------------------------------------------------------------------------------------------
_NO_NETWORK = """
import socket, urllib.request
def _refuse(*a, **k):
    raise OSError("network access attempted during --check")
socket.socket.connect = _refuse
socket.create_connection = _refuse
urllib.request.urlopen = _refuse
"""


def test_every_recipe_checks_offline_in_a_subprocess(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(_NO_NETWORK)
    script = (
        "import sys\nfrom diffusion_rl.cli import main\n"
        "for recipe in sys.argv[1:]:\n"
        "    procs = '1' if 'shapes_' in recipe else '8'\n"
        "    code = main(['config', '--config', recipe, '--check', '--num-processes', procs])\n"
        "    print(f'@@ {recipe} exit {code}', flush=True)\n"
    )
    cache = tmp_path / "cache"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           published_data.CACHE_ENV: str(cache),
           "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", script, *map(str, RECIPES)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(RECIPES) >= 11
    blocks = proc.stdout.split("@@ ")
    for recipe in RECIPES:
        assert f"{recipe} exit 0" in proc.stdout, proc.stdout + proc.stderr[-3000:]
        raw = yaml.safe_load(recipe.read_text())
        block = next(b for b in blocks if f"OK {recipe}:" in b)
        for key in ("train", "eval"):
            if isinstance(raw["prompts"].get(key), dict):
                assert f"{key}: remote data, fetched at first run: {raw['prompts'][key]['url']}" in block
    assert "network access attempted" not in proc.stdout + proc.stderr
    assert _files(cache) == [], "--check must not download"


def test_a_missing_local_prompt_file_is_still_exit_2_with_one_line(tmp_path, capsys):
    recipe = ROOT / "configs" / "flow_grpo_sd35_pickscore.yaml"
    assert main(["config", "--config", str(recipe), "--check", "--num-processes", "8",
                 f"prompts.eval={tmp_path / 'absent.txt'}"]) == 2
    line = _one_line_error(capsys)
    assert "prompts.eval" in line and "absent.txt" in line and "is not a file" in line


def test_a_missing_file_next_to_a_yaml_is_exit_2(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"model": {"pretrained": "org/model"}, "reward": {"rewards": {"mock": 1.0}},
                                    "prompts": {"train": "prompts/absent.txt"}}))
    assert main(["config", "--config", str(path), "--check"]) == 2
    assert "prompts.train" in _one_line_error(capsys)


# ----------------------------------------------------------------------------------------------
# shipped files and the manifest
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("entry", SOURCES["shipped"], ids=lambda e: e["file"])
def test_shipped_prompt_files_are_the_upstream_bytes_listed_in_the_manifest(entry):
    path = PROMPTS / entry["file"]
    data = path.read_bytes()
    assert len(data) == entry["bytes"]
    assert hashlib.sha256(data).hexdigest() == entry["sha256"]
    # the upstream commit's tree records this blob id: equal ids mean byte-identical copies
    assert published_data.file_digest(path, "git_blob_sha1") == entry["git_blob_sha1"]
    assert len(load_prompts(str(path))) == entry["prompts"]
    assert entry["license"] and entry["source"].startswith("https://github.com/")
    assert entry["file"] in (PROMPTS / "README.md").read_text()


def test_every_recipe_prompt_source_is_shipped_or_a_pinned_published_set():
    shipped = {(PROMPTS / e["file"]).resolve() for e in SOURCES["shipped"]}
    remote = {(e["url"], e.get("sha256") or e.get("git_blob_sha1")) for e in SOURCES["remote"]}
    seen_remote = set()
    for recipe in RECIPES:
        for key, value in yaml.safe_load(recipe.read_text())["prompts"].items():
            if isinstance(value, str):
                path = (recipe.parent / value).resolve()
                # a published set copied into configs/prompts/, or ShapesWorld data that build_assets generates
                ours = path.is_relative_to((ROOT / "assets" / "shapesworld").resolve()) and path.is_file()
                assert path in shipped or ours, f"{recipe.name} prompts.{key}: {value}"
            elif isinstance(value, dict):
                ref = published_data.parse_remote(value, f"{recipe.name} prompts.{key}")
                assert (ref.url, ref.digest) in remote, f"{recipe.name} prompts.{key} is not in SOURCES.json"
                assert "/raw.githubusercontent.com/" in ref.url and len(ref.url.split("/")[5]) == 40, \
                    "pin a commit, not a branch"
                seen_remote.add((ref.url, ref.digest))
    assert seen_remote == remote, "SOURCES.json lists a remote set no recipe uses"


def test_no_recipe_trains_on_its_test_set():
    for recipe in RECIPES:
        prompts = yaml.safe_load(recipe.read_text())["prompts"]
        if prompts.get("eval") is not None and not isinstance(prompts["train"], list):
            assert prompts["train"] != prompts["eval"], recipe.name


# ----------------------------------------------------------------------------------------------
# url sources: pinned, verified, cached, atomic
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("pin", [{"sha256": HELLO_SHA256}, {"git_blob_sha1": HELLO_BLOB}], ids=["sha256", "git_blob"])
def test_url_source_downloads_once_checks_the_pin_and_reads_from_the_cache(hello, cache, monkeypatch, pin):
    source = {"url": hello.as_uri(), **pin}
    assert load_prompts(source, "prompts.train") == ["hello", "world"]
    cached = _files(cache)
    assert len(cached) == 1 and cached[0].read_bytes() == HELLO and cached[0].name == "hello.txt"
    # second use: from the cache, no download (the source is gone and the network refuses)
    hello.unlink()
    monkeypatch.setattr(published_data, "_open_url", lambda url: pytest.fail(f"downloaded {url} again"))
    assert load_prompts(source, "prompts.train") == ["hello", "world"]


def test_a_download_that_does_not_match_the_pin_is_refused_and_not_cached(hello, cache):
    hello.write_bytes(b"hello\nw0rld\n")  # tampered after the pin was taken
    with pytest.raises(CheckpointError, match=f"pins {HELLO_SHA256}") as err:
        load_prompts({"url": hello.as_uri(), "sha256": HELLO_SHA256}, "prompts.train")
    assert "prompts.train" in str(err.value) and "pin a commit" in str(err.value)
    assert _files(cache) == [], "an unverified file must not stay in the cache"


def test_a_tampered_network_download_is_refused(cache, monkeypatch):
    monkeypatch.setattr(published_data, "_open_url", lambda url: io.BytesIO(b"<html>rate limited</html>"))
    with pytest.raises(CheckpointError, match="git_blob_sha1 .* but the config pins"):
        load_prompts({"url": "https://example.org/a/prompts.txt", "git_blob_sha1": HELLO_BLOB}, "prompts.train")
    assert _files(cache) == []


def test_a_corrupted_cache_entry_is_fetched_again(hello, cache):
    source = {"url": hello.as_uri(), "sha256": HELLO_SHA256}
    load_prompts(source, "prompts.train")
    (cached,) = _files(cache)
    cached.write_bytes(b"evil prompt\n")
    assert load_prompts(source, "prompts.train") == ["hello", "world"]
    assert cached.read_bytes() == HELLO
    # corrupt again with the source gone: an error that names where to put the file, never the bad copy
    cached.write_bytes(b"evil prompt\n")
    hello.unlink()
    with pytest.raises(CheckpointError, match="cannot download") as err:
        load_prompts(source, "prompts.train")
    assert str(cached) in str(err.value)


def test_an_interrupted_download_leaves_nothing_in_the_cache(cache, monkeypatch):
    class Broken(io.BytesIO):
        def read(self, *args):
            raise OSError("connection reset")

    monkeypatch.setattr(published_data, "_open_url", lambda url: Broken(HELLO))
    with pytest.raises(CheckpointError, match="connection reset"):
        load_prompts({"url": "https://example.org/a/prompts.txt", "sha256": HELLO_SHA256}, "prompts.train")
    assert _files(cache) == []


def test_jsonl_url_source_keeps_the_metadata(tmp_path, cache):
    rows = [{"prompt": "a photo of two cats", "tag": "counting", "include": [{"class": "cat", "count": 2}]}]
    path = tmp_path / "meta.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    prompts = load_prompts({"url": path.as_uri(), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}, "p")
    assert prompts == ["a photo of two cats"]
    assert prompts.metadata == [{"tag": "counting", "include": [{"class": "cat", "count": 2}]}]


@pytest.mark.parametrize("source,match", [
    ({"url": "https://example.org/p.txt"}, "exactly one pinned hash"),
    ({"url": "https://example.org/p.txt", "sha256": "abc"}, "64 hexadecimal digits"),
    ({"url": "https://example.org/p.txt", "sha256": HELLO_SHA256, "git_blob_sha1": HELLO_BLOB}, "exactly one"),
    ({"url": "ftp://example.org/p.txt", "sha256": HELLO_SHA256}, "is not a URL of a file"),
    ({"url": "https://example.org", "sha256": HELLO_SHA256}, "is not a URL of a file"),
    ({"url": "", "sha256": HELLO_SHA256}, "non-empty URL"),
    ({"url": "https://example.org/p.txt", "sha": HELLO_SHA256}, "unknown key"),
])
def test_malformed_url_sources_are_config_errors(source, match, cache):
    with pytest.raises(ConfigError, match=match):
        load_prompts(source, "prompts.train")


def test_check_reports_a_url_source_without_downloading_then_as_cached(hello, cache, tmp_path, capsys, monkeypatch):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"model": {"pretrained": "org/model"},
                                    "reward": {"rewards": {"mock": 1.0}},
                                    "prompts": {"train": {"url": hello.as_uri(), "sha256": HELLO_SHA256}}}))
    capsys.readouterr()
    real_open = published_data._open_url
    monkeypatch.setattr(published_data, "_open_url", lambda url: pytest.fail("--check downloaded"))
    assert main(["config", "--config", str(path), "--check"]) == 0
    assert f"train: remote data, fetched at first run: {hello.as_uri()} (sha256 {HELLO_SHA256})" in \
        capsys.readouterr().out
    monkeypatch.setattr(published_data, "_open_url", real_open)
    load_prompts({"url": hello.as_uri(), "sha256": HELLO_SHA256}, "prompts.train")  # what the first run does
    assert main(["config", "--config", str(path), "--check"]) == 0
    assert "train: cached at" in capsys.readouterr().out
    # a malformed pin is a usage error: one line, exit 2
    assert main(["config", "--config", str(path), "--check", "prompts.train.sha256=abc"]) == 2
    assert "prompts.train.sha256 must be 64 hexadecimal digits" in _one_line_error(capsys)


def test_hf_prompt_ids_in_a_yaml_are_not_taken_for_paths(tmp_path):
    from diffusion_rl.config import load_config

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"model": {"pretrained": "org/model"}, "reward": {"rewards": {"mock": 1.0}},
                                    "prompts": {"train": "hf:org/prompts:train", "eval": "local.txt"}}))
    cfg = load_config(path)
    assert cfg.prompts.train == "hf:org/prompts:train"
    assert Path(cfg.prompts.eval) == (tmp_path / "local.txt").resolve()
