"""The random number generators a training step draws from: capture, restore, JSON.

Python's ``random``, NumPy's global generator, torch's CPU generator and, where present,
every CUDA device's and the MPS generator. The JSON form holds the exact bits (torch's
states as hex), so a restored generator continues the same stream.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gradvault.core.errors import ResumeStateError


@dataclass(frozen=True)
class RngStates:
    """The states of every generator a training step draws from, at one point in time."""

    python: tuple[Any, ...]
    numpy: tuple[Any, ...]
    cpu: torch.Tensor
    cuda: tuple[torch.Tensor, ...]
    mps: torch.Tensor | None

    @classmethod
    def capture(cls) -> RngStates:
        """The generators' states now."""
        cuda = tuple(torch.cuda.get_rng_state_all()) if torch.cuda.is_initialized() else ()
        mps = torch.mps.get_rng_state() if torch.backends.mps.is_available() else None
        numpy = np.random.get_state(legacy=True)
        assert isinstance(numpy, tuple)  # the legacy generator's (NumPy's stubs allow a dict)
        return cls(random.getstate(), numpy, torch.get_rng_state(), cuda, mps)

    def restore(self) -> None:
        """Set every generator to this state."""
        random.setstate(self.python)
        np.random.set_state(self.numpy)
        torch.set_rng_state(self.cpu)
        if self.cuda:
            torch.cuda.set_rng_state_all(self.cuda)
        if self.mps is not None:
            torch.mps.set_rng_state(self.mps)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict with the exact bits of every state."""
        version, internal, gauss = self.python
        kind, keys, position, has_gauss, cached_gaussian = self.numpy
        return {
            "python": {"version": version, "state": list(internal), "gauss": gauss},
            "numpy": {
                "kind": kind,
                "keys": np.asarray(keys, dtype=np.uint32).tolist(),
                "pos": int(position),
                "has_gauss": int(has_gauss),
                "cached_gaussian": float(cached_gaussian).hex(),
            },
            "cpu": _hex(self.cpu),
            "cuda": [_hex(state) for state in self.cuda],
            "mps": None if self.mps is None else _hex(self.mps),
        }

    @classmethod
    def from_json(cls, data: Any, where: str) -> RngStates:
        """The states ``to_json`` wrote; ResumeStateError naming ``where`` if malformed."""
        try:
            python = data["python"]
            numpy_state = data["numpy"]
            return cls(
                python=(python["version"], tuple(python["state"]), python["gauss"]),
                numpy=(
                    numpy_state["kind"],
                    np.asarray(numpy_state["keys"], dtype=np.uint32),
                    int(numpy_state["pos"]),
                    int(numpy_state["has_gauss"]),
                    float.fromhex(numpy_state["cached_gaussian"]),
                ),
                cpu=_tensor(data["cpu"]),
                cuda=tuple(_tensor(state) for state in data["cuda"]),
                mps=None if data["mps"] is None else _tensor(data["mps"]),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ResumeStateError(
                f"{where}: the random generator states are malformed "
                f"({type(error).__name__}: {error})"
            ) from None


@contextlib.contextmanager
def generators_at(states: RngStates) -> Iterator[None]:
    """Run the body with every generator at ``states``, then put back the states of before."""
    before = RngStates.capture()
    states.restore()
    try:
        yield
    finally:
        before.restore()


def _hex(state: torch.Tensor) -> str:
    return state.cpu().numpy().tobytes().hex()


def _tensor(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray.fromhex(text), dtype=torch.uint8)
