"""Where ``make bench`` writes its table: bench/results/, never README.md unless asked.

The make targets' own command lines are taken from ``make -n`` and given to the bench's
``main`` with no benchmark modules (a run of nothing: the writing is what is under test),
its results folder and a copy of README.md in a temporary folder.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from bench.__main__ import main
from bench._timing import Row, interleaved, round_orders

ROOT = Path(__file__).resolve().parents[2]
MARKERS = ("<!-- bench-table -->\n", "<!-- /bench-table -->")


def bench_arguments(target: str) -> list[str]:
    """The arguments ``make TARGET`` gives ``python -m bench`` (its recipe, not run)."""
    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    recipe = subprocess.run(
        ["make", "-n", "-s", "-o", ".venv/.installed-test", "-o", ".venv/.installed", target],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    line = next(line for line in recipe.splitlines() if " -m bench" in line)
    words = shlex.split(line)
    return words[words.index("bench", words.index("-m")) + 1 :]


@pytest.fixture
def readme(tmp_path: Path) -> Path:
    copy = tmp_path / "README.md"
    shutil.copyfile(ROOT / "README.md", copy)
    return copy


def table_of(text: str) -> str:
    return text.split(MARKERS[0], 1)[1].split(MARKERS[1], 1)[0]


def test_make_bench_writes_results_and_leaves_readme_alone(tmp_path: Path, readme: Path) -> None:
    before = readme.read_bytes()
    results = tmp_path / "results"

    main(bench_arguments("bench"), modules=[], results=results, readme=readme)

    assert readme.read_bytes() == before
    written = (results / "latest.md").read_text()
    assert written.startswith("Measured ") and "| figure |" in written
    assert (results / "latest.json").is_file()


def test_make_bench_readme_puts_the_latest_table_into_readme(tmp_path: Path, readme: Path) -> None:
    before = readme.read_text()
    results = tmp_path / "results"
    results.mkdir()
    latest = "Measured 2026-12-04 08:00 UTC on a test machine.\n\n| figure |\n|---|\n"
    (results / "latest.md").write_text(latest)

    main(bench_arguments("bench-readme"), modules=[], results=results, readme=readme)

    after = readme.read_text()
    assert table_of(after) == latest
    assert after.replace(latest, table_of(before)) == before  # nothing else changed


def test_readme_only_without_results_says_what_to_run(tmp_path: Path, readme: Path) -> None:
    before = readme.read_bytes()
    with pytest.raises(
        SystemExit, match=r"no .*latest\.md to put into README\.md: run `make bench`"
    ):
        main(["--readme-only"], results=tmp_path / "results", readme=readme)
    assert readme.read_bytes() == before


def test_a_readme_without_markers_is_refused(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# no table here\n")
    results = tmp_path / "results"
    results.mkdir()
    (results / "latest.md").write_text("Measured ...\n")
    with pytest.raises(SystemExit, match="has no <!-- bench-table --> .* markers"):
        main(["--readme-only"], results=results, readme=readme)
    assert readme.read_text() == "# no table here\n"


@pytest.mark.parametrize(
    ("ours", "shown", "met"),
    [(1.0004, "1.0004", "MISSED"), (0.99996, "1.000", "met"), (1.2, "1.200", "MISSED")],
)
def test_a_ratio_is_shown_on_the_side_of_its_limit_it_lies(ours: float, shown: str, met: str):
    """A ratio that rounds to the limit but misses it shows the digits that say so."""
    row = Row("figure", [ours], "peer", [1.0], "<= 1.0", 1.0)
    cells = row.cells()
    assert cells[3] == shown and cells[5] == met
    if met == "MISSED":
        assert row.ratio_text() == f"ratio {shown}, target <= 1.0"


@pytest.mark.parametrize("count", range(1, 10))
def test_round_orders_balance_places_and_predecessors(count: int) -> None:
    orders = round_orders(count)
    assert len(orders) == (2 * count if count % 2 else count)
    assert all(sorted(order) == list(range(count)) for order in orders)
    places = Counter((side, place) for order in orders for place, side in enumerate(order))
    assert set(places.values()) == {len(orders) // count}
    after = Counter(pair for order in orders for pair in zip(order, order[1:], strict=False))
    if count > 1:
        assert len(after) == count * (count - 1)  # every ordered pair of sides
        assert set(after.values()) == {len(orders) // count}


@pytest.mark.parametrize("count", range(3, 10))
def test_round_orders_never_run_a_side_twice_in_a_row_across_rounds(count: int) -> None:
    orders = round_orders(count)
    # the last side of each round and the first of the next, the design run again after
    boundaries = [(orders[i][-1], orders[(i + 1) % len(orders)][0]) for i in range(len(orders))]
    assert all(last != first for last, first in boundaries)
    assert len(set(boundaries)) == len(boundaries)


def test_round_orders_of_three_sides_meet_each_pair_once_across_rounds() -> None:
    orders = round_orders(3)
    boundaries = {(orders[i][-1], orders[(i + 1) % 6][0]) for i in range(6)}
    assert boundaries == {(a, b) for a in range(3) for b in range(3) if a != b}


def test_interleaved_runs_the_rounds_in_round_orders() -> None:
    ran: list[str] = []
    sides = {name: (lambda name=name: ran.append(name) or 0.0) for name in "ABCDE"}
    samples = interleaved(sides, repeat=12)
    expected = ["ABCDE"[index] for round_ in range(12) for index in round_orders(5)[round_ % 10]]
    assert ran == expected
    assert {name: len(values) for name, values in samples.items()} == dict.fromkeys("ABCDE", 12)
