"""safetensors files for upload tests, well-formed and malformed, built byte by byte."""

from __future__ import annotations

import json
import struct

import numpy as np

PARAM_A = "00000000000000a1"
PARAM_B = "00000000000000b2"


def file_bytes(header: dict | str | bytes, data: bytes, *, declared: int | None = None) -> bytes:
    """``8-byte length + header + data``; ``declared`` overrides the length field."""
    if isinstance(header, dict):
        header = json.dumps(header, separators=(",", ":"))
    if isinstance(header, str):
        header = header.encode()
    length = len(header) if declared is None else declared
    return struct.pack("<Q", length) + header + data


def good_tensors() -> tuple[dict, bytes, dict[str, np.ndarray]]:
    """A header, its data, and the arrays it holds (float32 (2, 3) and int64 (4,))."""
    a = np.arange(6, dtype="<f4").reshape(2, 3)
    b = np.arange(4, dtype="<i8") * 7
    header = {
        "__metadata__": {"gradvault.names": json.dumps({PARAM_A: "fc.weight", PARAM_B: "fc.b"})},
        PARAM_B: {"dtype": "I64", "shape": [4], "data_offsets": [0, 32]},
        PARAM_A: {"dtype": "F32", "shape": [2, 3], "data_offsets": [32, 56]},
    }
    return header, b.tobytes() + a.tobytes(), {PARAM_A: a, PARAM_B: b}


def good_file() -> bytes:
    header, data, _ = good_tensors()
    return file_bytes(header, data)


def _edited(change) -> bytes:
    header, data, _ = good_tensors()
    change(header)
    return file_bytes(header, data)


def malformed_files(max_header_bytes: int) -> dict[str, bytes]:
    """Each kind of malformed upload, by name; every one must be refused with a 400."""
    header, data, _ = good_tensors()
    good = file_bytes(header, data)
    text = json.dumps(header, separators=(",", ":"))
    return {
        "truncated-in-length-field": good[:5],
        "truncated-in-header": good[: 8 + len(text) // 2],
        "truncated-in-data": good[:-10],
        "header-over-the-limit": file_bytes("{" + " " * max_header_bytes + "}", b""),
        "length-field-past-the-body": file_bytes(header, data, declared=len(text) + len(data) + 1),
        "header-not-json": file_bytes("{not json" + " " * 8, data),
        "header-not-utf8": file_bytes(b'{"\xff\xfe":1}', data),
        "header-a-list": file_bytes("[1, 2, 3]", b""),
        "lying-offsets": _edited(lambda h: h[PARAM_A].update(data_offsets=[32, 60])),
        "overlapping-tensors": _edited(
            lambda h: (
                h[PARAM_B].update(dtype="F32", shape=[6], data_offsets=[0, 24]),
                h[PARAM_A].update(data_offsets=[8, 32]),
            )
        ),
        "gap-between-tensors": file_bytes(
            {PARAM_A: {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}, bytes(16)
        ),
        "trailing-bytes": good + b"\0" * 8,
        "unknown-dtype": _edited(lambda h: h[PARAM_A].update(dtype="F8_E4M3")),
        "nan-in-header": file_bytes(text.replace('"shape":[4]', '"shape":[NaN]'), data),
        "duplicate-keys": file_bytes(
            text.replace(
                "{", '{"' + PARAM_A + '":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},', 1
            ),
            data,
        ),
        "key-not-a-param-id": _edited(lambda h: h.update({"fc.weight": h.pop(PARAM_A)})),
        "empty-body": b"",
    }
