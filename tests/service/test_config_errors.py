"""A configuration error never prints a token, nor a value that may hold a secret."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

GOOD_TOKEN = "tok-kept-secret-1234:write"
BAD_PAIR = "second-secret-5678"  # a token without its scope

COMMANDS = {
    "python -m gradvault.service": [sys.executable, "-m", "gradvault.service"],
    "gradvault serve": [sys.executable, "-m", "gradvault", "serve"],
}


def _run(command: list[str], tmp_path, **variables: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRADVAULT_")}
    env.update(variables)
    return subprocess.run(
        [*command, "--store", str(tmp_path / "store"), "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("command", COMMANDS)
def test_a_malformed_tokens_variable_names_no_token(command, tmp_path):
    result = _run(COMMANDS[command], tmp_path, GRADVAULT_TOKENS=f"{GOOD_TOKEN},{BAD_PAIR}")
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "GRADVAULT_TOKENS" in output or "tokens" in output
    assert "token:scope" in output  # says what is wrong
    assert "tok-kept-secret" not in output
    assert BAD_PAIR not in output
    assert "Traceback" not in output


@pytest.mark.parametrize("command", COMMANDS)
def test_malformed_store_options_print_no_value(command, tmp_path):
    secret = "AKIA-not-to-be-printed"
    result = _run(
        COMMANDS[command], tmp_path, GRADVAULT_STORE_OPTIONS=f'{{"secret_access_key": "{secret}"'
    )
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "store_options" in output
    assert secret not in output
    assert "Traceback" not in output


def test_a_value_of_a_public_setting_is_still_echoed(tmp_path):
    result = _run(COMMANDS["gradvault serve"], tmp_path, GRADVAULT_MAX_BODY_BYTES="lots")
    assert result.returncode == 2
    assert "'lots'" in result.stderr
