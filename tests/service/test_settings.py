"""Settings: tokens, environment variables, and the refusal to serve open off loopback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from pydantic import ValidationError

from gradvault.service import OpenBindingError, Scope, Settings, create_app
from gradvault.service.settings import check_binding


def test_tokens_are_parsed_from_comma_separated_pairs():
    settings = Settings(tokens="alpha-1:write, beta-2:read,")
    assert settings.tokens == {"alpha-1": Scope.WRITE, "beta-2": Scope.READ}
    assert Scope.WRITE.allows(Scope.READ) and not Scope.READ.allows(Scope.WRITE)


@pytest.mark.parametrize("text", ["alpha", "alpha:admin", ":read", "al pha:read"])
def test_a_malformed_token_pair_is_refused(text):
    with pytest.raises(ValidationError):
        Settings(tokens=text)


def test_tokens_never_appear_in_the_settings_repr():
    assert "s3cr3t-token" not in repr(Settings(tokens="s3cr3t-token:write"))


def test_settings_come_from_the_environment_when_the_app_is_created(monkeypatch, tmp_path):
    monkeypatch.setenv("GRADVAULT_STORE", str(tmp_path / "s"))
    monkeypatch.setenv("GRADVAULT_TOKENS", "tok-1:read")
    monkeypatch.setenv("GRADVAULT_PUBLIC_READ", "true")
    monkeypatch.setenv("GRADVAULT_MAX_UPLOAD_BYTES", "1234")
    monkeypatch.setenv("GRADVAULT_INDEX_REFRESH_SECONDS", "0.5")
    settings = create_app().state.settings
    assert settings.store == str(tmp_path / "s")
    assert settings.tokens == {"tok-1": Scope.READ}
    assert settings.public_read and settings.max_upload_bytes == 1234
    assert settings.index_refresh_seconds == 0.5


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.5", "example.org", "::"])
def test_no_tokens_and_a_reachable_host_is_refused(host):
    with pytest.raises(OpenBindingError, match="GRADVAULT_ALLOW_OPEN"):
        check_binding(Settings(host=host))
    check_binding(Settings(host=host, allow_open=True))
    check_binding(Settings(host=host, tokens="tok-1:write"))


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_no_tokens_on_loopback_is_allowed(host):
    check_binding(Settings(host=host))


def test_the_command_refuses_an_open_service_on_all_addresses(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRADVAULT_")}
    result = subprocess.run(
        [sys.executable, "-m", "gradvault.service", "--store", str(tmp_path), "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 2
    assert "GRADVAULT_ALLOW_OPEN" in result.stderr
