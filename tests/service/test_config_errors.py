"""A configuration error never prints a token, nor a value that may hold a secret.

Both commands are run in this process (their ``main``), with the variables set, and
refuse the configuration before serving anything.
"""

from __future__ import annotations

import pytest

from gradvault.client.cli import main as gradvault_main
from gradvault.service.__main__ import main as service_main

GOOD_TOKEN = "tok-kept-secret-1234:write"
BAD_PAIR = "second-secret-5678"  # a token without its scope

COMMANDS = {
    "python -m gradvault.service": lambda args: service_main(args),
    "gradvault serve": lambda args: gradvault_main(["serve", *args]),
}


@pytest.fixture
def run(monkeypatch, tmp_path, capsys):
    def run(command: str, **variables: str) -> tuple[int, str]:
        for name, value in variables.items():
            monkeypatch.setenv(name, value)
        status = COMMANDS[command](["--store", str(tmp_path / "store"), "--port", "0"])
        captured = capsys.readouterr()
        return status, captured.out + captured.err

    return run


@pytest.mark.parametrize("command", COMMANDS)
def test_a_malformed_tokens_variable_names_no_token(run, command):
    status, output = run(command, GRADVAULT_TOKENS=f"{GOOD_TOKEN},{BAD_PAIR}")
    assert status == 2, output
    assert "tokens" in output.lower()
    assert "token:scope" in output  # says what is wrong
    assert "tok-kept-secret" not in output
    assert BAD_PAIR not in output


@pytest.mark.parametrize("command", COMMANDS)
def test_malformed_store_options_print_no_value(run, command):
    secret = "AKIA-not-to-be-printed"
    status, output = run(command, GRADVAULT_STORE_OPTIONS=f'{{"secret_access_key": "{secret}"')
    assert status == 2, output
    assert "store_options" in output
    assert secret not in output
    assert "Traceback" not in output and "unexpected error" not in output


def test_a_value_of_a_public_setting_is_still_echoed(run):
    status, output = run("gradvault serve", GRADVAULT_MAX_BODY_BYTES="lots")
    assert status == 2
    assert "'lots'" in output
