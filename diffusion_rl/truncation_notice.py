"""diffusers warns once per prompt when a prompt is longer than the text encoder's token limit; a run encodes
each of its prompts once, so a run on a model with a short limit (the shipped ShapesWorld generators: 4-20
tokens) printed a dozen such warnings between progress-bar updates. `TruncationNotice` collects them while
prompts are encoded and reports them as one line per run instead.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

_MARKER = "was truncated because"


class _Collect(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.prompts: list[str] = []
        self.message = ""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        if _MARKER in msg:
            self.prompts.append(msg.split(":", 1)[-1].strip())
            self.message = self.message or msg.split(":", 1)[0]
            return False
        return True


class TruncationNotice:
    """Use `with notice.collect(): ...encode...`; the first truncation of a run prints one summary line on
    stderr (how many prompts so far, why), later ones only add to `count`."""

    def __init__(self) -> None:
        self.count = 0
        self.reported = False

    @contextlib.contextmanager
    def collect(self) -> Iterator[None]:
        handlers = [h for name in ("diffusers", "transformers") for h in logging.getLogger(name).handlers]
        root = logging.getLogger()
        handlers += root.handlers
        catcher = _Collect()
        for h in handlers:
            h.addFilter(catcher)
        try:
            yield
        finally:
            for h in handlers:
                h.removeFilter(catcher)
            self.count += len(catcher.prompts)
            if catcher.prompts and not self.reported:
                self.reported = True
                print(f"note: prompts are truncated to the text encoder's limit ({catcher.message.strip()}); "
                      "later truncations in this run are not reported", file=sys.stderr)
