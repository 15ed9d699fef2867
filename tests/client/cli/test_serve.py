"""``gradvault serve``: a flag for every setting, the environment behind the flags, clean
stops on SIGINT and SIGTERM, and a port already taken."""

from __future__ import annotations

import signal
import socket
from pathlib import Path

import pytest

from gradvault.service import Settings

from .conftest import WRITE_TOKEN, ServeProcess, clean_environment


def test_every_setting_is_a_flag(gradvault) -> None:
    result = gradvault("serve", "--help")
    assert result.code == 0
    for name, field in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        assert flag in result.out, f"{name} has no flag"
        assert f"GRADVAULT_{name.upper()}" in result.out.replace("\n", "").replace(" ", "")
        if field.annotation is bool:
            assert "--no-" + name.replace("_", "-") in result.out


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_stops_cleanly_with_exit_0(tmp_path: Path, signum: int) -> None:
    served = ServeProcess("--store", str(tmp_path / "store"))
    code = served.stop(signum)
    assert code == 0, "".join(served.log)
    assert served.log[-1].strip() == "gradvault serve: stopped"
    assert any("Application shutdown complete" in line for line in served.log)


def test_flags_win_over_the_environment(gradvault, tmp_path: Path, gradients_file) -> None:
    path, _ = gradients_file
    env = clean_environment(GRADVAULT_TOKENS=f"{WRITE_TOKEN}:write", GRADVAULT_PUBLIC_READ="false")
    served = ServeProcess("--store", str(tmp_path / "store"), "--public-read", env=env)
    try:
        assert gradvault("ls", "--url", served.url).code == 0  # public reads, from the flag
        refused = gradvault("push", str(path), "--run", "r", "--step", "1", "--url", served.url)
        assert refused.code == 1 and "authentication failed" in refused.err  # tokens, from env
    finally:
        assert served.stop() == 0


def test_a_port_in_use_fails_with_exit_1(gradvault_process, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = gradvault_process("serve", "--store", str(tmp_path / "store"), "--port", str(port))
    assert result.code == 1
    assert "address already in use" in result.err.lower()
    assert "Traceback" not in result.err
