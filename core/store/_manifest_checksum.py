"""A manifest's checksum of itself (store format 2): what it covers, how it is computed.

Before format 2 a gradient's name, and a packed gradient's dtype and shape of the same
byte count, appeared only in the manifest: edited in place, they were read as edited.
From format 2 every manifest (a snapshot's, a sharded snapshot's, each shard's) carries
``manifest_checksum``, the crc32c of its canonical JSON without that field, and a reader
refuses a manifest that does not hash to it. docs/FORMAT.md ("The manifest's checksum")
gives the canonical form exactly, for other readers.

The canonical form is orjson's compact encoding with sorted keys: the format writes its
rules out (floats included), and tests/core/store_files.py computes them apart from orjson,
so a release of orjson that wrote otherwise would fail the suite rather than the stores.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..errors import FormatVersionError, ManifestError
from ._checksums import crc32c, format_checksum, parse_checksum

#: The manifest key that holds the manifest's checksum of itself (format 2 on).
MANIFEST_CHECKSUM_KEY = "manifest_checksum"
#: Store format versions this release reads: 1 (no checksum of the manifest), 2 and 3
#: (chunk keys ``c.0.1``, not ``c/0/1``).
READABLE_FORMAT_VERSIONS = (1, 2, 3, 4)
#: The first format version whose manifests carry their checksum.
_SEALED_FROM = 2


def canonical_manifest(manifest: dict[str, Any]) -> bytes:
    """The bytes ``manifest_checksum`` covers: the manifest without that key, as canonical
    JSON (keys sorted by code point, no whitespace, UTF-8, floats as docs/FORMAT.md says)."""
    body = {key: value for key, value in manifest.items() if key != MANIFEST_CHECKSUM_KEY}
    return orjson.dumps(body, option=orjson.OPT_SORT_KEYS)


def manifest_checksum(manifest: dict[str, Any]) -> str:
    """``"crc32c:<8 hex>"`` of :func:`canonical_manifest`."""
    return format_checksum(crc32c(canonical_manifest(manifest)))


def seal(manifest: dict[str, Any]) -> dict[str, Any]:
    """``manifest`` with its ``manifest_checksum`` set (in place, as its last key)."""
    manifest.pop(MANIFEST_CHECKSUM_KEY, None)
    manifest[MANIFEST_CHECKSUM_KEY] = manifest_checksum(manifest)
    return manifest


def check_sealed(manifest: dict[str, Any], where: str) -> None:
    """Raise unless ``manifest`` is of a format this release reads and, from format 2,
    hashes to its own ``manifest_checksum``.

    FormatVersionError for another version; ManifestError (a FormatVersionError) for a
    manifest of format 2 on without a well-formed checksum or edited since it was written,
    and for a format 1 manifest that carries one (a later manifest whose version was edited).
    """
    version = manifest.get("format_version")
    if type(version) is not int or version not in READABLE_FORMAT_VERSIONS:
        *earlier, last = (str(v) for v in READABLE_FORMAT_VERSIONS)
        readable = f"{', '.join(earlier)} and {last}" if earlier else last
        raise FormatVersionError(
            f"{where} has store format version {version!r}; this release reads versions {readable}"
        )
    said = manifest.get(MANIFEST_CHECKSUM_KEY)
    if version < _SEALED_FROM:
        if MANIFEST_CHECKSUM_KEY in manifest:
            raise ManifestError(
                f"{where}: its manifest says format_version {version}, which carries no "
                f"{MANIFEST_CHECKSUM_KEY}; found {MANIFEST_CHECKSUM_KEY} {said!r} (a format "
                f"{_SEALED_FROM} manifest whose version was edited?)"
            )
        return
    try:
        expected = parse_checksum(said)
    except ValueError:
        raise ManifestError(
            f"{where}: manifest field {MANIFEST_CHECKSUM_KEY!r} should be 'crc32c:<8 hex "
            f"digits>' (format_version {version}); found {said!r}"[:600]
        ) from None
    found = crc32c(canonical_manifest(manifest))
    if found != expected:
        raise ManifestError(
            f"{where}: its manifest fails its checksum: {MANIFEST_CHECKSUM_KEY} says "
            f"{format_checksum(expected)}, the manifest hashes to {format_checksum(found)} "
            f"(edited or damaged since it was written)"
        )
