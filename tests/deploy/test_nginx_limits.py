"""The compose stack's nginx meets the service's limits first (deploy/nginx/nginx.conf)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gradvault.service import Settings

CONF = Path(__file__).parents[2] / "deploy" / "nginx" / "nginx.conf"
UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def _directive(name: str) -> str:
    found = re.findall(rf"^\s*{name}\s+([^;]+);", CONF.read_text(), re.MULTILINE)
    assert len(found) == 1, f"{name}: {found}"
    return found[0].strip()


def _seconds(text: str) -> float:
    match = re.fullmatch(r"(\d+)s", text)
    assert match, text
    return float(match[1])


def test_the_body_limit_is_the_services_upload_limit():
    size = re.fullmatch(r"(\d+)([kmg]?)", _directive("client_max_body_size").lower())
    assert size, "client_max_body_size is a size"
    limit = int(size[1]) * UNITS[size[2]]
    assert limit == Settings.model_fields["max_upload_bytes"].default
    assert limit > 0  # 0 would be unlimited


def test_the_timeouts_are_the_services():
    defaults = Settings.model_fields
    assert _seconds(_directive("client_header_timeout")) == (
        defaults["header_timeout_seconds"].default
    )
    assert _seconds(_directive("client_body_timeout")) == defaults["body_timeout_seconds"].default


def test_the_upstream_connections_are_closed_before_the_service_closes_them():
    timeouts = re.findall(r"^\s*keepalive_timeout\s+(\d+)s;", CONF.read_text(), re.MULTILINE)
    upstream = re.search(r"upstream gradvault \{(.*?)\}", CONF.read_text(), re.DOTALL)[1]
    inside = re.search(r"keepalive_timeout\s+(\d+)s;", upstream)
    assert inside and int(inside[1]) < Settings.model_fields["keep_alive_seconds"].default
    assert len(timeouts) == 2


def test_the_host_header_keeps_its_port():
    assert _directive("proxy_set_header Host") == "$http_host"


@pytest.mark.skipif(shutil.which("nginx") is None, reason="nginx is not installed")
def test_nginx_accepts_the_configuration(tmp_path):
    conf = CONF.read_text().replace("server gradvault:8000;", "server 127.0.0.1:9;")
    conf = conf.replace("server replica:8000;", "server 127.0.0.1:10;")
    (tmp_path / "nginx.conf").write_text(conf)
    result = subprocess.run(
        ["nginx", "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
