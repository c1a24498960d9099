"""Prompt templates as data: the texts the original reward models and judges were trained or evaluated with
(`vlm`: HPSv3, VideoAlign, EditReward, VLM judges; `edit`: image-editing judges), each citing its source.

They are plain strings and tables, never executed: a template is filled with `str.format` by the family that
owns it, and a card or request cannot supply one (see docs/explanation/security.md).
"""
