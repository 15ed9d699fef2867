"""The commit-cost bench's whole-machine CPU row: the busy time of /proc/stat."""

from __future__ import annotations

import os
import statistics
import time

import pytest

from bench.commit_cost import DIRECT, _machine_busy_seconds, busy_seconds, machine_row


def test_busy_time_is_user_nice_system_and_interrupts() -> None:
    # cpu user nice system idle iowait irq softirq steal guest guest_nice
    line = "cpu  100 5 50 1000 20 3 7 9 4 0\n"
    assert busy_seconds(line, 100) == pytest.approx((100 + 5 + 50 + 3 + 7) / 100)
    assert busy_seconds(line, 250) == pytest.approx((100 + 5 + 50 + 3 + 7) / 250)


@pytest.mark.parametrize("line", ["cpu0 1 2 3 4 5 6 7 8\n", "intr 12345 0 0\n", ""])
def test_a_line_that_is_not_the_machine_total_is_refused(line: str) -> None:
    with pytest.raises(ValueError, match="not the first line of /proc/stat"):
        busy_seconds(line, 100)


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="no /proc/stat here")
def test_the_machine_busy_time_counts_this_process_spinning() -> None:
    before = _machine_busy_seconds()
    spin_until = time.thread_time() + 0.3
    while time.thread_time() < spin_until:
        pass
    after = _machine_busy_seconds()
    assert before is not None and after is not None
    # 0.3 s of this thread's CPU is at least a few of the kernel's ticks of busy time
    assert after - before >= 0.1


def test_the_row_has_no_target_and_notes_the_process_cpu() -> None:
    samples = {
        "gradvault": ([0.0026, 0.0028, 0.0027], [0.0024, 0.0025, 0.0026]),
        DIRECT: ([0.0018, 0.0017, 0.0018], [0.0009, 0.0008, 0.0009]),
    }
    row = machine_row("commit", samples)
    assert row.figure == "commit, CPU per commit, whole machine"
    assert row.peer_name == DIRECT
    assert row.met is None and row.limit is None
    assert row.ratio == pytest.approx(0.0027 / 0.0018)
    assert "gradvault 2.50 ms, the write 0.90 ms" in row.note
    assert f"ratio {statistics.median([24 / 9, 25 / 8, 26 / 9]):.3f}" in row.note
