"""Every snapshot command as ``main(argv)`` runs it (the console script and ``python -m``
through a new process), against ``gradvault serve`` on loopback: what it prints, what it
leaves behind, and its exit status and error line when it fails."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import numpy as np
import pytest

from gradvault.core import GradientsParamsRecord
from gradvault.core.records.safetensors_file import record_from_safetensors

from .conftest import READ_TOKEN, WRITE_TOKEN, Result, ServeProcess, make_record, write_safetensors

COMMANDS = ["serve", "ls", "show", "pull", "push", "rm", "gc", "demo"]


def as_arrays(record: GradientsParamsRecord) -> dict[str, np.ndarray]:
    return {str(entry.param_id): np.array(entry.array) for entry in record}


def same_arrays(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and a[k].tobytes() == b[k].tobytes()
        for k in a
    )


def one_error_line(result: Result, *needles: str) -> str:
    """The failure's single stderr line, after checking it names each of ``needles``."""
    assert len(result.error_lines) == 1, result.err
    line = result.error_lines[0]
    assert "Traceback" not in result.err
    for needle in needles:
        assert needle in line, line
    return line


def pushed_id(result: Result) -> str:
    assert result.code == 0, result.err
    return json.loads(result.out)["id"]


# ---------------------------------------------------------------------- help and usage
@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_everywhere(gradvault, command: str | None) -> None:
    result = gradvault(*([command] if command else []), "--help")
    assert result.code == 0, result.err
    assert result.out.startswith("usage: gradvault" + (f" {command}" if command else ""))
    if command is None:
        for name in COMMANDS:
            assert f"\n    {name} " in result.out


def test_console_script_and_python_m_gradvault_cli(tmp_path: Path) -> None:
    import subprocess
    import sys

    script = Path(sys.executable).parent / "gradvault"
    for command in ([str(script)], [sys.executable, "-m", "gradvault.client.cli"]):
        done = subprocess.run(
            [*command, "--version"], capture_output=True, text=True, cwd=tmp_path, check=False
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("gradvault ")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["ls", "--bogus"], "unrecognized arguments: --bogus"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["pull", "01JAAAAAAAAAAAAAAAAAAAAAAA"], "-o/--output"),
        (["push", "x.safetensors", "--step", "1"], "--run"),
        (["ls", "--limit", "-3"], "expected an integer >= 0"),
        (["ls", "--url", "http://127.0.0.1:1", "--store", "x"], "not allowed with argument"),
        (["push", "grads.txt", "--run", "r", "--step", "1"], "neither"),
        (["push", "x.npz", "--run", "r", "--step", "1", "--tag", "nokey"], "KEY=VALUE"),
        (["pull", "01JAAAAAAAAAAAAAAAAAAAAAAA", "-o", "out.pt"], ".safetensors or .npz"),
        (["ls", "--store", "x", "--token", "t"], "--token is for a service"),
        (["ls", "--url", "ftp://example"], "http:// or https:// URL"),
        (["gc"], "--keep-last"),
        (["gc", "--store", ".", "--run", "r"], "--run chooses"),
        (["gc", "--keep-every", "0"], "expected an integer >= 1"),
        (["demo", "--url", "http://127.0.0.1:1", "--keep-serving"], "--keep-serving"),
        (["serve", "--port", "70000"], "--port (GRADVAULT_PORT)"),
        (["serve", "--tokens", "secret-value:admin"], "scope is 'read' or 'write'"),
        (["serve", "--store-options", "[1]"], "expected a JSON object"),
        (["serve", "--host", "0.0.0.0"], "no tokens are configured"),
    ],
)
def test_usage_errors_exit_2_with_one_line(
    gradvault, tmp_path: Path, args: list[str], needle: str
) -> None:
    result = gradvault(*args, cwd=tmp_path)
    assert result.code == 2, (result.out, result.err)
    line = one_error_line(result, needle)
    assert line.startswith("gradvault")
    assert "secret-value" not in result.err  # a token is never echoed back


# ---------------------------------------------------------------------- the service
def test_push_ls_show_pull_rm_round_trip(
    gradvault, service: ServeProcess, tmp_path: Path, gradients_file
) -> None:
    path, record = gradients_file
    where = ["--url", service.url, "--token", WRITE_TOKEN]

    result = gradvault(
        "push", str(path), "--run", "round", "--step", "7", "--tag", "lr=0.1", *where
    )
    assert result.code == 0, result.err
    assert result.out.startswith("pushed ")
    assert "run round, step 7, 3 gradients" in result.out
    snapshot_id = result.out.split()[1].rstrip(":")

    listing = gradvault("ls", "--run", "round", *where)
    assert listing.code == 0, listing.err
    header, row = listing.out.splitlines()
    assert header.split() == ["ID", "RUN", "STEP", "TIME", "(UTC)", "SIZE", "PARAMS", "NaN/Inf"]
    cells = row.split()
    assert cells[:3] == [snapshot_id, "round", "7"] and cells[-2:] == ["3", "none"]

    shown = gradvault("show", snapshot_id, *where)
    assert shown.code == 0, shown.err
    assert f"snapshot     {snapshot_id}" in shown.out and "tags         lr=0.1" in shown.out
    for entry in record:
        line = next(line for line in shown.out.splitlines() if line.startswith(entry.name + " "))
        assert str(entry.param_id) in line and entry.dtype in line

    detail = json.loads(gradvault("show", snapshot_id, "--json", *where).out)
    assert detail["id"] == snapshot_id and detail["tags"] == {"lr": "0.1"}
    assert {g["name"] for g in detail["gradients"]} == {e.name for e in record}

    as_safetensors = tmp_path / "pulled.safetensors"
    pulled = gradvault("pull", snapshot_id, "-o", str(as_safetensors), *where)
    assert pulled.code == 0, pulled.err
    assert pulled.out.startswith(f"wrote {as_safetensors}: snapshot {snapshot_id}")
    assert same_arrays(as_arrays(record_from_safetensors(as_safetensors)), as_arrays(record))

    as_npz = tmp_path / "pulled.npz"
    assert gradvault("pull", snapshot_id, "--output", str(as_npz), *where).code == 0
    with np.load(as_npz) as arrays:
        assert same_arrays({k: arrays[k] for k in arrays}, as_arrays(record))

    again = gradvault("push", str(as_npz), "--run", "round", "--step", "8", "--json", *where)
    second_id = pushed_id(again)
    assert json.loads(again.out)["num_params"] == 3

    removed = gradvault("rm", snapshot_id, second_id, *where)
    assert removed.code == 0, removed.err
    assert removed.out.splitlines() == [f"deleted {snapshot_id}", f"deleted {second_id}"]
    gone = gradvault("show", snapshot_id, *where)
    assert gone.code == 1
    one_error_line(gone, "gradvault show: error: not found:", snapshot_id, "HTTP 404")
    empty = gradvault("ls", "--run", "round", *where)
    assert empty.code == 0 and empty.out.strip() == f"no snapshots at {service.url} for run 'round'"


def test_ls_flags_nan_and_inf(gradvault, service: ServeProcess, tmp_path: Path) -> None:
    path = write_safetensors(tmp_path / "bad.safetensors", make_record(seed=2, nonfinite=True))
    where = ["--url", service.url, "--token", WRITE_TOKEN]
    snapshot_id = pushed_id(
        gradvault("push", str(path), "--run", "nonfinite", "--step", "3", "--json", *where)
    )
    listing = gradvault("ls", "--run", "nonfinite", *where)
    assert listing.out.splitlines()[1].endswith("1 NaN, 2 Inf")
    as_json = json.loads(gradvault("ls", "--run", "nonfinite", "--json", *where).out)
    assert [(s["id"], s["nan_count"], s["inf_count"]) for s in as_json] == [(snapshot_id, 1, 2)]
    shown = gradvault("show", snapshot_id, *where).out
    assert "NaN/Inf      1 NaN, 2 Inf" in shown


def test_environment_supplies_url_and_token(
    gradvault, service: ServeProcess, gradients_file
) -> None:
    from .conftest import clean_environment

    path, _ = gradients_file
    env = clean_environment(GRADVAULT_URL=service.url, GRADVAULT_TOKEN=WRITE_TOKEN)
    result = gradvault("push", str(path), "--run", "from-env", "--step", "1", env=env)
    assert result.code == 0, result.err
    assert gradvault("ls", "--run", "from-env", env=env).out.count("from-env") == 1


def test_wrong_token_fails_naming_authentication(
    gradvault, service: ServeProcess, gradients_file
) -> None:
    path, _ = gradients_file
    wrong = gradvault("ls", "--url", service.url, "--token", "not-a-token")
    assert wrong.code == 1
    one_error_line(wrong, "gradvault ls: error: authentication failed", "--token", "HTTP 401")
    missing = gradvault("ls", "--url", service.url)
    assert missing.code == 1
    one_error_line(missing, "authentication failed", "HTTP 401")
    read_only = gradvault(
        "push", str(path), "--run", "r", "--step", "1", "--url", service.url, "--token", READ_TOKEN
    )
    assert read_only.code == 1
    one_error_line(read_only, "gradvault push: error: authentication failed", "HTTP 403")


@pytest.mark.parametrize("command", ["show", "rm", "pull"])
def test_bad_and_unknown_ids_fail_with_one_line(
    gradvault, service: ServeProcess, tmp_path: Path, command: str
) -> None:
    where = ["--url", service.url, "--token", WRITE_TOKEN]
    extra = ["-o", str(tmp_path / "x.safetensors")] if command == "pull" else []
    malformed = gradvault(command, "not-an-id", *extra, *where)
    assert malformed.code == 1
    one_error_line(malformed, f"gradvault {command}: error:", "not-an-id", "HTTP 400")
    unknown = gradvault(command, "01JAAAAAAAAAAAAAAAAAAAAAAA", *extra, *where)
    assert unknown.code == 1
    one_error_line(unknown, "not found", "01JAAAAAAAAAAAAAAAAAAAAAAA", "HTTP 404")
    assert not (tmp_path / "x.safetensors").exists()
    assert list(tmp_path.iterdir()) == []  # no partial download left behind


def test_debug_prints_the_traceback(gradvault, service: ServeProcess) -> None:
    result = gradvault("show", "not-an-id", "--url", service.url, "--token", WRITE_TOKEN, "--debug")
    assert result.code == 1
    assert "Traceback (most recent call last)" in result.err
    assert result.err.rstrip().splitlines()[-1].startswith("gradvault show: error:")


def test_unreachable_service(gradvault) -> None:
    with socket.socket() as probe:  # a port on loopback where nothing listens
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = gradvault("ls", "--url", f"http://127.0.0.1:{port}", "--retries", "0")
    assert result.code == 1
    one_error_line(result, "cannot reach the service", f"127.0.0.1:{port}")


def test_push_refuses_bad_files(gradvault, service: ServeProcess, tmp_path: Path) -> None:
    where = ["--url", service.url, "--token", WRITE_TOKEN, "--run", "bad", "--step", "1"]
    missing = gradvault("push", str(tmp_path / "absent.safetensors"), *where)
    assert missing.code == 1
    one_error_line(missing, "no such file", "absent.safetensors")

    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    result = gradvault("push", str(garbage), *where)
    assert result.code == 1
    one_error_line(result, "garbage.safetensors is not a gradvault safetensors file")

    not_zip = tmp_path / "plain.npz"
    not_zip.write_bytes(b"hello")
    result = gradvault("push", str(not_zip), *where)
    assert result.code == 1
    one_error_line(result, "plain.npz is not a readable .npz file")

    named = tmp_path / "named.npz"
    np.savez(named, **{"fc.weight": np.ones((2, 2), np.float32)})
    result = gradvault("push", str(named), *where)
    assert result.code == 1
    one_error_line(result, "named.npz", "keyed by its ParamId", "fc.weight")

    folder = tmp_path / "folder.safetensors"
    folder.mkdir()
    result = gradvault("push", str(folder), *where)
    assert result.code == 1
    one_error_line(result, "folder.safetensors")
    listing = gradvault("ls", "--run", "bad", "--url", service.url, "--token", WRITE_TOKEN)
    assert listing.out.startswith("no snapshots")  # nothing was stored


def test_gc_over_the_service_applies_retention(
    gradvault, service: ServeProcess, gradients_file
) -> None:
    path, _ = gradients_file
    where = ["--url", service.url, "--token", WRITE_TOKEN]
    ids = [
        pushed_id(
            gradvault("push", str(path), "--run", "kept", "--step", str(step), "--json", *where)
        )
        for step in range(3)
    ]
    result = gradvault("gc", "--keep-last", "1", "--run", "kept", *where)
    assert result.code == 0, result.err
    assert result.out.strip() == (
        f"retention (keep last 1) deleted 2 snapshot(s): {ids[1]}, {ids[0]}"
    )
    listing = gradvault("ls", "--run", "kept", "--json", *where)
    assert [s["id"] for s in json.loads(listing.out)] == [ids[2]]


# ---------------------------------------------------------------------- --store
def test_store_mode_without_a_service(gradvault, tmp_path: Path, gradients_file) -> None:
    path, record = gradients_file
    store = tmp_path / "store"
    where = ["--store", str(store)]
    first = pushed_id(gradvault("push", str(path), "--run", "s", "--step", "1", "--json", *where))
    second = pushed_id(gradvault("push", str(path), "--run", "s", "--step", "2", "--json", *where))
    assert (store / "snapshots").is_dir()

    listing = gradvault("ls", *where)
    assert [line.split()[0] for line in listing.out.splitlines()[1:]] == [second, first]
    detail = json.loads(gradvault("show", first, "--json", *where).out)
    assert detail["id"] == first and len(detail["gradients"]) == 3
    assert set(detail["gradients"][0]) == {
        "param_id", "name", "dtype", "shape", "nbytes", "checksum", "stats",
    }  # fmt: skip
    assert "L2 NORM" in gradvault("show", first, *where).out

    pulled = tmp_path / "from-store.safetensors"
    assert gradvault("pull", first, "-o", str(pulled), *where).code == 0
    assert same_arrays(as_arrays(record_from_safetensors(pulled)), as_arrays(record))
    pulled_npz = tmp_path / "from-store.npz"
    assert gradvault("pull", first, "-o", str(pulled_npz), *where).code == 0
    with np.load(pulled_npz) as arrays:
        assert same_arrays({k: arrays[k] for k in arrays}, as_arrays(record))

    spool = tmp_path / "spool"
    spool.mkdir()
    collected = gradvault(
        "gc", "--grace-seconds", "0", "--keep-last", "1", "--spool-dir", str(spool), *where
    )
    assert collected.code == 0, collected.err
    assert collected.out.splitlines() == [
        "removed 0 leftover(s) of interrupted writes older than 0 s",
        f"removed 0 orphaned upload(s) (0 bytes) from the spool folder {spool}",
        f"retention (keep last 1) deleted 1 snapshot(s): {first}",
    ]
    assert gradvault("rm", second, *where).out.strip() == f"deleted {second}"
    assert gradvault("ls", *where).out.startswith("no snapshots")
    unknown = gradvault("rm", second, *where)
    assert unknown.code == 1
    one_error_line(unknown, "gradvault rm: error: not found", second)


def test_store_mode_refuses_a_missing_folder(gradvault, tmp_path: Path) -> None:
    result = gradvault("ls", "--store", str(tmp_path / "typo"))
    assert result.code == 1
    one_error_line(result, "no store (no such folder)", "typo")


def test_a_missing_extra_is_named_with_its_install_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    from .conftest import clean_environment

    program = (
        "import sys; sys.modules['httpx'] = None; sys.modules['fastapi'] = None\n"
        "from gradvault.client.cli import main\n"
        "sys.exit(main(sys.argv[1:]))"
    )
    for args, needle in [
        (["ls"], "reaching a service (--url) needs the client extra"),
        (["serve"], "gradvault serve needs the service extra"),
    ]:
        done = subprocess.run(
            [sys.executable, "-c", program, *args],
            capture_output=True,
            text=True,
            env=clean_environment(),
            cwd=tmp_path,
            check=False,
        )
        assert done.returncode == 1, done.stderr
        result = Result(done.returncode, done.stdout, done.stderr)
        one_error_line(result, needle, "pip install 'gradvault[")
