"""An MLP trained with the core's autodiff and plain SGD: the loss falls."""

from __future__ import annotations

import numpy as np

import gradvault.core as gv
from gradvault.client.cli.demo_task import Task, train


def test_mlp_trains_with_hand_written_sgd() -> None:
    """Two hidden ReLU layers, cross-entropy, SGD written against the core's tensors."""
    gv.manual_seed(0)
    task = Task.make(samples=512, in_features=16, classes=3, seed=1)
    model = gv.MLP(16, [32, 32], 3)
    x, y = gv.tensor(task.features), gv.tensor(task.labels)
    losses = []
    for _ in range(60):
        loss = gv.cross_entropy(model(x), y)
        loss.backward()
        with gv.no_grad():
            for p in model.parameters():
                p -= 0.5 * p.grad  # plain SGD on the leaves, as one would write it in PyTorch
        model.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    accuracy = (model(x).argmax(dim=1).numpy() == task.labels).mean()
    assert accuracy > 0.8


def test_demo_job_loss_falls() -> None:
    _, losses = train(steps=30)
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])


def test_demo_main_snapshots_mid_window_and_restores_bit_identical(tmp_path, capsys) -> None:
    from gradvault.client.cli.demo_task import main

    main(["--steps", "12", "--every", "5", "--store", str(tmp_path / "store")])
    out = capsys.readouterr().out
    restored = [line for line in out.splitlines() if line.startswith("restored ")]
    assert len(restored) == 3  # steps 0, 5 and 10, all kept
    assert all(line.endswith("bit-identical=True") for line in restored)
