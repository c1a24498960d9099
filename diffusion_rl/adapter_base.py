"""Moved to `diffusion_rl.adapters.base` (issue 29); this name stays so that older imports keep working.

The helpers became public there: `_prompt_list` is `prompt_list`, `_flow_schedule` is `flow_schedule`.
"""

from diffusion_rl.adapters.base import (  # noqa: F401 - re-exported for older imports
    DTYPES,
    PipelineAdapter,
    PromptEmbeds,
    Schedule,
    VideoAdapter,
    decode_chunked,
    flow_schedule,
    prompt_list,
)

_prompt_list = prompt_list  # the old private names
_flow_schedule = flow_schedule
