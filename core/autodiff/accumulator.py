"""GradientsAccumulator: sums GradientsParams over micro-batches (Burn's accumulator)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ParamIdMismatchError, ShapeMismatchError
from .gradients_params import GradientsParams

if TYPE_CHECKING:
    from .nn.module import Module


class GradientsAccumulator:
    """Sums GradientsParams over micro-batches (Burn's ``GradientsAccumulator``)."""

    def __init__(self) -> None:
        self._sum = GradientsParams()

    def accumulate(self, module: Module, grads: GradientsParams) -> None:
        """Add ``module``'s gradients from ``grads`` into the running sum.

        Every gradient in ``grads`` must belong to one of ``module``'s parameters: a
        ParamId the module does not have (gradients restored before the model record was
        loaded) raises ParamIdMismatchError naming the ids, before anything is added.
        """
        params = list(module.named_parameters())
        own_ids = {param.id for _, param in params}
        foreign = [pid for pid in grads if pid not in own_ids]
        if foreign:
            listed = ", ".join(f"{pid} ({grads.name(pid)!r})" for pid in foreign)
            raise ParamIdMismatchError(
                f"{len(foreign)} gradient(s) belong to no parameter of the module: {listed}; "
                "load the model record first (module.load_record) so the ids match, or "
                "restore with GradientsParams.from_record(record, module=..., match='name')"
            )
        for name, param in params:
            grad = grads.get(param.id)
            if grad is None:
                continue
            current = self._sum.get(param.id)
            if current is None:
                # shares the buffer until either side is written (copied if grad has aliases)
                self._sum.register(param.id, grad.twin(), name=name)
            else:
                if current.shape != grad.shape:
                    raise ShapeMismatchError(
                        f"gradient for param {param.id} ({name!r}) has shape {grad.shape}; "
                        f"the running sum has {current.shape}"
                    )
                current.accumulate_(grad)

    def current(self) -> GradientsParams:
        """The running sum so far, without resetting it (what a mid-window snapshot takes)."""
        view = GradientsParams()
        for pid, grad in self._sum.items():
            view.register(pid, grad, name=self._sum.name(pid))
        return view

    def grads(self) -> GradientsParams:
        """The sum; the accumulator starts again from empty."""
        out, self._sum = self._sum, GradientsParams()
        return out

    def __len__(self) -> int:
        return len(self._sum)
