"""Process groups for the torch integration's tests: gloo ranks on 127.0.0.1, bounded in time.

:func:`start` runs ``python -m tests.integrations.torch_ranks SPEC``: that process imports
torch and gradvault once, then forks one process per rank (fork, so that four ranks
start in the time of one import), each of which joins a gloo group on a free port of
127.0.0.1 and runs ``<module>.<loop>(rank, world_size, folder, options)`` (``module``:
``tests.integrations.torch_loops`` unless ``start`` is told another). The launcher writes
the ranks' pids to ``pids.json`` in the run's folder at once and their exit codes to
``exit_codes.json`` at the end; it kills every rank still running at its deadline.
"""

from __future__ import annotations

import datetime
import importlib
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
#: how long one launch may run, ranks included
LAUNCH_SECONDS = 120
#: the process group's own timeout (the integration's calls pass shorter ones)
GROUP_TIMEOUT_SECONDS = 60
#: the module whose loops the ranks run unless told another
LOOPS = "tests.integrations.torch_loops"


class Launch:
    """A running launch: its folder, and its ranks' pids once they are started."""

    def __init__(self, process: subprocess.Popen[str], folder: Path, world_size: int) -> None:
        self.process = process
        self.folder = folder
        self.world_size = world_size

    def pids(self) -> list[int]:
        """The ranks' pids (waits for the launcher to write them)."""
        path = self.folder / "pids.json"
        deadline = time.monotonic() + LAUNCH_SECONDS
        while not path.exists():
            assert self.process.poll() is None, self.output()
            assert time.monotonic() < deadline, "the launcher wrote no pids"
            time.sleep(0.05)
        return json.loads(path.read_text())

    def wait_for(self, name: str, count: int) -> None:
        """Wait until ``count`` files named ``name``.<rank> exist in the folder."""
        deadline = time.monotonic() + LAUNCH_SECONDS
        while len(list(self.folder.glob(f"{name}.*"))) < count:
            assert self.process.poll() is None, self.output()
            assert time.monotonic() < deadline, f"no {count} {name} files"
            time.sleep(0.05)

    def output(self) -> str:
        return (self.folder / "launcher.log").read_text(errors="replace")

    def join(self) -> list[int]:
        """The ranks' exit codes (negative: killed by that signal)."""
        try:
            self.process.wait(timeout=LAUNCH_SECONDS + 30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"the launch did not end\n{self.output()}") from None
        codes_path = self.folder / "exit_codes.json"
        assert codes_path.exists(), self.output()
        return json.loads(codes_path.read_text())


def start(
    folder: Path, world_size: int, loop: str, *, module: str = LOOPS, **options: Any
) -> Launch:
    """Start ``world_size`` ranks of ``<module>.<loop>`` with ``options`` (JSON); the
    launcher imports ``module`` once, before it forks the ranks."""
    folder.mkdir(parents=True, exist_ok=True)
    for stale in ("pids.json", "exit_codes.json"):
        (folder / stale).unlink(missing_ok=True)
    spec = {
        "world_size": world_size,
        "module": module,
        "loop": loop,
        "options": options,
        "folder": str(folder),
    }
    log = (folder / "launcher.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.integrations.torch_ranks", json.dumps(spec)],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"},
    )
    log.close()
    return Launch(process, folder, world_size)


def run(
    folder: Path, world_size: int, loop: str, *, module: str = LOOPS, **options: Any
) -> list[int]:
    """Start and join a launch; asserts that every rank exited 0."""
    launch = start(folder, world_size, loop, module=module, **options)
    codes = launch.join()
    assert codes == [0] * world_size, f"exit codes {codes}\n{launch.output()}"
    return codes


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rank_main(rank: int, spec: dict[str, Any], port: int) -> None:
    code = 1
    try:
        import torch
        import torch.distributed as dist

        os.environ.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(spec["world_size"]),
        )
        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo",
            rank=rank,
            world_size=spec["world_size"],
            timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_SECONDS),
        )
        getattr(importlib.import_module(spec["module"]), spec["loop"])(
            rank, spec["world_size"], Path(spec["folder"]), spec["options"]
        )
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # not gloo's teardown, which may wait for ranks that are gone


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    import torch  # noqa: F401 - imported once, before the fork
    import torch.distributed.fsdp  # noqa: F401

    import gradvault.integrations.torch  # noqa: F401

    importlib.import_module(spec["module"])  # once, before the fork

    folder = Path(spec["folder"])
    port = _free_port()
    context = multiprocessing.get_context("fork")
    ranks = [
        context.Process(target=_rank_main, args=(rank, spec, port))
        for rank in range(spec["world_size"])
    ]
    for process in ranks:
        process.start()
    _write_at_once(folder / "pids.json", [process.pid for process in ranks])
    deadline = time.monotonic() + LAUNCH_SECONDS
    for process in ranks:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in ranks:
        if process.exitcode is None:
            print(f"rank pid {process.pid} still running at the deadline: killed", flush=True)
            os.kill(process.pid, signal.SIGKILL)
            process.join()
    _write_at_once(folder / "exit_codes.json", [process.exitcode for process in ranks])
    return 0


def _write_at_once(path: Path, value: object) -> None:
    """``value`` as JSON at ``path``, renamed into place: a reader polling for the file
    never sees it empty or half written."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(value))
    os.replace(partial, path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
