"""Typed errors and the right exit codes for inputs users get wrong (issue 28 item 23).

Loader options that name load()'s own arguments, invalid hub ids, prompt files that are not UTF-8,
records with a lone surrogate, output folders that cannot be written (a file, under a file,
read-only, a full disk) and a 1-D tensor sent to the server: each is a typed error (CLI: one line,
exit 2) instead of a TypeError, HFValidationError, UnicodeDecodeError or traceback.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import tempfile

import pytest
import torch
from PIL import Image

import mmreward
from mmreward.errors import CheckpointError, ConfigError, OutputError


@pytest.fixture
def red_png(tmp_path):
    path = tmp_path / "red.png"
    Image.new("RGB", (8, 8), (255, 0, 0)).save(path)
    return path


def _genai(tmp_path, image) -> str:
    path = tmp_path / "g.jsonl"
    path.write_text(json.dumps({"prompt": "red", "left_image": str(image), "right_image": str(image),
                                "vote_type": "leftvote"}))
    return str(path)


@pytest.mark.parametrize("name", ["checkpoint", "device", "dtype", "weights"])
def test_loader_options_naming_load_arguments(name, red_png, tmp_path, capsys):
    from mmreward.cli import main as mmreward_main
    from vlm_rm.adapters import verl
    from vlm_rm.cli import main as vlm_main

    value = {"checkpoint": "x", "device": "cpu", "dtype": "fp32", "weights": "random"}[name]
    assert mmreward_main(["score", "--reward", "mock", "--prompt", "red", "--option", f"{name}={value}",
                          str(red_png)]) == 2
    assert f"sets ['{name}'], which are arguments of mmreward.load itself" in capsys.readouterr().err
    if name != "dtype":  # bench has no --dtype flag, so dtype may go through --load-option
        assert vlm_main(["bench", "--reward", "mock", "--benchmark", "genai-bench-image", "--data",
                         _genai(tmp_path, red_png), "--out", str(tmp_path / "o"), "--load-option",
                         f"{name}={value}", "--quiet"]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and "arguments of mmreward.load" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(ConfigError, match="set them as reward kwargs beside options"):
        verl.compute_score("s", "red", "x", {"mmreward_media": str(red_png)}, reward="mock", options={name: value})


@pytest.mark.parametrize("checkpoint", ["org/--bad..name", "org/with space"])
def test_invalid_hub_ids_are_checkpoint_errors(checkpoint):
    with pytest.raises(CheckpointError, match="valid hub id"):
        mmreward.load("clipscore", checkpoint=checkpoint)
    with pytest.raises(CheckpointError, match="valid hub id"):
        mmreward.load(f"hf-hub:{checkpoint}")


def test_prompt_files_not_utf8_and_lone_surrogates(tmp_path, red_png):
    from diffusion_rl.inference.cli import _prompts
    from mmreward.prompt_sources import load_prompts

    latin1 = tmp_path / "prompts.txt"
    latin1.write_bytes("a red circle\nun caf\u00e9 rouge\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"line 2 is not UTF-8"):
        load_prompts(str(latin1), "prompts.train")
    as_jsonl = tmp_path / "prompts.jsonl"
    as_jsonl.write_bytes(b'{"prompt": "caf\xe9"}\n')
    with pytest.raises(ConfigError, match="line 1 is not UTF-8"):
        load_prompts(str(as_jsonl), "prompts.train")
    with pytest.raises(ConfigError, match="not UTF-8"):
        _prompts(argparse.Namespace(prompt=[], prompts_file=str(latin1)))
    # a JSON escape of half a surrogate pair decodes to a lone surrogate: refused when the file is read
    edits = tmp_path / "edits.jsonl"
    edits.write_text('{"source_image": "red.png", "instruction": "make it \\ud83d blue"}\n')
    with pytest.raises(ConfigError, match="lone surrogate"):
        load_prompts(str(edits), "prompts.train")
    plain = tmp_path / "plain.jsonl"
    plain.write_text('{"prompt": "a \\udc00 cat"}\n')
    with pytest.raises(ConfigError, match="lone surrogate"):
        load_prompts(str(plain), "prompts.train")
    ok = tmp_path / "ok.jsonl"
    ok.write_text('{"source_image": "red.png", "instruction": "add \\ud83d\\ude00"}\n')
    assert str(load_prompts(str(ok), "prompts.train")[0]) == "add \U0001f600"


def test_bench_output_folder_that_cannot_be_written(tmp_path, red_png, capsys, monkeypatch):
    from vlm_rm.cli import main as vlm_main

    data = _genai(tmp_path, red_png)
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    base = ["bench", "--reward", "mock", "--benchmark", "genai-bench-image", "--data", data, "--quiet", "--out"]
    for out, want in ((a_file, "is a file"), (a_file / "sub", "which is a file")):
        assert vlm_main([*base, str(out)]) == 2
        err = capsys.readouterr().err
        assert want in err and "Traceback" not in err and len(err.strip().splitlines()) == 1

    def read_only(*args, **kwargs):  # what a read-only mount answers (root ignores permission bits)
        raise OSError(errno.EROFS, "Read-only file system", kwargs.get("dir"))

    with monkeypatch.context() as m:
        m.setattr(tempfile, "TemporaryFile", read_only)
        assert vlm_main([*base, str(tmp_path / "ro")]) == 2
    assert "Read-only file system" in capsys.readouterr().err

    # a full disk while writing the results card: /dev/full answers every write with ENOSPC
    out = tmp_path / "full"
    out.mkdir()
    os.symlink("/dev/full", out / "results.json")
    assert vlm_main([*base, str(out)]) == 2
    err = capsys.readouterr().err
    assert "No space left on device" in err and "free disk space" in err and len(err.strip().splitlines()) == 1


def test_score_output_on_a_full_disk(tmp_path, red_png, capsys):
    from mmreward.cli import main as mmreward_main

    os.symlink("/dev/full", tmp_path / "scores.jsonl")
    code = mmreward_main(["score", "--reward", "mock", "--prompt", "red", "--out", str(tmp_path / "scores.jsonl"),
                          "--no-progress", str(red_png)])
    err = capsys.readouterr().err
    assert code == 2 and "No space left on device" in err and len(err.strip().splitlines()) == 1


def test_train_output_dir_under_a_file_or_read_only(tmp_path, monkeypatch):
    from diffusion_rl.run_folder import choose_output_dir

    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    with pytest.raises(OutputError, match="log.output_dir .* which is a file"):
        choose_output_dir(a_file / "run", resuming=False, overwrite=False, new_run_suffix=False)

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", kwargs.get("dir"))

    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    with pytest.raises(OutputError, match="Read-only file system"):
        choose_output_dir(tmp_path / "run", resuming=False, overwrite=False, new_run_suffix=False)


def test_server_one_dimensional_tensor_is_a_bad_request():
    from mmreward.serve import encode_tensor, error_status, prepare_request

    reward = mmreward.load("mock")
    with pytest.raises(Exception) as info:
        prepare_request({"prompts": "red", "media": encode_tensor(torch.zeros(10))}, "score", reward,
                        max_items=4, request_id=0)
    assert error_status(info.value) == 400 and "shape must be" in str(info.value)
