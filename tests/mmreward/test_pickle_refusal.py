"""Refused pickles (issue 28 item 24): every torch.load goes through mmreward.pickle_files, whose error says the
file holds pickled objects, which we never unpickle, and how to convert it to safetensors once; it never passes
on PyTorch's advice to retry the load, and never calls such a file corrupt."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mmreward.checkpoints import load_state_dict
from mmreward.errors import CheckpointError
from mmreward.pickle_files import load_torch_file

TORCH_ADVICE = ("Re-running", "will likely succeed", "add_safe_globals", "safe_globals", "Weights only load failed",
                "weights_only` set to `False`")


class _Payload:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def _assert_refusal(msg: str, path: Path) -> None:
    assert str(path) in msg
    assert "never unpickles" in msg and "convert it to safetensors" in msg
    assert "corrupt" not in msg
    assert not any(a in msg for a in TORCH_ADVICE), msg


@pytest.mark.parametrize("payload, named", [
    (_Payload(), "system"),  # torch >= 2.6: 'unsupported GLOBAL posix.system whose module posix is blocked'
    (argparse.Namespace(lr=1), "argparse.Namespace"),  # 'GLOBAL argparse.Namespace was not an allowed global'
])
def test_refused_pickle_says_what_it_is_and_how_to_convert(tmp_path, monkeypatch, payload, named):
    path = tmp_path / "model.pt"
    torch.save({"w": torch.ones(2), "extra": payload}, path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError) as err:
        load_state_dict(path)
    _assert_refusal(str(err.value), path)
    assert named in str(err.value)
    assert not (tmp_path / "PWNED").exists()


def test_conversion_snippet_works_in_a_trusted_environment(tmp_path):
    """The two lines the message gives produce a safetensors file that then loads."""
    path = tmp_path / "model.pt"
    torch.save({"w": torch.arange(4.0), "args": argparse.Namespace(lr=1)}, path)
    with pytest.raises(CheckpointError) as err:
        load_state_dict(path)
    snippet = "\n".join(line.strip() for line in str(err.value).splitlines()[1:])
    subprocess.run([sys.executable, "-c", snippet], check=True, cwd=tmp_path)
    assert torch.equal(load_state_dict(tmp_path / "model.safetensors")["w"], torch.arange(4.0))


def test_not_a_pickle_is_named_as_such_without_torch_advice(tmp_path):
    for name, data in [("junk.pt", b"hello, not a pickle"), ("empty.bin", b""), ("half.pt", None)]:
        path = tmp_path / name
        if data is None:
            torch.save({"w": torch.ones(100)}, path)
            data = path.read_bytes()[:200]
        path.write_bytes(data)
        with pytest.raises(CheckpointError, match="cannot read") as err:
            load_torch_file(path)
        assert not any(a in str(err.value) for a in TORCH_ADVICE)


def test_legacy_trainer_checkpoint_with_objects_is_refused_with_the_conversion(tmp_path):
    from diffusion_rl.checkpointing import read_checkpoint

    torch.save({"iteration": 1, "optimizer_steps": 1, "params": {}, "optimizer": {}, "history": [_Payload()]},
               tmp_path / "trainer_state.pt")
    with pytest.raises(CheckpointError) as err:
        read_checkpoint(tmp_path)
    _assert_refusal(str(err.value), tmp_path / "trainer_state.pt")


def test_transformers_bin_with_objects_is_refused_with_the_conversion(tmp_path):
    """A from_pretrained folder whose pytorch_model.bin needs objects: today transformers' error, with
    torch's retry advice, is passed on."""
    from transformers import CLIPTextConfig, CLIPTextModel

    from mmreward.checkpoints import load_pretrained

    cfg = CLIPTextConfig(vocab_size=99, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=2, max_position_embeddings=16)
    model = CLIPTextModel(cfg)
    cfg.save_pretrained(tmp_path)
    torch.save({**model.state_dict(), "args": argparse.Namespace(lr=1)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointError) as err:
        load_pretrained(CLIPTextModel, tmp_path)
    _assert_refusal(str(err.value), tmp_path / "pytorch_model.bin")


def test_every_torch_load_goes_through_the_helper():
    """The product calls torch.load in one place only (found by parsing, so docstrings do not count)."""
    import ast

    root = Path(__file__).resolve().parents[2]
    offenders = []
    for pkg in ("mmreward", "diffusion_rl", "vlm_rm"):
        for p in (root / pkg).rglob("*.py"):
            if p.name == "pickle_files.py" or "torch.load" not in (text := p.read_text()):
                continue
            offenders += [f"{p.relative_to(root)}:{n.lineno}" for n in ast.walk(ast.parse(text))
                          if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "load"
                          and isinstance(n.func.value, ast.Name) and n.func.value.id == "torch"]
    assert offenders == []
