"""The ShapesWorld trainers run on cfg.threads threads and give the caller its thread count back.

They used to leave torch at cfg.threads (2) for the rest of the process: in a one-thread-per-worker test
session on two cores that oversubscribed the CPU and made every later test in the worker 2-3x slower.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
import torch

TRAINERS = ["train_clip", "train_generator", "train_edit_model", "train_video_generator", "train_vqa_policy"]


@pytest.mark.parametrize("name", TRAINERS)
@pytest.mark.parametrize("fails", [False, True])
def test_trainer_uses_its_threads_and_restores_the_callers(monkeypatch, name, fails):
    mod = importlib.import_module(f"mmreward.synthetic.build.{name}")
    seen = []

    def body(cfg):  # stands in for the training itself: records the thread count it runs under
        seen.append(torch.get_num_threads())
        if fails:
            raise RuntimeError("training failed")
        return "done"

    monkeypatch.setattr(mod, "_train", body)
    before = torch.get_num_threads()
    caller, wanted = (2, 1) if before == 1 else (1, 2)
    torch.set_num_threads(caller)
    try:
        if fails:
            with pytest.raises(RuntimeError, match="training failed"):
                mod.train(SimpleNamespace(threads=wanted))
        else:
            assert mod.train(SimpleNamespace(threads=wanted)) == "done"
        assert seen == [wanted]
        assert torch.get_num_threads() == caller
    finally:
        torch.set_num_threads(before)


def _caller_and_wanted() -> tuple[int, int, int]:
    before = torch.get_num_threads()
    return (before, 2, 1) if before == 1 else (before, 1, 2)


def test_build_assets_runs_on_its_threads_and_restores_the_callers(monkeypatch):
    from mmreward.synthetic.build import build_assets

    seen = []
    monkeypatch.setattr(build_assets, "_build", lambda args: seen.append(torch.get_num_threads()) or {"x": 1.0})
    before, caller, wanted = _caller_and_wanted()
    torch.set_num_threads(caller)
    try:
        assert build_assets.main(["--threads", str(wanted), "--quick"]) == {"x": 1.0}
        assert seen == [wanted] and torch.get_num_threads() == caller
    finally:
        torch.set_num_threads(before)


def test_train_preference_runs_on_its_threads_and_restores_the_callers(monkeypatch, tmp_path):
    from mmreward.synthetic.build import train_preference

    seen = []
    monkeypatch.setattr(train_preference, "train_pref", lambda cfg: seen.append(torch.get_num_threads()) or {})
    monkeypatch.setattr(train_preference, "train_aesthetic", lambda cfg: seen.append(torch.get_num_threads()) or {})
    monkeypatch.setattr(train_preference, "write_cards", lambda *a: None)
    before, caller, wanted = _caller_and_wanted()
    torch.set_num_threads(caller)
    try:
        train_preference.main(["--threads", str(wanted), "--pref-out", str(tmp_path)])
        assert seen == [wanted, wanted] and torch.get_num_threads() == caller
    finally:
        torch.set_num_threads(before)
