"""``python -m bench.soak`` (``make soak``) runs against a real service and reports.

A few seconds with small counts: the report has every part, each kind of traffic ran, the
legitimate client made round trips, and the exit status agrees with the targets. The
targets themselves (0 errors, RSS growth, /metrics size) are for the full run, not here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.soak import parse_options

ROOT = Path(__file__).resolve().parents[2]
#: the soak's own limit (--seconds plus --grace) ends it well before this one
RUN_DEADLINE_SECONDS = 240


@pytest.fixture(scope="module")
def soak_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, dict]:
    output = tmp_path_factory.mktemp("soak") / "soak.json"
    finished = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.soak",
            "--seconds",
            "5",
            "--slow-connections",
            "8",
            "--pushers",
            "3",
            "--push-interval",
            "0.5",
            "--method-rate",
            "4",
            "--login-min-mib",
            "1",
            "--login-max-mib",
            "2",
            "--login-interval",
            "0.2",
            "--grace",
            "180",
            "--output",
            str(output),
        ],  # fmt: skip
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_DEADLINE_SECONDS,
    )
    assert finished.returncode in (0, 1), (
        f"the soak could not run (exit {finished.returncode}):\n"
        f"{finished.stdout}\n{finished.stderr}"
    )
    return finished, json.loads(output.read_text())


def test_the_legitimate_client_made_round_trips(soak_run):
    _, report = soak_run
    legitimate = report["legitimate"]
    assert legitimate["round_trips"] > 0
    assert legitimate["errors"] == len(legitimate["error_samples"])
    assert set(legitimate["round_trip_seconds"]) == {"p50", "p99", "max"}


def test_every_kind_of_traffic_ran_and_counted_its_outcomes(soak_run):
    _, report = soak_run
    attackers = report["attackers"]
    assert set(attackers) >= {"slow_headers", "made_up_methods", "login_bodies", "pushers"}
    for name in ("slow_headers", "made_up_methods", "login_bodies", "pushers"):
        kind = attackers[name]
        assert kind["total"] == sum(kind["outcomes"].values()) > 0, name
    assert attackers["slow_headers"]["connections"] == 8
    assert attackers["slow_headers"]["held_at_most"] > 0
    assert attackers["pushers"]["clients"] == 3
    pushes = sum(n for name, n in attackers["pushers"]["outcomes"].items() if "push" in name)
    assert pushes > 0
    assert attackers["login_bodies"]["body_bytes_sent"] > 4096


def test_the_report_has_the_service_memory_and_metrics_figures(soak_run):
    _, report = soak_run
    rss = report["rss"]
    assert 0 < rss["start_bytes"] <= rss["peak_bytes"]
    assert rss["growth_bytes"] == rss["peak_bytes"] - rss["start_bytes"]
    assert rss["samples"]
    assert report["metrics_bytes"] > 0
    assert report["seconds"] >= 5
    assert report["service"]["alive_at_end"]
    assert report["open_files_limit"]["soft"] >= report["open_files_limit"]["needed"]


def test_the_exit_status_and_the_printed_report_agree_with_the_targets(soak_run):
    finished, report = soak_run
    targets = report["targets"]
    assert set(targets) == {
        "legitimate_errors",
        "rss_growth_bytes",
        "metrics_bytes",
        "service_alive",
    }
    assert report["met"] == all(target["met"] for target in targets.values())
    assert finished.returncode == (0 if report["met"] else 1)
    assert targets["metrics_bytes"]["found"] == report["metrics_bytes"]
    assert targets["rss_growth_bytes"]["found"] == report["rss"]["growth_bytes"]
    assert f"legitimate client: {report['legitimate']['round_trips']} round trips" in (
        finished.stdout
    )
    assert ("every target met" if report["met"] else "a target MISSED") in finished.stdout


def test_bad_options_are_refused_naming_the_option(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_options(["--login-min-mib", "9", "--login-max-mib", "2"])
    assert exit_info.value.code == 2
    assert "--login-min-mib (9) must be at most --login-max-mib (2)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_options(["--seconds", "0"])
    assert "--seconds: expected a number above 0; got '0'" in capsys.readouterr().err
