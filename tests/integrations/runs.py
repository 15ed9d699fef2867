"""Helpers of the Trainer integration tests: a phase in this process, results, comparisons."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.integrations import hf_run


def in_process(*argv: str) -> None:
    """A phase in this process (fp32 only: accelerate keeps one precision per process)."""
    threads = torch.get_num_threads()
    try:
        hf_run.main(list(argv))
    finally:
        torch.set_num_threads(threads)


def result(out: Path) -> dict[str, Any]:
    return torch.load(out / "result.pt", weights_only=False)


def assert_bit_identical(expected: dict[str, Any], found: dict[str, Any]) -> None:
    assert found["global_step"] == expected["global_step"] == hf_run.MAX_STEPS
    assert expected["params"].keys() == found["params"].keys()
    for name, value in expected["params"].items():
        assert torch.equal(value, found["params"][name]), name
    expected_state, found_state = expected["optimizer"]["state"], found["optimizer"]["state"]
    assert expected_state.keys() == found_state.keys()
    for index, slots in expected_state.items():
        for slot, value in slots.items():
            assert torch.equal(value, found_state[index][slot]), (index, slot)
    assert expected["scheduler"] == found["scheduler"]
    assert expected["logged"] == found["logged"]
    assert [entry["step"] for entry in found["logged"]] == [2, 4]
