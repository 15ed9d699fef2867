"""What a rank holds of each parameter's gradient, and how a shard's manifest records it.

A parameter's gradient on a rank is either **its own** (a plain tensor: a single process,
or DDP, where each rank holds its own unreduced accumulation mid-window) or **a slice of
one global tensor** (an FSDP2 DTensor placed ``Shard(0)`` on a one-dimensional mesh: rows
``[offset, offset + rows)`` of the global gradient). A shard's record metadata holds,
under ``"torch"``, by column as the manifest holds gradients: ``name``, ``sharded``,
``global_shape`` and ``offset`` (docs/INTEGRATIONS.md, "What each rank writes").

A ``Shard(0)`` slice follows ``torch.chunk``: each of ``n`` ranks holds ``ceil(rows / n)``
rows, the last ones fewer or none (:func:`dim0_slice`); a restore finds which ranks of the
snapshot hold the rows it needs from that rule, then checks it against their manifests.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.tensor import DTensor, Shard

from gradvault.core.autodiff.torch_adapter import param_id_of
from gradvault.core.errors import ManifestError, UnsupportedSetupError
from gradvault.core.records.param_id import ParamId

#: the key of the record metadata that holds the layout, and the layout's version
METADATA_KEY = "torch"
LAYOUT_VERSION = 1


def dim0_slice(length: int, world_size: int, index: int) -> tuple[int, int]:
    """``(offset, rows)`` of rank ``index``'s ``Shard(0)`` slice of ``length`` rows."""
    chunk = -(-length // world_size)
    start = min(index * chunk, length)
    return start, min(start + chunk, length) - start


@dataclass(frozen=True)
class Placement:
    """What this rank holds of one parameter: rows ``[offset, offset + rows)`` of a
    tensor of ``global_shape``, a slice of one global tensor if ``sharded`` (FSDP2), else
    the whole tensor as this rank's own (plain tensors)."""

    name: str
    global_shape: tuple[int, ...]
    sharded: bool
    offset: int
    rows: int

    @property
    def param_id(self) -> ParamId:
        return param_id_of(self.name)

    @property
    def local_shape(self) -> tuple[int, ...]:
        if not self.global_shape:
            return ()
        return (self.rows, *self.global_shape[1:])

    @classmethod
    def of(cls, name: str, param: Any) -> Placement:
        """The placement of ``param`` (a plain tensor, or a DTensor ``Shard(0)`` on a
        one-dimensional mesh); UnsupportedSetupError naming it for any other DTensor."""
        global_shape = tuple(param.shape)
        if not isinstance(param, DTensor):
            return cls(name, global_shape, False, 0, global_shape[0] if global_shape else 0)
        mesh, placements = param.device_mesh, tuple(param.placements)
        if mesh.ndim != 1 or placements != (Shard(0),):
            raise UnsupportedSetupError(
                f"parameter {name!r} is a DTensor placed {placements} on a {mesh.ndim}-d mesh; "
                "gradvault snapshots DTensors placed (Shard(dim=0),) on a one-dimensional "
                "mesh (FSDP2's fully_shard default)"
            )
        coordinate = mesh.get_coordinate()
        if coordinate is None:
            raise UnsupportedSetupError(f"this rank is not in the mesh of parameter {name!r}")
        offset, rows = dim0_slice(global_shape[0], mesh.size(), coordinate[0])
        local = param.to_local()
        if tuple(local.shape) != (rows, *global_shape[1:]):
            raise UnsupportedSetupError(
                f"parameter {name!r}: the local shard has shape {tuple(local.shape)}; "
                f"Shard(0) of {global_shape} on {mesh.size()} ranks gives rank "
                f"{coordinate[0]} {(rows, *global_shape[1:])} (an uneven sharding gradvault "
                "does not know)"
            )
        return cls(name, global_shape, True, offset, rows)


def named_parameters(module: Any) -> Iterator[tuple[str, Any]]:
    """``module``'s parameters by name; a DDP wrapper's names are its module's, so that a
    snapshot of a DDP model restores into the model alone and the other way round."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"expected a torch.nn.Module; got {type(module).__name__}")
    if isinstance(module, torch.nn.parallel.DistributedDataParallel):
        module = module.module
    return module.named_parameters()


def layout_metadata(placements: list[Placement]) -> dict[str, Any]:
    """The ``"torch"`` metadata of a shard that holds ``placements``."""
    return {
        "layout_version": LAYOUT_VERSION,
        "name": [placement.name for placement in placements],
        "sharded": [placement.sharded for placement in placements],
        "global_shape": [list(placement.global_shape) for placement in placements],
        "offset": [placement.offset for placement in placements],
    }


@dataclass(frozen=True)
class StoredGradient:
    """One gradient as a shard's manifest records it: dtype, its stored bytes, and what it
    holds of its parameter."""

    param_id: str
    dtype: str
    nbytes: int
    placement: Placement


def stored_gradients(manifest: dict[str, Any]) -> dict[str, StoredGradient]:
    """A shard manifest's gradients by ParamId text, with their placements.

    A gradient without a ``"torch"`` layout (a snapshot written by other means) is the
    rank's own, whole. ManifestError for a layout that does not fit the gradients.
    """
    gradients = manifest["gradients"]
    shapes = [tuple(shape) for shape in gradients["shape"]]
    layout = (manifest.get("metadata") or {}).get(METADATA_KEY)
    if layout is None:
        placements = [
            Placement(name, shape, False, 0, shape[0] if shape else 0)
            for name, shape in zip(gradients["name"], shapes, strict=True)
        ]
    else:
        try:
            if layout["layout_version"] != LAYOUT_VERSION:
                raise ManifestError(
                    f"snapshot {manifest['id']}: torch layout version "
                    f"{layout['layout_version']!r}; this release reads {LAYOUT_VERSION}"
                )
            by_name = {
                name: (bool(sharded), tuple(int(size) for size in global_shape), int(offset))
                for name, sharded, global_shape, offset in zip(
                    layout["name"],
                    layout["sharded"],
                    layout["global_shape"],
                    layout["offset"],
                    strict=True,
                )
            }
            placements = []
            for name, shape in zip(gradients["name"], shapes, strict=True):
                sharded, global_shape, offset = by_name[name]
                placements.append(
                    Placement(name, global_shape, sharded, offset, shape[0] if shape else 0)
                )
        except (KeyError, TypeError, ValueError) as error:
            raise ManifestError(
                f"snapshot {manifest['id']}: the torch layout in a shard's metadata does not "
                f"fit its gradients ({type(error).__name__}: {error})"
            ) from None
    return {
        param_id: StoredGradient(param_id, dtype, nbytes, placement)
        for param_id, dtype, nbytes, placement in zip(
            gradients["param_id"], gradients["dtype"], gradients["nbytes"], placements, strict=True
        )
    }
