"""OWLv2 (Minderer et al. 2023) open-vocabulary detection through transformers, as a GenEval detector.

Images go through the checkpoint's own Owlv2Processor (pad to a square at the bottom/right, resize,
CLIP normalisation), text queries are "a photo of a {name}", and boxes come back in the padded
square's pixels, which are the original image's pixels since padding is bottom/right. Overlapping
boxes of one class are merged by NMS (IoU `nms_iou`), as OWL's reference demo does.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mmreward.geneval import Detection


class OWLv2Detector(torch.nn.Module):
    # a Module so that the reward's .to(device, dtype) reaches the detector's weights
    def __init__(
        self,
        model: torch.nn.Module,
        processor,
        *,
        query_template: str = "a photo of a {}",
        min_score: float = 0.05,
        nms_iou: float = 0.3,
    ) -> None:
        super().__init__()
        self.model, self.processor = model, processor
        self.query_template, self.min_score, self.nms_iou = query_template, min_score, nms_iou

    def detect(self, images: torch.Tensor | list[torch.Tensor], names: Sequence[Sequence[str]]) -> list[list[Detection]]:
        from PIL import Image
        from torchvision.ops import batched_nms

        pil = [
            Image.fromarray((img.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).cpu().numpy())
            for img in images
        ]
        width = max(1, max(len(n) for n in names))
        # every image gets the same number of queries; padding queries are dropped below
        queries = [[self.query_template.format(n) for n in ns] + [" "] * (width - len(ns)) for ns in names]
        inputs = self.processor(text=queries, images=pil, return_tensors="pt").to(
            device=self.model.device, dtype=self.model.dtype
        )
        with torch.no_grad():
            outputs = self.model(**inputs)
        sides = [max(p.size) for p in pil]
        results = self.processor.post_process_grounded_object_detection(
            outputs, threshold=self.min_score, target_sizes=[(s, s) for s in sides]
        )
        out: list[list[Detection]] = []
        for ns, res in zip(names, results):
            boxes, scores, labels = res["boxes"].float(), res["scores"].float(), res["labels"]
            keep = labels < len(ns)
            boxes, scores, labels = boxes[keep], scores[keep], labels[keep]
            keep = batched_nms(boxes, scores, labels, self.nms_iou) if len(boxes) else labels[:0]
            out.append([
                Detection(ns[int(labels[k])], float(scores[k]), tuple(float(v) for v in boxes[k])) for k in keep
            ])
        return out


def tiny_owlv2_config(image_size: int = 64):
    """A few-layer OWLv2 configuration for tests and weights='random' (real tokenizer vocabulary size)."""
    from transformers import Owlv2Config

    return Owlv2Config(
        text_config={"vocab_size": 49408, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                     "num_attention_heads": 2, "max_position_embeddings": 77},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                       "image_size": image_size, "patch_size": 16},
        projection_dim=32,
    )  # fmt: skip


def save_tiny_owlv2(folder, tokenizer_dir, image_size: int = 64, seed: int = 0):
    """Write a random tiny OWLv2 checkpoint (model, processor, CLIP tokenizer) in the official layout."""
    from transformers import CLIPTokenizer, Owlv2ForObjectDetection, Owlv2ImageProcessor, Owlv2Processor

    torch.manual_seed(seed)
    model = Owlv2ForObjectDetection(tiny_owlv2_config(image_size)).eval()
    processor = Owlv2Processor(
        image_processor=Owlv2ImageProcessor(size={"height": image_size, "width": image_size}),
        tokenizer=CLIPTokenizer.from_pretrained(str(tokenizer_dir)),
    )
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder
