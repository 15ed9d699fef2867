"""The chaos phase of ``make deploy-check``: the cluster profile loses a machine and holds.

    python deploy/chaos.py URL TOKEN PROJECT

URL is the cluster's nginx on loopback, TOKEN a write token, PROJECT the compose project.
A client pushes and restores in a loop through URL while this script, in turn:
``docker kill``s volume server ``volume-2``, then one service replica (``cluster-replica``),
then ``docker start``s both, waits for them to be healthy, has SeaweedFS repair its
volumes (``volume.fix.replication -apply`` and ``volume.check.disk -apply`` in ``weed
shell``), then kills the leading master and starts it again once another leads, and lets
the traffic run on a little.
It then stops the client and checks every snapshot the client saw committed: listed
through nginx, and restored bit-identical.

It fails (exit status 1, saying what) on any of: an error that reached the client after its
retries; a restore that differs from what was pushed; a committed snapshot missing from the
listing; no push committed after a kill; no new leader after the master's; SeaweedFS
reporting a volume with fewer or more copies than its replication once the server is
back, or two copies on one server; a volume handed out for writes short of a copy. It
prints the figures (requests, errors the client retried through, retries, the time each
kill took to recover from) and SeaweedFS's own view of the volumes (the leading master's
``/dir/status`` and ``/vol/status``) before the kill, during the outage and after the repair.

The client retries up to ``RETRIES`` times after a connection error, 429, 502, 503 or 504,
waiting 0.5 s doubling up to ``MAX_BACKOFF_SECONDS`` (with jitter): about a minute in all,
longer than SeaweedFS takes to stop handing out volumes with a copy on a dead server.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from gradvault.client import Client
from gradvault.core import GradientRecordEntry, GradientsParamsRecord, GradvaultError, ParamId

RUN = "chaos"
RETRIES = 12
MAX_BACKOFF_SECONDS = 5.0
#: seconds of traffic in each phase
WARM_SECONDS = 8
VOLUME_OUTAGE_SECONDS = 15
REPLICA_OUTAGE_SECONDS = 10
MASTER_OUTAGE_SECONDS = 10
AFTER_SECONDS = 8
#: bounds every wait on the cluster; a wait that reaches it fails the check
DEADLINE_SECONDS = 120
RETRYABLE = {429, 502, 503, 504}
VOLUME_SERVER = "volume-2"
REPLICA = "cluster-replica"
#: SeaweedFS's own repair (deploy/seaweedfs/master.toml runs it every few minutes): a
#: copy for every volume short of one, a copy too many deleted, copies that differ synced
REPAIR_SCRIPT = "lock\nvolume.fix.replication -apply\nvolume.check.disk -apply\nunlock"
MASTERS = ("master-1", "master-2", "master-3")
MASTER_ADDRESSES = ",".join(f"{name}:9333" for name in MASTERS)


class CheckFailed(Exception):
    """The cluster did not hold; the message says how."""


# ---------------------------------------------------------------------- the traffic
def record_for(step: int) -> GradientsParamsRecord:
    """The record pushed at ``step``: 4 float32 gradients, 129 KiB, different each step."""
    rng = np.random.default_rng(step)
    return GradientsParamsRecord(
        [
            GradientRecordEntry.from_array(
                ParamId(2000 + i), f"layer{i}.weight", rng.standard_normal((64, 129), "f4")
            )
            for i in range(4)
        ]
    )


def _entries(record: GradientsParamsRecord) -> list[tuple]:
    return sorted(
        (str(e.param_id), e.name, e.dtype, tuple(e.shape), e.array.tobytes())
        for e in record.entries
    )


@dataclass
class Tally:
    """Every HTTP attempt the client made, as the transport saw it (thread-safe)."""

    requests: int = 0
    failed: Counter = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def attempt(self) -> None:
        with self.lock:
            self.requests += 1

    def failure(self, kind: str) -> None:
        with self.lock:
            self.failed[kind] += 1


class _CountedStream(httpx.SyncByteStream):
    """A response body whose transport errors (a connection dropped mid-body) are counted."""

    def __init__(self, stream: httpx.SyncByteStream, tally: Tally) -> None:
        self._stream = stream
        self._tally = tally

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._stream
        except httpx.TransportError as error:
            self._tally.failure(f"{type(error).__name__} mid-body")
            raise

    def close(self) -> None:
        self._stream.close()


class CountingTransport(httpx.HTTPTransport):
    """httpx's transport, telling ``tally`` of each attempt and each retryable failure."""

    def __init__(self, tally: Tally) -> None:
        super().__init__()
        self._tally = tally

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self._tally.attempt()
        try:
            response = super().handle_request(request)
        except httpx.TransportError as error:
            self._tally.failure(type(error).__name__)
            raise
        if response.status_code in RETRYABLE:
            self._tally.failure(f"HTTP {response.status_code}")
        response.stream = _CountedStream(response.stream, self._tally)  # type: ignore[arg-type]
        return response


@dataclass
class Traffic:
    """A client pushing a new record and restoring it and an older one, in a loop."""

    url: str
    token: str
    tally: Tally = field(default_factory=Tally)
    #: snapshot id -> the step whose record it holds, for every push that committed
    committed: dict[str, int] = field(default_factory=dict)
    #: the monotonic time each push's answer came (it committed then)
    commit_times: list[float] = field(default_factory=list)
    restores: int = 0
    #: (seconds, what) of the slowest push and the slowest restore, retries included
    slowest: dict[str, tuple[float, str]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        client = Client(
            self.url,
            self.token,
            transport=CountingTransport(self.tally),
            retries=RETRIES,
            max_backoff_seconds=MAX_BACKOFF_SECONDS,
        )
        chooser = random.Random(5)
        step = 0
        with client:
            while not self.stop.is_set():
                step += 1
                started = time.monotonic()
                try:
                    summary = client.push(record_for(step), run=RUN, step=step)
                except GradvaultError as error:
                    self.errors.append(f"push of step {step}: {error}")
                    continue
                self._timed("push", started, f"step {step}")
                self.commit_times.append(time.monotonic())
                self.committed[summary.id] = step
                older = chooser.choice(list(self.committed))
                for snapshot_id in dict.fromkeys((summary.id, older)):
                    self.restore(client, snapshot_id)

    def _timed(self, kind: str, started: float, what: str) -> None:
        seconds = time.monotonic() - started
        if seconds > self.slowest.get(kind, (0.0, ""))[0]:
            self.slowest[kind] = (seconds, f"{what}, {time.strftime('%H:%M:%S')}")

    def restore(self, client: Client, snapshot_id: str) -> None:
        started = time.monotonic()
        try:
            record = client.fetch(snapshot_id)
        except GradvaultError as error:
            self.errors.append(f"restore of {snapshot_id}: {error}")
            return
        self._timed("restore", started, snapshot_id)
        self.restores += 1
        if _entries(record) != _entries(record_for(self.committed[snapshot_id])):
            self.mismatches.append(snapshot_id)

    def first_commit_after(self, moment: float) -> float | None:
        """Seconds from ``moment`` to the first push answered as committed after it."""
        later = [t for t in self.commit_times if t > moment]
        return later[0] - moment if later else None

    def commits_between(self, begin: float, end: float) -> int:
        return sum(begin < t <= end for t in self.commit_times)


# ---------------------------------------------------------------------- the cluster
def _run(*command: str, stdin: str | None = None, timeout: float = 60) -> str:
    result = subprocess.run(
        command, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )
    if result.returncode != 0:
        raise CheckFailed(
            f"{' '.join(command)} exited with {result.returncode}: {result.stderr.strip()}"
        )
    return result.stdout


@dataclass
class Cluster:
    """The compose project's containers, found by their compose labels."""

    project: str

    def container(self, service: str) -> str:
        ids = _run(
            "docker", "ps", "--all", "--quiet",
            "--filter", f"label=com.docker.compose.project={self.project}",
            "--filter", f"label=com.docker.compose.service={service}",
        ).split()  # fmt: skip
        if not ids:
            raise CheckFailed(f"project {self.project} has no container of service {service}")
        return sorted(ids)[0]

    def health(self, container: str) -> str:
        return _run("docker", "inspect", "-f", "{{.State.Health.Status}}", container).strip()

    def leader(self, without: str | None = None) -> str:
        """The master that leads, as the first master that answers says (/cluster/status);
        ``without``: a master gone, neither asked nor taken for an answer."""
        for name in MASTERS:
            if name == without:
                continue
            try:
                status = json.loads(
                    self.exec(name, "curl", "-fsS", "http://127.0.0.1:9333/cluster/status")
                )
            except (CheckFailed, ValueError):
                continue
            leader = status.get("Leader", "").split(":")[0]
            if leader and leader != without:
                return leader
        raise CheckFailed(f"none of {', '.join(MASTERS)} names a Raft leader")

    def exec(self, service: str, *command: str, stdin: str | None = None) -> str:
        interactive = ["-i"] if stdin is not None else []
        return _run("docker", "exec", *interactive, self.container(service), *command, stdin=stdin)

    def view(self) -> VolumeView:
        """SeaweedFS's own view, from the leading master: its volume servers and writable
        volumes (/dir/status) and every volume copy (/vol/status)."""
        leader = self.leader()
        get = lambda path: json.loads(  # noqa: E731
            self.exec(leader, "curl", "-fsS", f"http://127.0.0.1:9333{path}")
        )
        return VolumeView.parse(get("/dir/status")["Topology"], get("/vol/status")["Volumes"])

    def shell(self, script: str) -> str:
        """``weed shell`` on the leading master, fed ``script``; its output."""
        return self.exec(
            self.leader(), "weed", "shell", f"-master={MASTER_ADDRESSES}", stdin=script + "\n"
        )


@dataclass
class VolumeView:
    """The volume servers, the writable volumes and where each volume's copies are."""

    servers: list[str]
    writable: set[int]
    copies: dict[int, list[str]]
    wanted: dict[int, int]
    files: dict[tuple[int, str], int]

    @classmethod
    def parse(cls, topology: dict[str, Any], volumes: dict[str, Any]) -> VolumeView:
        servers = sorted(
            node["Url"].split(":")[0]
            for center in topology.get("DataCenters") or []
            for rack in center.get("Racks") or []
            for node in rack.get("DataNodes") or []
        )
        writable = {
            v for layout in topology.get("Layouts") or [] for v in layout["writables"] or []
        }
        copies: dict[int, list[str]] = {}
        wanted: dict[int, int] = {}
        files: dict[tuple[int, str], int] = {}
        for racks in volumes.get("DataCenters", {}).values():
            for nodes in racks.values():
                for server, items in nodes.items():
                    name = server.split(":")[0]
                    for item in items or []:
                        vid = item["Id"]
                        copies.setdefault(vid, []).append(name)
                        placement = item.get("ReplicaPlacement") or {}
                        wanted[vid] = 1 + sum(placement.get(k, 0) for k in ("dc", "rack", "node"))
                        files[(vid, name)] = item["FileCount"]
        return cls(servers, writable, copies, wanted, files)

    def under(self) -> list[int]:
        return sorted(v for v, names in self.copies.items() if len(set(names)) < self.wanted[v])

    def over(self) -> list[int]:
        return sorted(v for v, names in self.copies.items() if len(names) > self.wanted[v])

    def doubled(self) -> list[int]:
        return sorted(v for v, names in self.copies.items() if len(set(names)) < len(names))

    def describe(self) -> str:
        per_server = Counter(s for names in self.copies.values() for s in names)
        servers = ", ".join(f"{s} {per_server[s]}" for s in self.servers)
        lines = [
            f"volume servers {', '.join(self.servers)}; {len(self.copies)} volumes, "
            f"{sum(per_server.values())} copies (per server: {servers}); writable: "
            f"{sorted(self.writable)}; under-replicated: {self.under() or 'none'}; "
            f"over-replicated: {self.over() or 'none'}"
        ]
        for vid in sorted(self.copies):
            where = ",".join(
                f"{s}({self.files.get((vid, s), 0)} files)" for s in sorted(self.copies[vid])
            )
            state = "writable" if vid in self.writable else "read-only"
            lines.append(
                f"    volume {vid:>3}: {len(self.copies[vid])}/{self.wanted[vid]} copies, "
                f"{state}: {where}"
            )
        return "\n".join(lines)


def _say(text: str) -> None:
    print(f"== {time.strftime('%H:%M:%S')}: {text}", flush=True)


def _wait(what: str, ready: Any, deadline: float = DEADLINE_SECONDS) -> float:
    """Seconds until ``ready()`` is true, polling every 0.5 s; CheckFailed past the deadline."""
    started = time.monotonic()
    while not ready():
        if time.monotonic() - started > deadline:
            raise CheckFailed(f"{what}: not after {deadline} s")
        time.sleep(0.5)
    return time.monotonic() - started


def _recovered(traffic: Traffic, moment: float, what: str) -> float:
    """Seconds from ``moment`` (a kill) to the first push committed after it."""
    _wait(f"a push committed after {what}", lambda: traffic.first_commit_after(moment) is not None)
    return traffic.first_commit_after(moment)  # type: ignore[return-value]


def _healthy(cluster: Cluster, container: str) -> bool:
    return cluster.health(container) == "healthy"


def _upstreams(url: str, token: str, wanted: int) -> set[str]:
    """The replicas nginx reaches (X-Gradvault-Upstream) in up to 30 listings."""
    seen: set[str] = set()
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as http:
        for _ in range(30):
            response = http.get("/v1/snapshots", params={"run": RUN, "limit": 1})
            if response.status_code == 200:
                seen.add(response.headers["X-Gradvault-Upstream"])
            if len(seen) >= wanted:
                break
    return seen


def chaos(url: str, token: str, project: str, figures: dict[str, Any]) -> None:
    """The phases (module docstring), their figures put in ``figures`` as they come;
    CheckFailed saying what went wrong."""
    cluster = Cluster(project)
    traffic = Traffic(url, token)
    worker = threading.Thread(target=traffic.run, name="traffic", daemon=True)
    began = time.monotonic()
    worker.start()
    try:
        time.sleep(WARM_SECONDS)
        _say(f"traffic running: {len(traffic.committed)} snapshots committed so far")
        before = cluster.view()
        _say(f"SeaweedFS before the kill (the leading master's /vol/status):\n{before.describe()}")
        if before.under() or before.doubled():
            raise CheckFailed(
                f"before any kill, volumes {before.under()} are under-replicated and "
                f"{before.doubled()} have two copies on one server"
            )
        if len(before.servers) != 3:
            raise CheckFailed(f"SeaweedFS lists volume servers {before.servers}; expected 3")

        # ---- one volume server
        volume_server = cluster.container(VOLUME_SERVER)
        _run("docker", "kill", volume_server)
        volume_killed = time.monotonic()
        _say(f"docker kill {VOLUME_SERVER} ({volume_server[:12]})")
        dropped = _wait(
            f"the master dropping {VOLUME_SERVER}",
            lambda: VOLUME_SERVER not in cluster.view().servers,
        )
        at_drop = cluster.view()
        _say(f"the leading master no longer lists {VOLUME_SERVER} ({dropped:.1f} s after the kill)")
        figures["volume_server_dropped_s"] = round(dropped, 1)
        recovered = _recovered(traffic, volume_killed, f"the kill of {VOLUME_SERVER}")
        figures["writes_recovered_after_volume_kill_s"] = round(recovered, 1)
        time.sleep(VOLUME_OUTAGE_SECONDS)  # the traffic goes on without it
        # a volume that took writes on every copy since the master dropped the server (the
        # file counts come with the volume servers' heartbeats: wait for them)
        views: list[VolumeView] = []

        def written_on_both() -> list[int]:
            views[:] = [cluster.view()]
            return sorted(
                vid
                for vid, names in views[0].copies.items()
                if len(set(names)) >= views[0].wanted[vid]
                and all(views[0].files[(vid, s)] > at_drop.files.get((vid, s), 0) for s in names)
            )

        _wait(
            f"SeaweedFS reporting a volume written on both its copies without {VOLUME_SERVER}",
            lambda: bool(written_on_both()),
            deadline=60,
        )
        both = written_on_both()  # its view, taken once more: the one shown
        outage = views[0]
        _say(
            f"{traffic.commits_between(volume_killed, time.monotonic())} pushes committed "
            f"without {VOLUME_SERVER}, the first {recovered:.1f} s after the kill; volumes "
            f"written on both their copies since: {both}\nSeaweedFS during "
            f"the outage:\n{outage.describe()}"
        )
        short = sorted(
            v for v in outage.writable if len(set(outage.copies.get(v, []))) < outage.wanted[v]
        )
        if short:
            raise CheckFailed(f"the master hands out volumes {short}, short of a copy")
        figures["under_replicated_during_outage"] = outage.under()

        # ---- one service replica
        replica = cluster.container(REPLICA)
        _run("docker", "kill", replica)
        replica_killed = time.monotonic()
        _say(f"docker kill {REPLICA} ({replica[:12]})")
        recovered = _recovered(traffic, replica_killed, f"the kill of {REPLICA}")
        figures["writes_recovered_after_replica_kill_s"] = round(recovered, 1)
        time.sleep(REPLICA_OUTAGE_SECONDS)
        _say(
            f"{traffic.commits_between(replica_killed, time.monotonic())} pushes committed "
            f"without that replica, the first {recovered:.1f} s after the kill"
        )

        # ---- both back
        restarted = time.monotonic()
        _run("docker", "start", volume_server, replica)
        _say(f"docker start {VOLUME_SERVER} {REPLICA}")
        back = _wait(
            f"{VOLUME_SERVER} healthy and listed by the master",
            lambda: _healthy(cluster, volume_server) and VOLUME_SERVER in cluster.view().servers,
        )
        figures["volume_server_back_s"] = round(back, 1)
        _wait(f"{REPLICA} healthy", lambda: _healthy(cluster, replica))
        figures["replica_back_s"] = round(time.monotonic() - restarted, 1)
        _say(
            f"{VOLUME_SERVER} back in the master's view after {back:.1f} s; {REPLICA} "
            f"healthy after {figures['replica_back_s']:.1f} s"
        )
        back_view = cluster.view()
        _say(f"SeaweedFS once {VOLUME_SERVER} is back:\n{back_view.describe()}")
        fixed = cluster.shell(REPAIR_SCRIPT)
        _say(
            f"weed shell: {'; '.join(REPAIR_SCRIPT.splitlines())}\n{fixed.strip() or '(no output)'}"
        )
        after = _wait_replicated(cluster)
        _say(f"SeaweedFS after the restart and re-replication:\n{after.describe()}")
        figures["recovered_to_full_replication_s"] = round(time.monotonic() - restarted, 1)

        # ---- the leading master
        old = cluster.leader()
        master = cluster.container(old)
        _run("docker", "kill", master)
        master_killed = time.monotonic()
        _say(f"docker kill {old} (the Raft leader, {master[:12]})")
        new: list[str] = []

        def elected() -> bool:
            try:
                new[:] = [cluster.leader(without=old)]
            except CheckFailed:
                return False
            return True

        election = _wait(f"a leader other than {old}", elected)
        figures["new_leader_after_master_kill_s"] = round(election, 1)
        recovered = _recovered(traffic, master_killed, f"the kill of {old}")
        figures["writes_recovered_after_master_kill_s"] = round(recovered, 1)
        time.sleep(MASTER_OUTAGE_SECONDS)
        _say(
            f"{new[0]} leads {election:.1f} s after the kill; "
            f"{traffic.commits_between(master_killed, time.monotonic())} pushes committed "
            f"without {old}, the first {recovered:.1f} s after the kill"
        )
        master_restarted = time.monotonic()
        _run("docker", "start", master)
        _wait(f"{old} healthy (it knows the leader)", lambda: _healthy(cluster, master))
        figures["master_back_s"] = round(time.monotonic() - master_restarted, 1)
        _say(
            f"docker start {old}: healthy after {figures['master_back_s']:.1f} s; the leader "
            f"is {cluster.leader()}; SeaweedFS lists {', '.join(cluster.view().servers)}"
        )
        time.sleep(AFTER_SECONDS)
    finally:
        traffic.stop.set()
        worker.join(timeout=DEADLINE_SECONDS)
    if worker.is_alive():
        raise CheckFailed(f"the client did not stop within {DEADLINE_SECONDS} s")
    figures["seconds"] = round(time.monotonic() - began, 1)

    # ---- every committed snapshot: listed, and restored bit-identical
    with Client(url, token, retries=RETRIES, max_backoff_seconds=MAX_BACKOFF_SECONDS) as client:
        listed = {summary.id for summary in client.list(run=RUN)}
        lost = sorted(set(traffic.committed) - listed)
        if lost:
            raise CheckFailed(f"{len(lost)} committed snapshots are not listed: {lost[:5]}")
        for snapshot_id in traffic.committed:
            traffic.restore(client, snapshot_id)
    upstreams = _upstreams(url, token, 3)
    figures.update(
        pushes_committed=len(traffic.committed),
        restores_bit_identical=traffic.restores - len(traffic.mismatches),
        requests=traffic.tally.requests,
        failed_attempts_retried=dict(traffic.tally.failed),
        retries=sum(traffic.tally.failed.values()),
        client_errors=len(traffic.errors),
        mismatches=len(traffic.mismatches),
        replicas_answering_after=sorted(upstreams),
        slowest={kind: f"{s:.1f} s ({what})" for kind, (s, what) in traffic.slowest.items()},
    )
    if traffic.errors:
        raise CheckFailed(f"{len(traffic.errors)} errors reached the client: {traffic.errors[:3]}")
    if traffic.mismatches:
        raise CheckFailed(f"snapshots {traffic.mismatches[:5]} came back different")
    if len(upstreams) < 3:
        raise CheckFailed(f"after the restart only {sorted(upstreams)} answer through nginx")


def _wait_replicated(cluster: Cluster) -> VolumeView:
    """SeaweedFS's view once every volume has its copies, each on its own server."""
    view: list[VolumeView] = []

    def replicated() -> bool:
        view[:] = [cluster.view()]
        current = view[0]
        return len(current.servers) == 3 and not (
            current.under() or current.over() or current.doubled()
        )

    try:
        _wait("every volume at its replication after the restart", replicated)
    except CheckFailed as error:
        raise CheckFailed(f"{error}:\n{view[0].describe()}") from None
    return view[0]


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    url, token, project = argv
    figures: dict[str, Any] = {}
    try:
        chaos(url, token, project, figures)
    except CheckFailed as error:
        print(
            f"chaos check failed: {error}\nthe figures so far: {json.dumps(figures)}",
            file=sys.stderr,
        )
        return 1
    _say("chaos check passed: " + json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
