"""One SGD training step of an MLP with 1024-wide layers: gradvault's core against PyTorch."""

from __future__ import annotations

import numpy as np

from bench._timing import Row, best_time, print_rows

WIDTH, BATCH, CLASSES = 1024, 256, 10


def _gradvault_step() -> object:
    import gradvault.core as gv

    gv.manual_seed(0)
    model = gv.MLP(WIDTH, [WIDTH, WIDTH], CLASSES)
    optimizer = gv.SGD()
    rng = np.random.default_rng(0)
    x = gv.tensor(rng.standard_normal((BATCH, WIDTH)).astype(np.float32))
    y = gv.tensor(rng.integers(0, CLASSES, BATCH))

    def step() -> None:
        loss = gv.cross_entropy(model(x), y)
        grads = gv.GradientsParams.from_grads(loss.backward(), model)
        optimizer.step(0.01, model, grads)
        model.zero_grad()

    return step


def _torch_step() -> object:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, WIDTH),
        torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, WIDTH),
        torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, CLASSES),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((BATCH, WIDTH)).astype(np.float32))
    y = torch.from_numpy(rng.integers(0, CLASSES, BATCH))

    def step() -> None:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def run() -> list[Row]:
    try:
        import torch  # noqa: F401
    except ImportError:
        print("mlp_step: torch is not installed; skipped")
        return []
    ours = best_time(_gradvault_step(), repeat=10, warmup=2)
    peer = best_time(_torch_step(), repeat=10, warmup=2)
    rows = [
        Row(f"MLP step {WIDTH}-wide, batch {BATCH}, SGD", ours, "torch CPU step", peer, "<= 2.0")
    ]
    print_rows("Autodiff: one training step", rows)
    return rows


if __name__ == "__main__":
    run()
