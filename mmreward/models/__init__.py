"""Built-in reward families, one module each: a `Reward` subclass and the loader that builds it.

Their specs (names, checkpoints, preprocessing cards) are data in `mmreward.catalog`, so importing this
package imports no family; each module imports its heavy dependencies (transformers, open_clip,
onnxruntime, ...) only inside its loader, so loading one reward stays fast and optional extras stay optional.
"""
