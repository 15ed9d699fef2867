"""Training loops the torch integration's tests run on each rank (``torch_ranks`` starts them).

A tiny model with dropout, gradient accumulation over ``ACCUM`` micro-batches, AdamW,
``STEPS`` optimizer steps; each micro-batch's data comes from its own seed (step,
micro-batch, rank), so that a resumed run sees what an uninterrupted one saw, and the
dropout draws from each rank's generator, which the loops save and put back. Results are
``torch.save``d into the launch's folder, one file per rank.
"""

from __future__ import annotations

import copy
import signal
import threading
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from gradvault.integrations import torch as gv_torch

ACCUM = 4
STEPS = 2
#: how long a paused rank waits for its SIGTERM
PAUSE_SECONDS = 60
#: the timeout the loops give the integration's calls
CALL_TIMEOUT_SECONDS = 20


class Net(nn.Module):
    """10 hidden rows: 3, 3, 3, 1 on four ranks; the 3-row layer leaves one rank empty."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(6, 10)
        self.dropout = nn.Dropout(0.25)
        self.out = nn.Linear(10, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.dropout(torch.relu(self.hidden(x))))


def batch(step: int, micro: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(10_000 * step + 100 * micro + rank)
    return torch.randn(5, 6, generator=generator), torch.randint(0, 3, (5,), generator=generator)


def micro_batch(model: nn.Module, step: int, micro: int, rank: int) -> float:
    x, y = batch(step, micro, rank)
    loss = nn.functional.cross_entropy(model(x), y) / ACCUM
    loss.backward()
    return loss.item()


def local(value: Any) -> Any:
    return value.to_local() if isinstance(value, DTensor) else value


def outcome(model: nn.Module, optimizer: torch.optim.Optimizer, losses: list[float]) -> dict:
    """This rank's parameters, optimizer state (local shards) and losses."""
    state = optimizer.state_dict()["state"]
    return {
        "params": {name: local(param).detach().clone() for name, param in model.named_parameters()},
        "optimizer": {
            index: {slot: local(value).clone() for slot, value in slots.items()}
            for index, slots in state.items()
        },
        "losses": list(losses),
    }


class StopSignal:
    """SIGTERM noted; every rank stops after the micro-batch in which any rank got one."""

    def __init__(self) -> None:
        self.received = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: self.received.set())

    def agreed(self) -> bool:
        flag = torch.tensor([1 if self.received.is_set() else 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


def _store(options: dict[str, Any]) -> dict[str, Any]:
    """The calls' target options: a store's ``store_options``, a service's ``token``."""
    return {
        "store_options": options.get("store_options"),
        "token": options.get("token"),
        "timeout": CALL_TIMEOUT_SECONDS,
    }


def ddp(rank: int, world_size: int, folder: Path, options: dict[str, Any]) -> None:
    """DDP with ``no_sync`` windows; stops on SIGTERM mid-window with a snapshot and the
    loop's own state, and resumes from them (``options["resume"]``)."""
    store = options["store"]
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    losses: list[float] = []
    start = (0, 0)
    resume = options.get("resume", False)
    if resume:
        state = torch.load(folder / f"state.{rank}.pt", weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    wrapped = nn.parallel.DistributedDataParallel(model)
    torch.manual_seed(1000 + rank)
    if resume:
        gv_torch.restore(wrapped, store, state["snapshot_id"], **_store(options))
        torch.set_rng_state(state["rng"])
        losses, start = state["losses"], (state["next"][0], state["next"][1])
    stop = StopSignal()
    for step in range(start[0], STEPS):
        for micro in range(start[1] if step == start[0] else 0, ACCUM):
            last = micro == ACCUM - 1
            with nullcontext() if last else wrapped.no_sync():
                losses.append(micro_batch(wrapped, step, micro, rank))
            if options.get("pause_at") == [step, micro]:
                (folder / f"ready.{rank}").touch()
                stop.received.wait(PAUSE_SECONDS)
            if stop.agreed() and not last:
                info = gv_torch.snapshot(wrapped, store, run="ddp", step=step, **_store(options))
                torch.save(
                    {
                        "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "rng": torch.get_rng_state(),
                        "losses": losses,
                        "next": [step, micro + 1],
                        "snapshot_id": info.id,
                        "grads": {n: p.grad.clone() for n, p in model.named_parameters()},
                    },
                    folder / f"state.{rank}.pt",
                )
                return
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.save(outcome(model, optimizer, losses), folder / f"result.{rank}.pt")


def sharded_net(world_size: int) -> Net:
    mesh = init_device_mesh("cpu", (world_size,))
    torch.manual_seed(0)
    model = Net()
    fully_shard(model.hidden, mesh=mesh)
    fully_shard(model.out, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _train(
    model: Net,
    optimizer: torch.optim.Optimizer,
    rank: int,
    losses: list[float],
    start: tuple[int, int],
    at_snapshot: Any = None,
    at_window_end: Any = None,
) -> None:
    for step in range(start[0], STEPS):
        for micro in range(start[1] if step == start[0] else 0, ACCUM):
            losses.append(micro_batch(model, step, micro, rank))
            if at_snapshot is not None and (step, micro) == (1, 1):
                at_snapshot()
        if at_window_end is not None and step == 1:
            at_window_end()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def fsdp(rank: int, world_size: int, folder: Path, options: dict[str, Any]) -> None:
    """FSDP2: a snapshot mid-window, the rest of the run (the reference), then, in this
    process, the state at the snapshot put back with its gradients from the store and the
    run finished again (the resumed); ``options["other"]``: a snapshot of another world
    size restored onto this one."""
    store = options["store"]
    model = sharded_net(world_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    saved: dict[str, Any] = {}
    found: dict[str, Any] = {}
    if options.get("train", True):
        torch.manual_seed(1000 + rank)
        losses: list[float] = []

        def at_snapshot() -> None:
            # the loop goes on at once; the shard is written while the window continues
            started = gv_torch.start_snapshot(model, store, run="fsdp", step=1, **_store(options))
            full = {name: param.grad.full_tensor() for name, param in model.named_parameters()}
            if rank == 0:
                torch.save(full, folder / "full.pt")
                (folder / "snapshot_id").write_text(started.id)
            saved.update(
                started=started,
                model={k: v.detach().clone() for k, v in model.state_dict().items()},
                optimizer=copy.deepcopy(optimizer.state_dict()),
                rng=torch.get_rng_state(),
                losses=list(losses),
                grads={n: local(p.grad).clone() for n, p in model.named_parameters()},
            )

        def at_window_end() -> None:  # two more micro-batches later, every rank
            saved["info"] = saved["started"].result()
            saved["id"] = saved["info"].id

        _train(model, optimizer, rank, losses, (0, 0), at_snapshot, at_window_end)
        found["reference"] = outcome(model, optimizer, losses)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        optimizer.zero_grad(set_to_none=True)
        gv_torch.restore(model, store, saved["id"], **_store(options))
        found["restored"] = {n: local(p.grad).clone() for n, p in model.named_parameters()}
        found["captured"] = saved["grads"]
        found["world_size"] = saved["info"].world_size
        torch.set_rng_state(saved["rng"])
        losses = list(saved["losses"])
        _train(model, optimizer, rank, losses, (1, 2))
        found["resumed"] = outcome(model, optimizer, losses)
    if options.get("refuse_plain"):
        # each rank's own (plain, unreduced) gradients: no exact answer for DTensor slices
        plain = Net()
        micro_batch(plain, 0, 0, rank)
        info = gv_torch.snapshot(plain, store, run="plain", step=0, **_store(options))
        micro_batch(model, 0, 0, rank)  # gradients the refused restore must leave alone
        before = {n: local(p.grad).clone() for n, p in model.named_parameters()}
        try:
            gv_torch.restore(model, store, info.id, **_store(options))
        except gv_torch.UnsupportedSetupError as error:
            found["refused"] = str(error)
        found["unchanged"] = all(
            torch.equal(local(p.grad), before[n]) for n, p in model.named_parameters()
        )
        optimizer.zero_grad(set_to_none=True)
    other = options.get("other")
    if other:
        optimizer.zero_grad(set_to_none=True)
        gv_torch.restore(model, store, other, **_store(options))
        found["other"] = {
            name: {
                "local": local(param.grad).clone(),
                "offset": gv_torch_offset(param),
                "placements": [str(p) for p in param.grad.placements],
            }
            for name, param in model.named_parameters()
        }
    torch.save(found, folder / f"result.{rank}.pt")


def gv_torch_offset(param: DTensor) -> int:
    """The first global row of this rank's shard, from the mesh and torch.chunk's rule."""
    rows = param.shape[0]
    chunk = -(-rows // param.device_mesh.size())
    return min(param.device_mesh.get_coordinate()[0] * chunk, rows)


def kill_mid_snapshot(rank: int, world_size: int, folder: Path, options: dict[str, Any]) -> None:
    """Rank 1 is SIGKILLed once its chunks are written, before its shard is published;
    rank 0's snapshot call must fail with DistributedSnapshotError."""
    _faulty_snapshot(rank, folder, options, kill_rank=1)


def stuck_write(rank: int, world_size: int, folder: Path, options: dict[str, Any]) -> None:
    """Rank 1's write never finishes (a store that does not answer); both ranks' calls
    must fail within the timeout."""
    _faulty_snapshot(rank, folder, options, kill_rank=None, stuck_rank=1)


def absent_rank(rank: int, world_size: int, folder: Path, options: dict[str, Any]) -> None:
    """Rank 1 never calls snapshot (alive, busy elsewhere, or exited); rank 0's call must
    fail with DistributedSnapshotError after the call's timeout."""
    if rank == 1:
        if options.get("exit"):
            return
        for _ in range(PAUSE_SECONDS * 20):
            if (folder / "done.0").exists():
                return
            threading.Event().wait(0.05)
        return
    _faulty_snapshot(rank, folder, options, kill_rank=None)


def _faulty_snapshot(
    rank: int,
    folder: Path,
    options: dict[str, Any],
    kill_rank: int | None,
    stuck_rank: int | None = None,
) -> None:
    torch.manual_seed(0)
    model = Net()  # each rank's own gradients, as DDP's mid-window (DDP's set-up is collective)
    micro_batch(model, 0, 0, rank)
    if rank == kill_rank:
        import os

        from gradvault.core.store import _local_writer, _s3  # the step after the chunks are written

        def killed(*args: Any, **kwargs: Any) -> Any:
            os.kill(os.getpid(), signal.SIGKILL)

        _local_writer.publish_shard = killed  # type: ignore[assignment]
        _s3.publish_shard = killed  # type: ignore[assignment]
    if rank == stuck_rank:
        import asyncio

        from gradvault.core.store import _local_writer

        async def stuck(*args: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(PAUSE_SECONDS)

        _local_writer.publish_shard = stuck  # type: ignore[assignment]
    outcome_text = "returned"
    try:
        gv_torch.snapshot(
            model,
            options["store"],
            run="fault",
            step=0,
            timeout=options["timeout"],
            store_options=options.get("store_options"),
        )
    except gv_torch.DistributedSnapshotError as error:
        outcome_text = f"DistributedSnapshotError: {error}"
    (folder / f"outcome.{rank}").write_text(outcome_text)
    (folder / f"done.{rank}").touch()


def one_rank_fails(rank: int, world_size: int, folder: Path, options: dict[str, Any]) -> None:
    """Rank 1's own part of the start fails (tags it cannot hold); both ranks must raise:
    rank 1 its own error, rank 0 DistributedSnapshotError quoting it."""
    torch.manual_seed(0)
    model = Net()
    micro_batch(model, 0, 0, rank)
    tags: Any = {"k": "v"} if rank == 0 else {"k": 1}
    try:
        gv_torch.snapshot(
            model, options["store"], run="r", step=0, tags=tags, timeout=options["timeout"]
        )
        text = "returned"
    except Exception as error:  # noqa: BLE001 - the outcome is what the test reads
        text = f"{type(error).__name__}: {error}"
    (folder / f"outcome.{rank}").write_text(text)


def service_refused(rank: int, world_size: int, folder: Path, options: dict[str, Any]) -> None:
    """Through the service: rank 1's token may only read (rank 0's shard goes in, rank 1's
    is refused), then every rank's token is unknown; each call's outcome is written."""
    torch.manual_seed(0)
    model = Net()
    micro_batch(model, 0, 0, rank)
    tokens = {
        "read_only": options["token"] if rank == 0 else options["read_token"],
        "unknown": "no-such-token",
    }
    for case, token in tokens.items():
        try:
            gv_torch.snapshot(
                model,
                options["store"],
                run=options["run"],
                step=0,
                token=token,
                timeout=options["timeout"],
            )
            text = "returned"
        except Exception as error:  # noqa: BLE001 - the outcome is what the test reads
            text = f"{type(error).__name__}: {error}"
        (folder / f"{case}.{rank}").write_text(text)
