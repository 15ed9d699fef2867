"""``make soak``: one ``gradvault serve`` on loopback under attack while a client works.

The service runs as its own process (``python -m gradvault serve``, the real uvicorn) on
127.0.0.1, a free port, a temporary local store and spool folder, and one write token
(``GRADVAULT_TOKENS``). For ``--seconds`` (600 by default) this process then runs, at once:

- **slow headers**: ``--slow-connections`` (300) raw connections, each sending half a
  request line and then holding the connection (opened again when the service closes it);
- **made-up methods**: ``--method-rate`` (5) requests a second whose method is a random
  name of 1,000-4,000 letters, each on its own connection;
- **login bodies**: ``POST /ui/login`` one at a time with a body of 64-128 MiB (random),
  in turn declared by ``Content-Length`` and streamed, sent chunked without a length, and
  declared but not sent (the connection waits for an answer);
- **pushers**: ``--pushers`` (50) clients each pushing a small snapshot with the token
  every ``--push-interval`` (2 s) seconds and deleting its previous one; 429 and 503 under
  the service's load limits are counted as outcomes, not failures;
- **the legitimate client**: ``gradvault.client.Client`` with the token pushes a snapshot,
  restores it (every byte compared with what it pushed) and deletes it, in a loop.

The attackers and pushers share one asyncio loop; the legitimate client has a thread.
Every connection goes to 127.0.0.1 and has a timeout; the connection counts are fixed by
the options; the whole program stops itself ``--grace`` seconds after the soak's end.

The service's RSS (``VmRSS``) is sampled every 0.2 s from /proc. Reported: round trips of
the legitimate client and its errors, each attacker's outcomes, RSS after warm-up ("start"),
its peak and its value when the traffic stops ("end"), and the size of ``/metrics`` at the
end. Targets: 0 errors for the legitimate client, RSS growth (peak minus start) under
100 MiB, ``/metrics`` under 100 KiB. The report is printed and written as JSON
(``bench/results/soak.json`` by default). Exit status: 0 every target met, 1 one missed,
2 the soak itself could not run (the service did not start or did not work before the
attack, too few open files allowed, the time limit passed), 130 interrupted (Ctrl-C or
SIGTERM; the service is stopped).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench.soak_traffic import (
    ANSWER_SECONDS,
    HOST,
    METHOD_LENGTHS,
    MIB,
    Legitimate,
    round_trip,
    run_traffic,
)
from gradvault.client import Client

RESULTS = Path(__file__).parent / "results"

#: the acceptance targets
LEGITIMATE_ERRORS_LIMIT = 0
RSS_GROWTH_LIMIT = 100 * MIB
METRICS_BYTES_LIMIT = 100 << 10

EXIT_MET, EXIT_MISSED, EXIT_NOT_RUN, EXIT_INTERRUPTED = 0, 1, 2, 130

STARTUP_SECONDS = 60
#: how long the legitimate client's last round trip may run past the end
LEGITIMATE_DRAIN_SECONDS = 60
METRICS_READ_SECONDS = 120
#: /metrics is read up to this many bytes (beyond, its size is reported as "at least")
METRICS_READ_CAP = 256 * MIB
SAMPLE_SECONDS = 0.2
WARM_UP_ROUND_TRIPS = 3
#: file descriptors this process needs beyond its slow connections and pushers
SPARE_FILES = 128
_LISTENING = re.compile(r"Uvicorn running on http://127\.0\.0\.1:(\d+)")


class SoakNotRunError(RuntimeError):
    """The soak could not run (exit status 2): the message says what was missing."""


# --------------------------------------------------------------------------- the service
class Service:
    """``python -m gradvault serve`` on 127.0.0.1, a free port; ``stop()`` ends it."""

    def __init__(self, folder: Path, token: str) -> None:
        self.store = folder / "store"
        self.spool = folder / "spool"
        self.spool.mkdir()
        environment = {k: v for k, v in os.environ.items() if not k.startswith("GRADVAULT_")}
        environment["GRADVAULT_TOKENS"] = f"{token}:write"
        self.command = [
            sys.executable, "-m", "gradvault", "serve",
            "--store", str(self.store), "--spool-dir", str(self.spool),
            "--host", HOST, "--port", "0", "--log-level", "info",
        ]  # fmt: skip
        self._process = subprocess.Popen(
            self.command,
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # the access log: one JSON line per request
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
        )
        self.log_lines = 0
        self.log_tail: collections.deque[str] = collections.deque(maxlen=30)
        self.port: int | None = None
        self._listening = threading.Event()
        threading.Thread(target=self._read_log, name="service-log", daemon=True).start()
        if not self._listening.wait(STARTUP_SECONDS) or self.port is None:
            self.stop()
            raise SoakNotRunError(
                f"the service did not start within {STARTUP_SECONDS} s "
                f"({' '.join(self.command)}); its log ends:\n" + "".join(self.log_tail)
            )

    def _read_log(self) -> None:
        assert self._process.stderr is not None
        for line in self._process.stderr:  # read to the end, so the service never blocks
            self.log_lines += 1
            self.log_tail.append(line[:500])
            match = _LISTENING.search(line)
            if match and self.port is None:
                self.port = int(match[1])
                self._listening.set()
        self._listening.set()

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def exit_code(self) -> int | None:
        return self._process.poll()

    def stop(self) -> int:
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        return self._process.returncode

    def kill(self) -> None:
        if self._process.poll() is None:
            self._process.kill()


def rss_bytes(pid: int) -> int | None:
    """VmRSS of process ``pid`` in bytes; None once it has gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def open_files_limit(pid: int) -> int | None:
    """The soft open-files limit of process ``pid`` (None: unlimited or unreadable)."""
    try:
        for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
            if line.startswith("Max open files"):
                soft = line.split()[3]
                return int(soft) if soft.isdigit() else None
    except OSError:
        return None
    return None


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU time of process ``pid`` so far; None once it has gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class RssSampler(threading.Thread):
    """Samples a process's RSS every SAMPLE_SECONDS until ``stop`` is set."""

    def __init__(self, pid: int, started: float) -> None:
        super().__init__(name="rss-sampler", daemon=True)
        self.pid, self.started = pid, started
        self.samples: list[tuple[float, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while True:
            value = rss_bytes(self.pid)
            if value is not None:
                self.samples.append((time.monotonic() - self.started, value))
            if self.stop.wait(SAMPLE_SECONDS):
                return


# --------------------------------------------------------------------------- the soak
def raise_open_files_limit(needed: int) -> dict[str, int]:
    """Raise this process's soft RLIMIT_NOFILE to the hard one when ``needed`` is above it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limits = {"soft_before": soft, "soft": soft, "hard": hard, "needed": needed}
    if needed <= soft:
        return limits
    if hard != resource.RLIM_INFINITY and needed > hard:
        raise SoakNotRunError(
            f"this soak needs about {needed} open files; the hard limit is {hard} "
            f"(lower --slow-connections or --pushers, or raise the limit)"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    limits["soft"] = hard
    return limits


def _ready(http: httpx.Client, token: str) -> bool:
    try:
        return http.get("/readyz", headers={"Authorization": f"Bearer {token}"}).is_success
    except httpx.TransportError:
        return False


def _warm_up(service: Service, token: str) -> None:
    """Every kind of request once, so the baseline RSS includes what they load."""
    with httpx.Client(base_url=service.url, timeout=ANSWER_SECONDS) as http:
        deadline = time.monotonic() + STARTUP_SECONDS
        while not _ready(http, token):
            if time.monotonic() > deadline:
                raise SoakNotRunError(f"the service was not ready within {STARTUP_SECONDS} s")
            time.sleep(0.1)
        http.post("/ui/login", data={"token": "not-a-token"})
        http.request("MADEUP", "/healthz")
        http.get("/metrics", headers={"Authorization": f"Bearer {token}"})
    with Client(service.url, token) as api:
        for step in range(WARM_UP_ROUND_TRIPS):
            try:
                round_trip(api, step, seed=1_000_000 + step)
            except Exception as error:
                raise SoakNotRunError(
                    f"the legitimate client failed before the soak: {type(error).__name__}: {error}"
                ) from error


def _metrics_size(url: str, token: str) -> tuple[int | None, bool]:
    """The size of ``/metrics`` in bytes (read up to METRICS_READ_CAP), and if it was cut."""
    size = 0
    try:
        with (
            httpx.Client(base_url=url, timeout=METRICS_READ_SECONDS) as http,
            http.stream("GET", "/metrics", headers={"Authorization": f"Bearer {token}"}) as answer,
        ):
            if answer.status_code != 200:
                return None, False
            for chunk in answer.iter_raw():
                size += len(chunk)
                if size >= METRICS_READ_CAP:
                    return size, True
    except httpx.HTTPError:
        return None, False
    return size, False


def _watchdog(seconds: float, service_box: list[Service], folder: str) -> threading.Timer:
    """Ends this process (and the service) if the soak runs past ``seconds``."""

    def expire() -> None:
        print(
            f"soak: still running at its limit of {seconds:.0f} s (--seconds plus --grace); "
            "the service is killed",
            file=sys.stderr,
            flush=True,
        )
        for service in service_box:
            service.kill()
        shutil.rmtree(folder, ignore_errors=True)
        os._exit(EXIT_NOT_RUN)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    return timer


def soak(options: argparse.Namespace) -> dict[str, Any]:
    """Run the soak; the report as a dict (``met`` says whether every target was met)."""
    token = secrets.token_urlsafe(24)
    started_at = datetime.now(UTC)
    service_box: list[Service] = []
    with tempfile.TemporaryDirectory(prefix="gv-soak-") as folder:
        watchdog = _watchdog(options.seconds + options.grace, service_box, folder)
        try:
            # the service keeps the open-files limit it was given; only this side is raised
            service = Service(Path(folder), token)
            service_box.append(service)
            try:
                files = raise_open_files_limit(
                    options.slow_connections + 2 * options.pushers + SPARE_FILES
                )
                report = _soak_service(options, service, token, files)
            finally:
                exit_code = service.stop()
            leftovers = sorted(path.name for path in service.spool.iterdir())
        finally:
            watchdog.cancel()
    report["service"]["exit_code"] = exit_code
    report["service"]["spool_files_left"] = leftovers
    report["started_at"] = started_at.isoformat(timespec="seconds")
    return report


def _soak_service(
    options: argparse.Namespace, service: Service, token: str, files: dict[str, int]
) -> dict[str, Any]:
    _warm_up(service, token)
    time.sleep(1)
    start_rss = rss_bytes(service.pid)
    service_cpu_before = cpu_seconds(service.pid) or 0.0
    own_cpu_before = _own_cpu()
    began = time.monotonic()
    deadline = began + options.seconds
    sampler = RssSampler(service.pid, began)
    sampler.start()
    legitimate = Legitimate(
        service.url, token, deadline, options.legitimate_pause, first_step=WARM_UP_ROUND_TRIPS
    )
    legitimate_thread = threading.Thread(target=legitimate.run, name="legitimate", daemon=True)
    legitimate_thread.start()
    attackers = asyncio.run(run_traffic(options, service.url, service.port, token, deadline))
    legitimate_thread.join(max(0.0, deadline - time.monotonic()) + LEGITIMATE_DRAIN_SECONDS)
    if legitimate_thread.is_alive():
        legitimate.errors.append(
            f"a round trip was still waiting {LEGITIMATE_DRAIN_SECONDS} s after the end"
        )
    sampler.stop.set()
    sampler.join()
    elapsed = time.monotonic() - began
    end_rss = rss_bytes(service.pid)
    service_cpu = (cpu_seconds(service.pid) or service_cpu_before) - service_cpu_before
    own_cpu = _own_cpu() - own_cpu_before
    alive = service.exit_code() is None
    metrics_bytes, metrics_cut = _metrics_size(service.url, token) if alive else (None, False)
    values = [value for _, value in sampler.samples]
    peak = max(values, default=start_rss or 0)
    start = start_rss or 0
    rss = {
        "start_bytes": start,
        "peak_bytes": peak,
        "end_bytes": end_rss,
        "growth_bytes": peak - start,
        "end_growth_bytes": None if end_rss is None else end_rss - start,
        "samples": _thin(sampler.samples, 120),
    }
    legitimate_json = legitimate.as_json()
    targets = {
        "legitimate_errors": _target(legitimate_json["errors"], LEGITIMATE_ERRORS_LIMIT, "<="),
        "rss_growth_bytes": _target(rss["growth_bytes"], RSS_GROWTH_LIMIT, "<"),
        "metrics_bytes": _target(metrics_bytes, METRICS_BYTES_LIMIT, "<"),
        "service_alive": {"found": alive, "met": alive},
    }
    return {
        "seconds_requested": options.seconds,
        "seconds": round(elapsed, 1),
        "service": {
            "command": service.command[1:],
            "pid": service.pid,
            "alive_at_end": alive,
            "log_lines": service.log_lines,
            "log_tail": list(service.log_tail)[-10:],
        },
        "options": {name: value for name, value in vars(options).items() if name != "output"},
        "open_files_limit": {**files, "service_soft": open_files_limit(service.pid)},
        "cpu_seconds": {"service": round(service_cpu, 1), "soak": round(own_cpu, 1)},
        "legitimate": legitimate_json,
        "attackers": attackers,
        "rss": rss,
        "metrics_bytes": metrics_bytes,
        "metrics_read_cut_at_cap": metrics_cut,
        "targets": targets,
        "met": all(target["met"] for target in targets.values()),
    }


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _target(found: int | None, limit: int, relation: str) -> dict[str, Any]:
    met = found is not None and (found <= limit if relation == "<=" else found < limit)
    return {"found": found, "limit": limit, "relation": relation, "met": met}


def _thin(samples: list[tuple[float, int]], most: int) -> list[list[float]]:
    step = max(1, len(samples) // most)
    return [[round(t, 1), value] for t, value in samples[::step]]


# --------------------------------------------------------------------------- the report
def _mib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / MIB:.0f} MiB"


def _size(value: int | None) -> str:
    if value is None:
        return "n/a"
    if value >= MIB:
        return f"{value / MIB:.1f} MiB"
    return f"{value / 1024:.1f} KiB" if value >= 1024 else f"{value} B"


def _outcomes(kind: dict[str, Any]) -> str:
    return ", ".join(f"{name} {count}" for name, count in kind["outcomes"].items()) or "none"


def text_report(report: dict[str, Any]) -> str:
    """The report in a few lines for a terminal."""
    legit, attackers, rss = report["legitimate"], report["attackers"], report["rss"]
    trip = legit["round_trip_seconds"]
    slow, methods = attackers["slow_headers"], attackers["made_up_methods"]
    logins, pushers = attackers["login_bodies"], attackers["pushers"]
    closed = slow["closed_after_seconds"]
    cpu = report["cpu_seconds"]
    lines = [
        f"# soak: {report['seconds']:.0f} s against gradvault serve on loopback "
        f"(pid {report['service']['pid']}), local store, one write token",
        f"legitimate client: {legit['round_trips']} round trips (push, restore, compare, "
        f"delete), {legit['errors']} errors"
        + (
            f"; round trip p50 {trip['p50']:.2f} s, p99 {trip['p99']:.2f} s, "
            f"max {trip['max']:.2f} s"
            if trip["p50"] is not None
            else ""
        ),
        *(f"  {error}" for error in legit["error_samples"]),
        f"slow headers ({slow['connections']} connections, at most {slow['held_at_most']} "
        f"held at once): {_outcomes(slow)}"
        + (
            f"; closed after {closed['min']:.1f}-{closed['max']:.1f} s "
            f"(median {closed['median']:.1f} s)"
            if closed
            else ""
        ),
        f"made-up methods ({methods['per_second']:g}/s, {METHOD_LENGTHS[0]}-"
        f"{METHOD_LENGTHS[1]} characters): {methods['total']} sent; {_outcomes(methods)}",
        f"login bodies ({logins['body_mib'][0]}-{logins['body_mib'][1]} MiB): "
        f"{logins['total']} sent, {_size(logins.get('body_bytes_sent', 0))} of body; "
        f"{_outcomes(logins)}",
        f"pushers ({pushers['clients']}, a push each {pushers['push_interval_seconds']:g} s): "
        f"{_outcomes(pushers)}",
        f"service RSS: start {_mib(rss['start_bytes'])} (after warm-up), peak "
        f"{_mib(rss['peak_bytes'])}, end {_mib(rss['end_bytes'])}; growth "
        f"{_mib(rss['growth_bytes'])} (peak - start), {_mib(rss['end_growth_bytes'])} at the end",
        f"/metrics: {_size(report['metrics_bytes'])}"
        + (" (read cut there)" if report["metrics_read_cut_at_cap"] else ""),
        f"CPU: service {cpu['service']} s, soak {cpu['soak']} s",
    ]
    if not report["service"]["alive_at_end"]:
        lines.append("the service died during the soak; its log ends:")
        lines.extend("  " + line.rstrip() for line in report["service"]["log_tail"])
    if report["service"]["spool_files_left"]:
        lines.append(f"spool files left: {len(report['service']['spool_files_left'])}")
    targets = report["targets"]
    errors, growth, metrics = (
        targets["legitimate_errors"],
        targets["rss_growth_bytes"],
        targets["metrics_bytes"],
    )
    lines.append(
        f"targets: legitimate errors {errors['found']} (<= {errors['limit']}) {_met(errors)}; "
        f"RSS growth {_mib(growth['found'])} (< {_mib(growth['limit'])}) {_met(growth)}; "
        f"/metrics {_size(metrics['found'])} (< {_size(metrics['limit'])}) {_met(metrics)}"
        + ("" if targets["service_alive"]["met"] else "; the service died: MISSED")
    )
    lines.append(f"soak: {'every target met' if report['met'] else 'a target MISSED'}")
    return "\n".join(lines)


def _met(target: dict[str, Any]) -> str:
    return "met" if target["met"] else "MISSED"


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number above 0; got {text!r}")
    return value


def _non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0; got {text!r}")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a count >= 0; got {text!r}")
    return value


def parse_options(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description="A bounded soak of gradvault serve on loopback under attack.",
    )
    parser.add_argument("--seconds", type=_positive, default=600, help="length (600)")
    parser.add_argument("--slow-connections", type=_count, default=300, help="(300)")
    parser.add_argument(
        "--method-rate", type=_non_negative, default=5, help="made-up methods a second (5; 0: none)"
    )
    parser.add_argument("--login-min-mib", type=_count, default=64, help="(64)")
    parser.add_argument("--login-max-mib", type=_count, default=128, help="(128)")
    parser.add_argument(
        "--login-interval", type=_non_negative, default=1.0, help="pause between logins (1 s)"
    )
    parser.add_argument("--pushers", type=_count, default=50, help="(50)")
    parser.add_argument(
        "--push-interval", type=_positive, default=2.0, help="each pusher's period (2 s)"
    )
    parser.add_argument(
        "--legitimate-pause", type=_non_negative, default=0.1, help="between round trips (0.1 s)"
    )
    parser.add_argument(
        "--grace", type=_positive, default=300, help="the program ends this long after the soak"
    )
    parser.add_argument(
        "--output", type=Path, default=RESULTS / "soak.json", help="the JSON report"
    )
    options = parser.parse_args(argv)
    if options.login_min_mib > options.login_max_mib or options.login_max_mib == 0:
        parser.error(
            f"--login-min-mib ({options.login_min_mib}) must be at most --login-max-mib "
            f"({options.login_max_mib}), which must be above 0"
        )
    return options


def main(argv: list[str] | None = None) -> int:
    """Run the soak, print and write the report; the exit status says whether targets met."""
    options = parse_options(argv)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # cleanup runs on SIGTERM too
    try:
        report = soak(options)
    except SoakNotRunError as error:
        print(f"soak: {error}", file=sys.stderr)
        return EXIT_NOT_RUN
    except KeyboardInterrupt:
        print("soak: interrupted; the service was stopped, no report", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(text_report(report))
    options.output.parent.mkdir(parents=True, exist_ok=True)
    options.output.write_text(json.dumps(report, indent=1) + "\n")
    print(f"report: {options.output}")
    return EXIT_MET if report["met"] else EXIT_MISSED


if __name__ == "__main__":
    sys.exit(main())
