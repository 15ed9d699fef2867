"""The commit-cost bench's split of gradvault's CPU by thread (the CPU rows' note)."""

from __future__ import annotations

import threading
import time

import pytest

from bench.commit_cost import OTHER_THREADS, _cpu_by_thread, split_by_thread, thread_role


@pytest.mark.parametrize(
    ("name", "role"),
    [
        ("gradvault-commit_0", "recorder's commit thread"),
        ("gradvault-store_0", "store"),
        ("gradvault-store_11", "store"),
        ("gradvault-direct_0", "O_DIRECT writer"),
        ("gradvault-recorder", "recorder loop"),
        ("gradvault-fsync_3", "fsync threads"),
        ("MainThread", "caller"),
        ("Thread-7 (worker)", OTHER_THREADS),
        ("asyncio_0", OTHER_THREADS),
    ],
)
def test_threads_are_named_by_their_role(name: str, role: str) -> None:
    assert thread_role(name) == role


def test_split_counts_each_thread_from_its_reading_before() -> None:
    before = {1: ("store", 10.000), 2: ("caller", 5.000), 3: ("store", 7.000)}
    after = {
        1: ("store", 10.003),
        2: ("caller", 5.001),
        3: ("store", 7.001),
        4: ("O_DIRECT writer", 0.0005),
    }
    spent = split_by_thread(before, after, total=0.0060)
    assert spent["store"] == pytest.approx(0.004)
    assert spent["caller"] == pytest.approx(0.001)
    # a thread started during the commit counts its whole clock
    assert spent["O_DIRECT writer"] == pytest.approx(0.0005)
    # what the process spent beyond the threads Python knows of
    assert spent[OTHER_THREADS] == pytest.approx(0.0005)
    assert sum(spent.values()) == pytest.approx(0.0060)


def test_split_never_gives_other_threads_less_than_nothing() -> None:
    # the process's clock is read a moment before the threads' clocks: a little over
    spent = split_by_thread({1: ("store", 1.0)}, {1: ("store", 1.002)}, total=0.0019)
    assert spent[OTHER_THREADS] == 0.0
    assert spent["store"] == pytest.approx(0.002)


def test_a_busy_thread_is_read_under_its_role() -> None:
    started, stop = threading.Event(), threading.Event()

    def spin() -> None:
        started.set()
        while not stop.is_set():
            sum(range(1000))

    thread = threading.Thread(target=spin, name="gradvault-store_99", daemon=True)
    thread.start()
    started.wait(10)
    try:
        before = _cpu_by_thread()
        assert before[thread.ident][0] == "store"
        deadline = time.monotonic() + 30  # a bound on the wait, not a figure under test
        moved = False
        while not moved and time.monotonic() < deadline:
            moved = _cpu_by_thread()[thread.ident][1] > before[thread.ident][1]
        assert moved, "the spinning thread's CPU clock did not move"
    finally:
        stop.set()
        thread.join(10)
