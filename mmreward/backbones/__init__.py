"""Model layers several reward families share: the CLIP towers (`clip`), Qwen-VL loading, batching and
preprocessing (`qwen_vl`) and the tiny seeded Qwen-VL builders tests and demos use (`tiny_qwen_vl`).

A family module (`mmreward.models.<family>`) imports these; they import no family.
"""
