"""HTTP throughput: the service against nginx serving the same bytes from a file.

One uvicorn (the service, default settings) and Debian's nginx (``sendfile on``, its own
config in a temporary folder), both on loopback, both warm (every file was just written or read).
Downloads: one 1 GiB gradient (``GET .../grads/{id}``) against nginx serving the
gradient's raw bytes, and a whole 1 GiB snapshot in 256 gradients as safetensors
(``GET .../safetensors``) against nginx serving the same safetensors file. The same
httpx client streams every body and discards it. Also the local verified restore of the
same gradient, and upload (``client.push`` of the 256-gradient snapshot, committed and
fsynced) against an nginx WebDAV PUT of the same bytes (not fsynced: the peer's ordinary
configuration). Target: download >= 0.5x nginx.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from bench._timing import Row, interleaved, print_rows
from bench.service_list import _free_port, _wait_ready

#: The bytes of the gradient and of the snapshot (GRADVAULT_BENCH_HTTP_BYTES for a quick run).
GIB = int(os.environ.get("GRADVAULT_BENCH_HTTP_BYTES", 1 << 30))
SIZE = f"{GIB / 2**30:g} GiB"

_SERVER = """
import sys, uvicorn
from gradvault.service import Settings, create_app
app = create_app(Settings(store=sys.argv[1], port=int(sys.argv[2])))
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning", access_log=False)
"""

_NGINX = """
worker_processes 1;
daemon off;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections 64; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    client_body_temp_path {root}/body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    client_max_body_size 0;
    server {{
        listen 127.0.0.1:{port};
        root {root}/files;
        location /upload/ {{
            dav_methods PUT;
            create_full_put_path on;
        }}
    }}
}}
"""


def _nginx() -> str | None:
    return shutil.which("nginx") or (
        "/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None
    )


def _download(client: httpx.Client, url: str, expected: int) -> float:
    start = time.perf_counter()
    received = 0
    with client.stream("GET", url) as response:
        response.raise_for_status()
        for piece in response.iter_raw(1 << 20):
            received += len(piece)
    elapsed = time.perf_counter() - start
    if received != expected:
        raise RuntimeError(f"{url}: {received} bytes received, {expected} expected")
    return elapsed


def run() -> list[Row]:
    """Download, local-restore and upload rows; none if nginx is not installed."""
    import gradvault.core as gv

    nginx = _nginx()
    if nginx is None:
        print("http_io: nginx is not installed (apt-get install -y nginx); skipped")
        return []
    root = Path(tempfile.mkdtemp(prefix="gv-bench-http-"))
    (root / "files" / "upload").mkdir(parents=True)
    # nginx's workers run as an unprivileged user: they must reach the files
    root.chmod(0o755)
    (root / "files").chmod(0o755)
    (root / "files" / "upload").chmod(0o777)
    rng = np.random.default_rng(0)
    one = rng.standard_normal(GIB // 4, dtype=np.float32)
    many = [one[i * (GIB // 1024) : (i + 1) * (GIB // 1024)] for i in range(256)]
    big = gv.GradientsParamsRecord([gv.GradientRecordEntry.from_array(gv.ParamId(), "w", one)])
    record = gv.GradientsParamsRecord(
        [gv.GradientRecordEntry.from_array(gv.ParamId(), f"l{i}", a) for i, a in enumerate(many)]
    )

    async def fill() -> tuple[str, str]:
        store = gv.open_store(root / "store")
        try:
            first = await store.write_snapshot(big, run="bench", step=0)
            second = await store.write_snapshot(record, run="bench", step=1)
            return first.id, second.id
        finally:
            await store.close()

    big_id, snapshot_id = asyncio.run(fill())
    pid = str(big.entries[0].param_id)
    one.tofile(root / "files" / "grad.bin")
    port, nginx_port = _free_port(), _free_port()
    (root / "nginx.conf").write_text(_NGINX.format(root=root, port=nginx_port))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRADVAULT_")}
    server = subprocess.Popen(
        [sys.executable, "-c", _SERVER, str(root / "store"), str(port)], env=env
    )
    peer = subprocess.Popen(
        [nginx, "-p", str(root), "-c", str(root / "nginx.conf")], stderr=subprocess.DEVNULL
    )
    ours_url, nginx_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{nginx_port}"
    rows: list[Row] = []
    try:
        with httpx.Client(timeout=600) as client:
            _wait_ready(httpx.Client(base_url=ours_url, timeout=60))
            grad_url = f"{ours_url}/v1/snapshots/{big_id}/grads/{pid}"
            st_url = f"{ours_url}/v1/snapshots/{snapshot_id}/safetensors"
            with (
                client.stream("GET", st_url) as response,
                open(root / "files" / "snapshot.safetensors", "wb") as file,
            ):
                for piece in response.iter_raw(1 << 20):
                    file.write(piece)
            st_size = (root / "files" / "snapshot.safetensors").stat().st_size
            for _ in range(50):
                try:
                    client.get(f"{nginx_url}/grad.bin", headers={"Range": "bytes=0-0"})
                    break
                except httpx.TransportError:
                    time.sleep(0.1)

            def rate(seconds: list[float], nbytes: int) -> list[float]:
                return [nbytes / 2**20 / s for s in seconds]

            downloads = interleaved(
                {
                    "grad": lambda: _download(client, grad_url, GIB),
                    "grad nginx": lambda: _download(client, f"{nginx_url}/grad.bin", GIB),
                    "st": lambda: _download(client, st_url, st_size),
                    "st nginx": lambda: _download(
                        client, f"{nginx_url}/snapshot.safetensors", st_size
                    ),
                },
                repeat=2,
            )
            rows += [
                Row(
                    f"HTTP download, one {SIZE} gradient (MiB/s)",
                    rate(downloads["grad"], GIB),
                    "nginx, same bytes",
                    rate(downloads["grad nginx"], GIB),
                    "<= 2.0 (>= 0.5x nginx)",
                    2.0,
                    higher_better=True,
                    unit="MiB/s",
                ),
                Row(
                    f"HTTP download, {SIZE} snapshot as safetensors (MiB/s)",
                    rate(downloads["st"], st_size),
                    "nginx, same file",
                    rate(downloads["st nginx"], st_size),
                    "<= 2.0 (>= 0.5x nginx)",
                    2.0,
                    higher_better=True,
                    unit="MiB/s",
                ),
            ]

            def local_read() -> float:
                async def read() -> float:
                    store = gv.open_store(root / "store")
                    try:
                        start = time.perf_counter()
                        await store.read_gradient(big_id, pid)
                        return time.perf_counter() - start
                    finally:
                        await store.close()

                return asyncio.run(read())

            local = [local_read() for _ in range(2)]
            rows.append(
                Row(
                    f"HTTP download vs local verified restore, {SIZE} gradient (MiB/s)",
                    rate(downloads["grad"], GIB),
                    "local restore",
                    rate(local, GIB),
                    higher_better=True,
                    unit="MiB/s",
                )
            )

            from gradvault.client import Client

            payload = (root / "files" / "snapshot.safetensors").read_bytes()
            with Client(ours_url, timeout=600) as api:

                def push() -> float:
                    start = time.perf_counter()
                    api.push(record, run="bench-upload", step=0)
                    return time.perf_counter() - start

                def put() -> float:
                    start = time.perf_counter()
                    client.put(f"{nginx_url}/upload/snapshot.safetensors", content=payload)
                    return time.perf_counter() - start

                uploads = interleaved({"push": push, "put": put}, repeat=2)
            rows.append(
                Row(
                    f"HTTP upload, {SIZE} snapshot (MiB/s; ours committed and fsynced)",
                    rate(uploads["push"], len(payload)),
                    "nginx WebDAV PUT",
                    rate(uploads["put"], len(payload)),
                    higher_better=True,
                    unit="MiB/s",
                )
            )
    finally:
        server.terminate()
        peer.terminate()
        server.wait(30)
        peer.wait(30)
        shutil.rmtree(root, ignore_errors=True)
    print_rows("HTTP: service against nginx", rows)
    return rows


if __name__ == "__main__":
    run()
