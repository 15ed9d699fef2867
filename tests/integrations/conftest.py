"""The integration tests never reach a model hub: everything they train is built here."""

from __future__ import annotations

import os
from typing import Any

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"


@pytest.fixture(scope="package")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The uninterrupted fp32 run with the stock Trainer (transformers imported only here)."""
    pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")
    from tests.integrations.runs import in_process, result  # noqa: PLC0415 - needs the extra

    out = tmp_path_factory.mktemp("baseline")
    in_process("baseline", "--out", str(out))
    return result(out)
