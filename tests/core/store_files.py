"""The files (or objects) of a store, reached around gradvault, to damage them in tests.

Keys are relative to the store root (``snapshots/<id>/<array>/c.0``), as the backends
name them; the local one can also put a FIFO, a folder or a symbolic link in a file's place.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import google_crc32c

from .conftest import S3_BUCKET


def is_chunk_key(key: str) -> bool:
    """Whether ``key`` names a chunk: ``c.0.1`` (``c/0/1`` before format 3), or ``c`` of a
    0-d array."""
    name = key.rpartition("/")[2]
    return name == "c" or name.startswith("c.") or "/c/" in key


class LocalFiles:
    def __init__(self, root: Path) -> None:
        self.root = root

    def keys(self, snapshot_id: str) -> list[str]:
        folder = self.root / "snapshots" / snapshot_id
        return sorted(
            str(path.relative_to(self.root)) for path in folder.rglob("*") if path.is_file()
        )

    def read(self, key: str) -> bytes:
        path = self.root / key
        if not path.is_file():  # opening a FIFO would wait for a writer
            raise OSError(f"{path} is not a regular file")
        return path.read_bytes()

    def write(self, key: str, data: bytes) -> None:
        """Replace the file (a new inode, as an editor would save it)."""
        path = self.root / key
        temporary = path.with_name(path.name + ".new")
        temporary.write_bytes(data)
        os.replace(temporary, path)

    def delete(self, key: str) -> None:
        (self.root / key).unlink()

    def replace_with_fifo(self, key: str) -> None:
        self.delete(key)
        os.mkfifo(self.root / key)

    def replace_with_folder(self, key: str) -> None:
        self.delete(key)
        (self.root / key).mkdir()
        (self.root / key / "0").write_bytes(b"\0" * 8)

    def replace_with_link(self, key: str, target: Path) -> None:
        self.delete(key)
        (self.root / key).symlink_to(target)


class S3Files:
    def __init__(self, client: Any, prefix: str) -> None:
        self.client = client
        self.prefix = prefix

    def keys(self, snapshot_id: str) -> list[str]:
        start = f"{self.prefix}/snapshots/{snapshot_id}/"
        found: list[str] = []
        for page in self.client.get_paginator("list_objects_v2").paginate(
            Bucket=S3_BUCKET, Prefix=start
        ):
            found += [item["Key"][len(self.prefix) + 1 :] for item in page.get("Contents", [])]
        return sorted(found)

    def read(self, key: str) -> bytes:
        return self.client.get_object(Bucket=S3_BUCKET, Key=f"{self.prefix}/{key}")["Body"].read()

    def write(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=S3_BUCKET, Key=f"{self.prefix}/{key}", Body=data)

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=S3_BUCKET, Key=f"{self.prefix}/{key}")


def store_files(store_url: str, boto3_client: Any | None) -> LocalFiles | S3Files:
    if store_url.startswith("s3://"):
        return S3Files(boto3_client, store_url.removeprefix(f"s3://{S3_BUCKET}/"))
    return LocalFiles(Path(store_url))


def manifest_key(snapshot_id: str) -> str:
    return f"snapshots/{snapshot_id}/zarr.json"


def manifest_checksum(manifest: dict[str, Any]) -> str:
    """A manifest's checksum of itself as docs/FORMAT.md defines it, computed apart from
    gradvault and orjson: crc32c of the canonical JSON of the manifest without the field."""
    body = {key: value for key, value in manifest.items() if key != "manifest_checksum"}
    return f"crc32c:{google_crc32c.value(canonical_json(body).encode('utf-8')):08x}"


def canonical_json(value: Any) -> str:
    """docs/FORMAT.md's canonical JSON, written from its rules: keys sorted, no whitespace,
    strings as ``json`` escapes them, floats by ``canonical_float``."""
    if isinstance(value, dict):
        members = (
            f"{json.dumps(k, ensure_ascii=False)}:{canonical_json(value[k])}" for k in sorted(value)
        )
        return "{" + ",".join(members) + "}"
    if isinstance(value, list):
        return "[" + ",".join(canonical_json(item) for item in value) + "]"
    if isinstance(value, float):
        return canonical_float(value)
    return json.dumps(value, ensure_ascii=False)  # str, int, bool, None


def canonical_float(x: float) -> str:
    """The shortest digits that read back to ``x`` (those of ``repr``); positional for
    1e-5 <= |x| < 1e16 and for zeros, with at least one digit after the point; otherwise
    ``d[.ddd]e<sign><exponent>`` with no zeros before the exponent's digits."""
    text = repr(x)
    mantissa, _, exponent = text.partition("e")
    if x == 0 or 1e-5 <= abs(x) < 1e16:
        if not exponent:
            return text
        sign = "-" if mantissa.startswith("-") else ""  # repr's 1e-05 <= |x| < 1e-04
        digits = mantissa.lstrip("-").replace(".", "")
        return f"{sign}0.{'0' * (-int(exponent) - 1)}{digits.rstrip('0')}"
    power = int(exponent)
    mantissa = mantissa.removesuffix(".0")
    return f"{mantissa}e{'+' if power >= 0 else '-'}{abs(power)}"


def reseal(document: dict[str, Any]) -> None:
    """Set the checksum of the manifest in a group ``zarr.json`` (if it carries one) to
    what the manifest now hashes to: a manifest damaged as a writer could have written it."""
    attributes = document.get("attributes")
    manifest = attributes.get("gradvault") if isinstance(attributes, dict) else None
    if isinstance(manifest, dict) and "manifest_checksum" in manifest:
        manifest["manifest_checksum"] = manifest_checksum(manifest)


def edit_json(files: LocalFiles | S3Files, key: str, edit: Any, *, sealed: bool = True) -> None:
    """Rewrite a ``zarr.json``: ``edit(document)`` changes it in place. With ``sealed``, a
    manifest's checksum is then recomputed, so that what is tested is what the reader makes
    of the edited fields, not the checksum (which refuses any edit it does not match)."""
    document = json.loads(files.read(key))
    edit(document)
    if sealed:
        reseal(document)
    files.write(key, json.dumps(document).encode())
