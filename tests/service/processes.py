"""ServiceProcess: ``python -m gradvault.service`` in a subprocess on 127.0.0.1 (a free port,
or the one given)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from typing import Any

STARTUP_DEADLINE_SECONDS = 60
_LISTENING = re.compile(r"Uvicorn running on http://127\.0\.0\.1:(\d+)")


class ServiceProcess:
    """The service as its own process; ``base_url`` once started, ``stop()`` to end it."""

    def __init__(
        self,
        store: str,
        *,
        store_options: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        python: list[str] | None = None,
        port: int = 0,
    ) -> None:
        environment = {k: v for k, v in os.environ.items() if not k.startswith("GRADVAULT_")}
        environment["GRADVAULT_STORE_OPTIONS"] = json.dumps(store_options or {})
        environment.update(env or {})
        command = [*(python or [sys.executable]), "-m", "gradvault.service"]
        self._process = subprocess.Popen(
            [*command, "--store", store, "--host", "127.0.0.1", "--port", str(port)],
            env=environment,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.log: list[str] = []
        self._port: int | None = None
        self._listening = threading.Event()
        self._reader = threading.Thread(target=self._read_log, daemon=True)
        self._reader.start()
        if not self._listening.wait(STARTUP_DEADLINE_SECONDS) or self._port is None:
            self.stop()
            raise RuntimeError("the service did not start:\n" + "".join(self.log))

    def _read_log(self) -> None:
        assert self._process.stderr is not None
        for line in self._process.stderr:
            self.log.append(line)
            match = _LISTENING.search(line)
            if match and self._port is None:
                self._port = int(match[1])
                self._listening.set()
        self._listening.set()  # exited: let the waiter see it

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def stop(self) -> int:
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(STARTUP_DEADLINE_SECONDS)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._reader.join(STARTUP_DEADLINE_SECONDS)
        return self._process.returncode

    def __enter__(self) -> ServiceProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
