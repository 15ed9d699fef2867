"""What a snapshot can hold: one rule per field, for the writer and the reader alike.

A record is written by one process and read back by another, maybe much later, so any
value the writer takes must be one the reader takes. ``GradientsParams.register``, record
and entry construction, ``write_snapshot`` and the recorder check these rules before
anything is written; the store's manifest validation checks what it reads with the same
ones. Each rule is a predicate (``is_name``) and the words messages use for what was
expected (``NAME_EXPECTED``); ``first_invalid_*`` return the position of the first entry
of a whole manifest column that the rule refuses, at C speed when every entry is fine.

Text (names, run, tags) is any ``str`` that UTF-8 can encode: empty names, control
characters and any other code point round-trip through the JSON manifest unchanged; only
lone surrogates (``"\\ud800"``), which no JSON encoder can write, are refused.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from itertools import chain
from typing import Any, SupportsInt, cast

import numpy as np

from ..errors import DtypeMismatchError, InvalidFieldError, ShapeMismatchError, shown
from .dtypes import BFLOAT16_NAME

#: dtypes a record may carry; names follow NumPy (and zarr's v3 data type names; bfloat16
#: is ml_dtypes' and Zarr's registered extension data type, docs/FORMAT.md).
SUPPORTED_DTYPES = (
    "float16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "bool",
    BFLOAT16_NAME,
)
_SUPPORTED = frozenset(SUPPORTED_DTYPES)

#: the record's dtype name of each NumPy dtype it can hold, native or little-endian
DTYPE_NAMES: Mapping[np.dtype, str] = {
    **{np.dtype(name).newbyteorder("<"): name for name in SUPPORTED_DTYPES},
    **{np.dtype(name): name for name in SUPPORTED_DTYPES},
}

#: how deep metadata may nest (objects and lists)
MAX_METADATA_DEPTH = 64

#: the largest step: an int64, which every JSON reader in common use holds exactly
MAX_STEP = 2**63 - 1

NAME_EXPECTED = "a string (any text UTF-8 can encode)"
RUN_EXPECTED = "a non-empty string (any text UTF-8 can encode)"
STEP_EXPECTED = f"an int from 0 to {MAX_STEP}"
TAGS_EXPECTED = "an object mapping strings to strings"
DTYPE_EXPECTED = f"one of {', '.join(SUPPORTED_DTYPES)}"
SHAPE_EXPECTED = "a list of ints >= 0"
METADATA_EXPECTED = "an object of JSON values (str keys; finite numbers; ints within 64 bits)"

#: the most dimensions an array may have (NumPy's own limit)
MAX_DIMS = 64
#: the most bytes an array's item size times its non-zero dimensions may come to (NumPy
#: sizes arrays in signed 64-bit ints; it checks an empty array's other dimensions too)
MAX_ARRAY_BYTES = 2**63 - 1

_JSON_INT_MIN, _JSON_INT_MAX = -(2**63), 2**64 - 1  # what the manifest's JSON encoder writes


def is_text(value: object) -> bool:
    """Whether ``value`` is a str that UTF-8 (and so JSON) can encode."""
    if not isinstance(value, str):
        return False
    if value.isascii():
        return True
    try:
        value.encode()
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True


def is_name(value: object) -> bool:
    """Whether ``value`` can be a gradient's name (its module path; "" when unknown)."""
    return is_text(value)


def is_run(value: object) -> bool:
    return is_text(value) and value != ""


def is_step(value: object) -> bool:
    """Whether ``value`` is a step: an integer (a NumPy one too, never a bool) in range."""
    if type(value) is int:  # the common case, without an abstract class's isinstance
        return 0 <= value <= MAX_STEP
    return (
        isinstance(value, numbers.Integral)
        and not isinstance(value, bool | np.bool_)
        and 0 <= int(value) <= MAX_STEP
    )


def is_tags(value: object) -> bool:
    return (type(value) is dict or isinstance(value, Mapping)) and all(
        is_text(key) and is_text(text) for key, text in value.items()
    )


def is_dtype_name(value: object) -> bool:
    return isinstance(value, str) and value in _SUPPORTED


def is_shape(value: object) -> bool:
    """Whether ``value`` is a shape as a record holds it: a tuple or list of ints >= 0."""
    return isinstance(value, tuple | list) and all(type(n) is int and n >= 0 for n in value)


def array_shape_problem(shape: Sequence[int], itemsize: int) -> str | None:
    """Why NumPy could not hold an array of ``shape`` (ints >= 0) and ``itemsize``, or None.

    Checked before any array is made: NumPy's own refusal is a plain ValueError, and a
    shape such as ``[0, 2**62]`` holds no bytes, so no byte count would catch it.
    """
    if len(shape) > MAX_DIMS:
        return f"{len(shape)} dimensions; expected at most {MAX_DIMS} (NumPy's limit)"
    extent = itemsize
    for n in shape:
        if n:
            extent *= n
            if extent > MAX_ARRAY_BYTES:
                return (
                    f"its non-zero dimensions times its item size ({itemsize} bytes) come to "
                    f"more than {MAX_ARRAY_BYTES} bytes; expected at most {MAX_ARRAY_BYTES} "
                    "(NumPy's limit, which an empty array's dimensions must meet too)"
                )
    return None


def json_problem(value: object, where: str = "metadata", depth: int = 0) -> str | None:
    """Where and why ``value`` is not JSON the manifest can hold unchanged, or None.

    Containers may nest at most ``MAX_METADATA_DEPTH`` levels: the manifest's JSON encoder
    stops at 255 and readers' parsers earlier, so deeper metadata could not be written.
    """
    if depth > MAX_METADATA_DEPTH:
        return f"{where} nests more than {MAX_METADATA_DEPTH} levels deep"
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, str):
        return None if is_text(value) else f"{where} is a string UTF-8 cannot encode"
    if isinstance(value, int):
        if _JSON_INT_MIN <= value <= _JSON_INT_MAX:
            return None
        return f"{where} is {value}, beyond 64 bits"
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{where} is {value}"
    if type(value) is dict or isinstance(value, Mapping):
        for key, item in value.items():
            if not is_text(key):
                return f"{where} has the key {key!r}, not a string"
            problem = json_problem(item, f"{where}[{key!r}]", depth + 1)
            if problem is not None:
                return problem
        return None
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            problem = json_problem(item, f"{where}[{i}]", depth + 1)
            if problem is not None:
                return problem
        return None
    return f"{where} is a {type(value).__name__}, not a JSON value"


# ---------------------------------------------------------------------- writer side
def check_dtype(dtype: np.dtype, param_id: object, name: object) -> str:
    """The record's name for ``dtype``; DtypeMismatchError naming the param if unsupported."""
    found = DTYPE_NAMES.get(dtype)
    if found is None:
        raise DtypeMismatchError(
            f"gradient for param {param_id} ({name!r}) has dtype {dtype}; a snapshot holds "
            f"{DTYPE_EXPECTED}"
        )
    return found


def check_name(name: object, param_id: object) -> str:
    """``name`` as a plain str; InvalidFieldError naming the param if it cannot be written."""
    if not is_name(name):
        raise InvalidFieldError(
            f"gradient for param {param_id} has name {shown(name)}; expected {NAME_EXPECTED}"
        )
    return str(name)


def check_shape(shape: object, param_id: object, name: object) -> tuple[int, ...]:
    """``shape`` as a tuple of Python ints; ShapeMismatchError unless every dim is an int >= 0.

    NumPy integers are taken; bools, floats and anything else are refused (never truncated).
    """
    try:
        dims = tuple(
            int(n) if isinstance(n, np.integer) else n
            for n in shape  # type: ignore[attr-defined]
        )
    except TypeError:
        dims = None
    if dims is None or not is_shape(dims):
        raise ShapeMismatchError(
            f"gradient for param {param_id} ({name!r}) has shape {shape!r}; expected "
            "a sequence of ints >= 0"
        )
    return dims


def check_array_shape(
    shape: tuple[int, ...], itemsize: int, param_id: object, name: object
) -> tuple[int, ...]:
    """``shape`` if NumPy can hold it (:func:`array_shape_problem`), else ShapeMismatchError."""
    problem = array_shape_problem(shape, itemsize)
    if problem is not None:
        # cut short: a shape of thousands of dims may come from a file
        raise ShapeMismatchError(
            f"gradient for param {param_id} ({name!r}) has shape {shown(shape)}: {problem}"
        )
    return shape


def check_snapshot_fields(
    run: object, step: object, tags: object
) -> tuple[str, int, dict[str, str]]:
    """``(run, step, tags)`` as plain str, int and dict; InvalidFieldError if one is unwritable."""
    if not is_run(run):
        raise InvalidFieldError(f"run must be {RUN_EXPECTED}; got {shown(run)}")
    if not is_step(step):
        raise InvalidFieldError(f"step must be {STEP_EXPECTED}; got {shown(step)}")
    if tags is not None and not is_tags(tags):
        raise InvalidFieldError(f"tags must be {TAGS_EXPECTED}; got {shown(tags)}")
    checked_tags = cast("Mapping[str, str] | None", tags)  # is_tags said so
    plain_tags = {str(key): str(text) for key, text in (checked_tags or {}).items()}
    return str(run), int(cast("SupportsInt", step)), plain_tags  # is_step said so


def check_metadata(metadata: object) -> dict[str, Any]:
    """``metadata`` as a dict; InvalidFieldError naming the part that is not JSON."""
    if metadata is None:
        return {}
    if type(metadata) is not dict and not isinstance(metadata, Mapping):
        raise InvalidFieldError(
            f"record metadata must be {METADATA_EXPECTED}; got a {type(metadata).__name__}"
        )
    problem = json_problem(metadata)
    if problem is not None:
        raise InvalidFieldError(f"record metadata must be {METADATA_EXPECTED}; {problem}")
    return dict(metadata)


# ---------------------------------------------------------------------- reader side
def first_invalid_name(names: list) -> int | None:
    """The position of the first entry of ``names`` that :func:`is_name` refuses, or None."""
    try:
        "".join(names).encode()  # a TypeError for a non-str, UnicodeEncodeError for a surrogate
    except (TypeError, UnicodeEncodeError):
        return next(i for i, name in enumerate(names) if not is_name(name))
    return None


def first_invalid_dtype(dtypes: list) -> int | None:
    """The position of the first entry of ``dtypes`` that :func:`is_dtype_name` refuses."""
    try:
        if set(map(type, dtypes)) <= {str} and set(dtypes) <= _SUPPORTED:
            return None
    except TypeError:  # an unhashable entry
        pass
    return next(i for i, dtype in enumerate(dtypes) if not is_dtype_name(dtype))


def first_invalid_shape(shapes: Sequence) -> int | None:
    """The position of the first entry of ``shapes`` that :func:`is_shape` refuses."""
    if set(map(type, shapes)) <= {list, tuple}:
        dims = list(chain.from_iterable(shapes))
        if set(map(type, dims)) <= {int} and (not dims or min(dims) >= 0):
            return None
    return next(i for i, shape in enumerate(shapes) if not is_shape(shape))
