"""YAML configs and JSON cards/checkpoints (issue 28 item 20): an alias bomb, a 20,000-deep document and a
duplicate key are refused quickly with a typed, one-line error naming the file; anchors and merge keys that
configs use on purpose still work."""

from __future__ import annotations

import json
import time

import pytest

import mmreward
from diffusion_rl.config import load_config, parse_overrides
from mmreward.checkpoints import read_json
from mmreward.errors import CheckpointError, ConfigError

# 9 levels of 9 aliases: a few hundred bytes that expand to 9^9 (387 million) strings
BOMB = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 9) + "]\n" for i in range(8))
DEEP_YAML = "[" * 20_000 + "]" * 20_000
DEEP_JSON = "[" * 20_000 + "]" * 20_000


@pytest.mark.parametrize("text, match", [
    (BOMB, "aliases expanded"),
    (DEEP_YAML, "nests deeper than"),
    ("model:\n  pretrained: a\nmodel:\n  pretrained: b\n", "duplicate key 'model'"),
    ("train:\n  learning_rate: 1e-4\n  learning_rate: 1e-2\n", "duplicate key 'learning_rate'.* at line 3"),
    ("a: &x [*x]\n", "recursive"),
])
def test_config_file_refused_with_a_config_error(tmp_path, text, match):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=match) as err:
        load_config(path)
    assert time.perf_counter() - start < 10  # today the bomb hangs or ends in MemoryError
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_diffusion_rl_config_cli_one_line_exit_2(tmp_path, capsys):
    from diffusion_rl.cli import main

    for i, text in enumerate([BOMB, DEEP_YAML, "a: 1\na: 2\n"]):
        path = tmp_path / f"c{i}.yaml"
        path.write_text(text)
        assert main(["config", "--config", str(path)]) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(err) == 1 and "Traceback" not in err[0] and "not valid YAML" in err[0], err


def test_override_value_bomb_and_duplicates_refused():
    with pytest.raises(ConfigError, match="not valid YAML"):
        parse_overrides(["sample.sde_window=" + "[" * 5000 + "]" * 5000])
    with pytest.raises(ConfigError, match="duplicate key"):
        parse_overrides(["reward.rewards={a: 1, a: 2}"])


def test_anchors_and_merge_keys_still_work(tmp_path):
    from mmreward.safe_parse import safe_yaml

    data = safe_yaml("base: &b {lr: 1, eps: 2}\nrun:\n  <<: *b\n  lr: 3\nlist: [*b, *b]\n")
    assert data["run"] == {"lr": 3, "eps": 2} and data["list"] == [{"lr": 1, "eps": 2}] * 2


@pytest.mark.parametrize("text, match", [
    ('{"reward": "clipscore", "reward": "pickscore"}', "duplicate key 'reward'"),
    (DEEP_JSON, "nests deeper than"),
    ('{"a": ' * 150 + "1" + "}" * 150, "nests deeper than"),
])
def test_json_card_refused_with_a_checkpoint_error(tmp_path, text, match):
    (tmp_path / "mmreward.json").write_text(text)
    with pytest.raises(CheckpointError, match=match) as err:
        read_json(tmp_path / "mmreward.json", "reward card")
    assert "mmreward.json" in str(err.value)
    with pytest.raises(CheckpointError, match=match):  # the real loader of a downloaded folder
        mmreward.load(tmp_path)


def test_model_config_json_duplicates_refused(tmp_path):
    from transformers import CLIPModel

    from mmreward.checkpoints import load_pretrained

    (tmp_path / "config.json").write_text('{"model_type": "clip", "projection_dim": 8, "projection_dim": 16}')
    with pytest.raises(CheckpointError, match="config.json.*duplicate key 'projection_dim'"):
        load_pretrained(CLIPModel, tmp_path)


def test_plain_json_still_loads(tmp_path):
    (tmp_path / "c.json").write_text(json.dumps({"reward": "x", "options": {"a": [1, {"b": None}]}}))
    assert read_json(tmp_path / "c.json")["options"]["a"][1] == {"b": None}


def test_bench_annotation_files_refuse_duplicates_and_deep_nesting(tmp_path):
    from vlm_rm.bench.items import read_records

    (tmp_path / "a.jsonl").write_text('{"prompt": "x"}\n{"prompt": "a", "prompt": "b"}\n')
    with pytest.raises(ConfigError, match=r"a.jsonl line 2 is refused: duplicate key 'prompt'"):
        read_records(tmp_path / "a.jsonl")
    (tmp_path / "b.json").write_text(DEEP_JSON)
    with pytest.raises(ConfigError, match="b.json is refused: it nests deeper"):
        read_records(tmp_path / "b.json")
    (tmp_path / "c.jsonl").write_text('{"prompt": "x"}\n')
    assert read_records(tmp_path / "c.jsonl") == [{"prompt": "x"}]


def test_prompt_and_manifest_jsonl_refuse_duplicates_and_deep_nesting(tmp_path, capsys):
    """The prompt metadata and `mmreward score --prompts manifest.jsonl` rows go through the same safe JSON."""
    from mmreward import cli
    from mmreward.errors import ConfigError
    from mmreward.prompt_sources import load_prompts

    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"prompt": "a", "x": ' + "[" * 20000 + "]" * 20000 + "}\n")
    dup = tmp_path / "dup.jsonl"
    dup.write_text('{"prompt": "a", "prompt": "b"}\n')
    for path in (deep, dup):
        with pytest.raises(ConfigError, match="refused"):
            load_prompts(str(path))
        rc = cli.main(["score", "--reward", "jpeg-compressibility", "--prompts", str(path), "--no-progress"])
        err = capsys.readouterr().err
        assert rc == 2 and "Traceback" not in err and "RecursionError" not in err, err
