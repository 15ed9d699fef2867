"""README.md's code blocks, run as a reader pastes them, in their order.

The README says how: ``make run`` keeps serving 127.0.0.1:8000 in its terminal; every
later block runs in a second terminal, in the repository's folder, with the virtual
environment activated. Here:

- ``sh`` blocks run through ``bash`` with ``set -euo pipefail``, ``python`` blocks through
  this virtual environment's Python, with its ``bin`` first on ``PATH`` (as
  ``. .venv/bin/activate`` puts it) and no ``GRADVAULT_*`` variable set;
- blocks that start a service that stays in the foreground (``make run``, the HTTP quick
  start's ``python -m gradvault.service``) are started in a process group of their own,
  awaited where the README says they serve, and stopped at the end with SIGINT to that
  group, as Ctrl-C in their terminal would;
- the ports 8000 and 8001 are replaced by free ones in every block (the machine may be
  serving either), and ``make run`` gets ``STORE`` in a temporary folder, so the test
  leaves nothing in the repository, and this virtual environment as ``VENV``, taken as
  installed (the test installs nothing); the other blocks run in a temporary folder that
  stands for the repository's (they write ``./snapshots``, ``snap.safetensors`` ...);
- blocks of text (transcripts and output) are not run.

Skipped, each for the reason in ``SKIPPED``: ``make test`` (the whole suite), the Docker
section (a Docker engine and the compose stack), the Hugging Face Trainer example (a
fragment of the reader's own training script), the ``torchrun`` script (ranks of a
process group).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: a block that should finish; a service that should answer
BLOCK_DEADLINE_SECONDS = 120

#: section heading -> why its blocks are not run
SKIPPED = {
    "Resume a Hugging Face Trainer run mid-accumulation": (
        "a fragment of the reader's own Trainer script (model, args, train_dataset); "
        "tests/integrations runs the integration"
    ),
    "Resume a Lightning run mid-accumulation": (
        "a fragment of the reader's own Lightning script (model, datamodule); "
        "tests/integrations runs the integration"
    ),
    "Deployment (Docker)": "needs a Docker engine and the compose stack (make deploy-check)",
    "PyTorch under `torchrun` (DDP, FSDP2)": (
        "a script for torchrun's ranks (a process group); tests/integrations/test_torch_ddp.py "
        "runs the same loop on two gloo ranks, stopped by SIGTERM and resumed"
    ),
}
#: the sections whose blocks run, one entry per block, in the README's order
RUN_IN_ORDER = [
    "The two commands",  # make run; make test left out
    "Quick start (Python)",
    "Many ranks, one snapshot",
    "Quick start (HTTP)",  # the service, on 8001 with tokens
    "Quick start (HTTP)",  # curl
    "Quick start (HTTP)",  # httpx
    "Python client",
    "A trainer on another machine",  # on make run's service
]
#: a line of a run block -> why it is left out
LEFT_OUT = {
    "make test": "runs the whole suite, which this test is part of",
}


@dataclass
class Block:
    language: str
    text: str
    line: int
    section: str

    @property
    def where(self) -> str:
        return f"README.md:{self.line} ({self.section})"


def readme_blocks() -> list[Block]:
    text = README.read_text()
    blocks = []
    for match in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.M | re.S):
        before = text[: match.start()]
        headings = re.findall(r"^##+ (.+)$", before, re.M)
        blocks.append(
            Block(match[1], match[2], before.count("\n") + 1, headings[-1] if headings else "")
        )
    return blocks


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Foreground:
    """A command that stays in the foreground of its terminal, in its own process group."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str], what: str) -> None:
        self.what = what
        self.process = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(stream, lines), daemon=True)
            for stream, lines in ((self.process.stdout, self.out), (self.process.stderr, self.err))
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream, lines: list[str]) -> None:
        for line in stream:
            lines.append(line)

    def output(self) -> str:
        return "".join(self.out) + "".join(self.err)

    def wait_for(self, ready, description: str) -> None:
        deadline = time.monotonic() + BLOCK_DEADLINE_SECONDS
        while not ready():
            if self.process.poll() is not None:
                raise AssertionError(f"{self.what} exited before {description}:\n{self.output()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.what}: no {description}:\n{self.output()}")
            time.sleep(0.1)

    def interrupt(self) -> int:
        """Ctrl-C: SIGINT to its process group; its exit status."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(BLOCK_DEADLINE_SECONDS)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        for reader in self._readers:
            reader.join(BLOCK_DEADLINE_SECONDS)
        return self.process.returncode


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def test_readme_blocks_run_in_order(tmp_path: Path) -> None:
    ports = {"8000": str(free_port()), "8001": str(free_port())}
    folder = tmp_path / "repository-folder"
    folder.mkdir()
    venv_bin = str(Path(sys.executable).parent)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GRADVAULT_")}
    environment.update(
        PATH=f"{venv_bin}:{environment['PATH']}",
        VIRTUAL_ENV=str(Path(venv_bin).parent),
        PYTHONUNBUFFERED="1",
    )

    def with_ports(text: str) -> str:
        return re.sub(r"\b(8000|8001)\b", lambda m: ports[m[1]], text)

    foreground: list[Foreground] = []
    make_run: Foreground | None = None
    ran: list[Block] = []
    skipped: set[tuple[str, str]] = set()

    def wait_for_make_run() -> None:
        assert make_run is not None, "a block uses make run's service before make run"
        make_run.wait_for(
            lambda: any(line.startswith("the service keeps running") for line in make_run.out),
            "'the service keeps running' line",
        )

    try:
        for number, block in enumerate(readme_blocks()):
            if block.language not in ("sh", "bash", "python"):
                continue  # a transcript or output
            if block.section in SKIPPED:
                skipped.add((block.section, SKIPPED[block.section]))
                continue
            lines = []
            for line in block.text.splitlines():
                left_out = next((key for key in LEFT_OUT if line.startswith(key)), None)
                if left_out is None:
                    lines.append(line)
                else:
                    skipped.add((left_out, LEFT_OUT[left_out]))
            text = "\n".join(lines) + "\n"
            if not text.strip():
                continue

            if block.language != "python" and re.search(r"^make run\b", text, re.M):
                assert text.strip().startswith("make run"), block.where
                venv = Path(sys.executable).parent.parent
                make_run = Foreground(
                    # this environment, taken as installed: make installs nothing here
                    ["make", "--no-print-directory", f"VENV={venv}", "-o", f"{venv}/.installed"]
                    + ["run"],
                    cwd=ROOT,
                    env=dict(environment, PORT=ports["8000"], STORE=str(tmp_path / "store")),
                    what=f"make run ({block.where})",
                )
                foreground.append(make_run)
                ran.append(block)
                continue
            if ports["8000"] in with_ports(text):
                wait_for_make_run()
            if block.language != "python" and "python -m gradvault.service" in text:
                script = folder / f"block{number}.sh"
                script.write_text("set -euo pipefail\n" + with_ports(text))
                service = Foreground(["bash", str(script)], folder, environment, block.where)
                foreground.append(service)
                service.wait_for(
                    lambda: answers(f"http://127.0.0.1:{ports['8001']}/healthz"),
                    "answer on /healthz",
                )
                ran.append(block)
                continue

            if block.language == "python":
                script = folder / f"block{number}.py"
                script.write_text(with_ports(text))
                argv = [sys.executable, str(script)]
            else:
                script = folder / f"block{number}.sh"
                script.write_text("set -euo pipefail\n" + with_ports(text))
                argv = ["bash", str(script)]
            done = subprocess.run(
                argv,
                cwd=folder,
                env=environment,
                capture_output=True,
                text=True,
                timeout=BLOCK_DEADLINE_SECONDS,
                check=False,
            )
            assert done.returncode == 0, (
                f"{block.where} failed with {done.returncode}:\n{text}\n"
                f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
            )
            ran.append(block)
    finally:
        codes = [(service.what, service.interrupt()) for service in reversed(foreground)]

    assert make_run is not None, "README.md has no make run block"
    out = make_run.output()
    assert "bit-identical: yes" in out and "the service keeps running" in out, out
    for what, code in codes:
        # make itself dies of the terminal's SIGINT too (docs/CLI.md, make run)
        assert code in (0, -signal.SIGINT), f"{what} exited with {code}"
    for service in foreground:
        assert "Traceback" not in service.output(), service.output()
    assert skipped == {*SKIPPED.items(), *LEFT_OUT.items()}, skipped
    assert [block.section for block in ran] == RUN_IN_ORDER, [block.where for block in ran]


# ---------------------------------------------------------------- what the prose says


def prose_paragraphs() -> list[tuple[str, bool]]:
    """README.md's paragraphs outside code blocks, tables, headings and lists, each with
    whether it comes right after a code block (where it may go on with the sentence before)."""
    chunks = re.split(r"^```.*?^```\n", README.read_text(), flags=re.M | re.S)
    found = []
    for chunk in chunks:
        for index, paragraph in enumerate(part.strip() for part in re.split(r"\n\s*\n", chunk)):
            if paragraph and not paragraph.startswith(("#", "|", "- ", "<!--", "![")):
                found.append((paragraph, index == 0))
    return found


#: names that start a sentence in lower case
LOWER_CASE_NAMES = ("gradvault", "docs/")


def test_no_paragraph_is_cut_off_or_repeated() -> None:
    paragraphs = prose_paragraphs()
    cut_off = [
        paragraph[:80]
        for paragraph, after_code in paragraphs
        if paragraph[0].islower() and not after_code and not paragraph.startswith(LOWER_CASE_NAMES)
    ]
    assert cut_off == [], "paragraphs starting mid-sentence"
    lines = [
        line.strip()
        for paragraph, _ in paragraphs
        for line in paragraph.splitlines()
        if len(line.strip()) > 40
    ]
    repeated = sorted({line for line in lines if lines.count(line) > 1})
    assert repeated == [], "lines of prose that appear twice"


def test_the_folders_it_names_hold_what_it_says() -> None:
    """``- `a` and `b` (folder `f/`): ...``: a module a is the package of folder f, a file
    a lies in f."""
    found = re.findall(
        r"^- ((?:`[^`]+`(?:,| and)? ?)+)\(folder `([^`]+)/`", README.read_text(), re.M
    )
    assert len(found) >= 5, found
    missing = []
    for names, folder in found:
        assert (ROOT / folder).is_dir(), folder
        for name in re.findall(r"`([^`]+)`", names):
            if not name.startswith("gradvault.") and not (ROOT / folder / name).exists():
                missing.append(f"{name} in {folder}/")
    assert missing == []


def test_run_page_figures_are_the_tables() -> None:
    """The paragraph on the run page quotes the figures of the table's run
    (bench/results/latest.json), no other."""
    import json

    latest = json.loads((ROOT / "bench" / "results" / "latest.json").read_text())
    table = {}
    for row in latest["rows"]:
        if row["figure"].startswith("run page"):
            table[row["figure"]] = row
    seconds = {row["ours_median"] for row in table.values()} | {
        row["peer_median"] for row in table.values()
    }
    paragraph = next(p for p, _ in prose_paragraphs() if p.startswith("The run page with 10,000"))
    quoted = [float(n) / 1000 for n in re.findall(r"([\d.]+) ms", paragraph)]
    quoted += [float(n) for n in re.findall(r"([\d.]+) s\b", paragraph)]
    assert quoted, paragraph
    assert [
        figure for figure in quoted if not any(abs(figure - s) < 0.006 for s in seconds)
    ] == [], f"figures not in {latest['date']}'s table: {paragraph}"


def test_the_benchmark_table_is_the_latest_results() -> None:
    text = README.read_text()
    table = text.split("<!-- bench-table -->\n", 1)[1].split("<!-- /bench-table -->", 1)[0]
    assert table == (ROOT / "bench" / "results" / "latest.md").read_text()
