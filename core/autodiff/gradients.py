"""Gradients: what one backward pass produced for each leaf (Burn's ``B::Gradients``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .tensor import Tensor


class Gradients:
    """The gradients of one backward pass, keyed by leaf tensor.

    ``loss.backward()`` returns one; ``GradientsParams.from_grads`` consumes it. Unlike
    ``leaf.grad``, which sums every pass, these are the gradients of this pass alone.
    """

    def __init__(self, pairs: Iterable[tuple[Tensor, Tensor]] = ()) -> None:
        self._by_leaf: dict[int, tuple[Tensor, Tensor]] = {id(leaf): (leaf, g) for leaf, g in pairs}

    def get(self, leaf: Tensor) -> Tensor | None:
        """The gradient for ``leaf``, or None."""
        pair = self._by_leaf.get(id(leaf))
        return pair[1] if pair is not None and pair[0] is leaf else None

    def remove(self, leaf: Tensor) -> Tensor | None:
        """Take the gradient for ``leaf`` out, or None."""
        pair = self._by_leaf.get(id(leaf))
        if pair is None or pair[0] is not leaf:
            return None
        del self._by_leaf[id(leaf)]
        return pair[1]

    def register(self, leaf: Tensor, grad: Tensor) -> None:
        self._by_leaf[id(leaf)] = (leaf, grad)

    def __contains__(self, leaf: object) -> bool:
        pair = self._by_leaf.get(id(leaf))
        return pair is not None and pair[0] is leaf

    def __len__(self) -> int:
        return len(self._by_leaf)

    def is_empty(self) -> bool:
        return not self._by_leaf

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        return iter(list(self._by_leaf.values()))

    def __repr__(self) -> str:
        return f"Gradients({len(self)} leaves)"
