"""docs/supported_models.md is what scripts/models_table.py writes from the adapter registry (issue 29 item 6)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_supported_models_page_is_up_to_date_with_the_registry():
    from diffusion_rl.adapters import PIPELINE_ADAPTERS

    spec = importlib.util.spec_from_file_location("models_table", ROOT / "scripts" / "models_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    page = (ROOT / "docs" / "supported_models.md").read_text()
    assert page == module.build(), "docs/supported_models.md is stale: run python scripts/models_table.py"
    for name in PIPELINE_ADAPTERS:  # every registered pipeline class has its row
        assert f"| `{name}` |" in page
