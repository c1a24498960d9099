"""Face reward with facenet-pytorch's real MTCNN weights on scikit-image photos."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mmreward
from mmreward.errors import ConfigError
from tests._helpers.parity_record import record_parity
from tests._helpers.tolerances import assert_close_scaled

skimage_data = pytest.importorskip("skimage.data")
pytest.importorskip("facenet_pytorch")


def _half(img: np.ndarray) -> torch.Tensor:
    t = torch.from_numpy(img).permute(2, 0, 1).float()[None] / 255
    return torch.nn.functional.interpolate(t, scale_factor=0.5, mode="area")[0]


@pytest.fixture(scope="module")
def reward():
    return mmreward.load("face-mtcnn")


def _iou(a, b) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def test_finds_the_astronauts_face_and_none_in_coffee(reward):
    astronaut, coffee = _half(skimage_data.astronaut()), _half(skimage_data.coffee())
    out = reward.score(None, [astronaut, coffee])
    assert out.scores[0] > 0.95 and out.scores[1] == 0.0
    assert out.details["face_count"].tolist() == [1.0, 0.0]
    faces = reward.faces([astronaut])
    assert len(faces[0]) == 1
    face = faces[0][0]
    assert face.crop.shape == (3, 160, 160) and 0 <= face.crop.min() and face.crop.max() <= 1
    # an independent detector (NudeNet, on the full-size photo) puts the face in the same place
    nudenet_face = (173, 82, 173 + 102, 82 + 98)  # NudeNet 320n's FACE_FEMALE box, x y w h -> x1 y1 x2 y2
    ours = tuple(2 * v for v in face.box)
    assert _iou(ours, nudenet_face) > 0.5, ours


@pytest.mark.parity
def test_scores_match_facenet_pytorch_mtcnn_on_pil_images(reward):
    """facenet-pytorch's own `MTCNN(keep_all=True).detect` on PIL images (its uint8 path), same weights and
    thresholds: the best face probability and the count of faces at >= 0.9, per photo."""
    from importlib.metadata import version

    from facenet_pytorch import MTCNN
    from PIL import Image

    photos = [skimage_data.astronaut()[::2, ::2], skimage_data.coffee()[:301, :451], skimage_data.chelsea()]
    original = MTCNN(keep_all=True, select_largest=False)
    want_best, want_count = [], []
    for img in photos:
        _, probs = original.detect(Image.fromarray(np.ascontiguousarray(img)))
        probs = np.zeros(0) if probs is None or probs[0] is None else np.asarray(probs, dtype=np.float64)
        want_best.append(float(probs.max()) if len(probs) else 0.0)
        want_count.append(float((probs >= 0.9).sum()))
    out = reward.score(None, [torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1) for img in photos])
    ours = torch.cat([out.details["best_face_prob"], out.details["face_count"]])
    want = torch.tensor(want_best + want_count)
    record_parity("face-mtcnn", original=f"facenet-pytorch=={version('facenet-pytorch')} MTCNN.detect", how="package",
                  actual=ours, expected=want, cases=("RGB", "odd size"),
                  not_checked="grayscale/RGBA: MTCNN.detect takes RGB images")
    assert want_best[0] > 0.95 and want_count[1] == 0  # the comparison sees a face and an image without one
    assert_close_scaled(ours, want, rel=1e-5)


def test_checkpoint_folder_in_the_official_layout(tmp_path, reward):
    for name in ("pnet", "rnet", "onet"):
        torch.save(getattr(reward.mtcnn, name).state_dict(), tmp_path / f"{name}.pt")
    again = mmreward.load("face-mtcnn", checkpoint=tmp_path)
    img = _half(skimage_data.astronaut())
    torch.testing.assert_close(again.score(None, img).scores, reward.score(None, img).scores)


class CannedMTCNN(torch.nn.Module):
    def __init__(self, boxes, probs):
        super().__init__()
        self.boxes, self.probs = boxes, probs

    def detect(self, batch):
        n = len(batch)
        return self.boxes[:n], self.probs[:n]


def test_scoring_logic_with_canned_detections():
    from mmreward.models.faces import FaceReward

    boxes = [np.array([[0, 0, 4, 4], [1, 1, 5, 5.0]]), None, np.array([[2, 2, 6, 6.0]])]
    probs = [[0.80, 0.99], [None], [0.5]]
    reward = FaceReward(CannedMTCNN(boxes, probs), min_prob=0.9)
    out = reward.score(None, torch.rand(3, 3, 8, 8))
    torch.testing.assert_close(out.scores, torch.tensor([0.99, 0.0, 0.5]))  # best face, 0 for none
    assert out.details["face_count"].tolist() == [1.0, 0.0, 0.0]
    faces = reward.faces(torch.rand(3, 3, 8, 8))
    assert [f.prob for f in faces[0]] == [0.99, 0.80] and faces[1] == []
    counted = FaceReward(CannedMTCNN(boxes, probs), mode="count", min_prob=0.5).score(None, torch.rand(3, 3, 8, 8))
    assert counted.scores.tolist() == [2.0, 0.0, 1.0]  # faces at or above min_prob
    with pytest.raises(ConfigError, match="mode"):
        FaceReward(CannedMTCNN([], []), mode="faces")
