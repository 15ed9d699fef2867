"""ParamId: the random 64-bit id that names a parameter and its gradient."""

from __future__ import annotations

import re
import secrets
from functools import total_ordering

from ..errors import InvalidParamIdError, shown

_TEXT = re.compile(r"[0-9a-f]{16}")


@total_ordering
class ParamId:
    """A random 64-bit parameter id; ``str(pid)`` is 16 lowercase hex digits (URL-safe).

    Ids are hashable and ordered by value; ``ParamId.parse(str(pid)) == pid``.
    """

    __slots__ = ("_value",)

    def __init__(self, value: int | None = None) -> None:
        if value is None:
            value = secrets.randbits(64)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**64:
            raise InvalidParamIdError(
                f"a ParamId value is an int in [0, 2**64); got {shown(value)}"
            )
        self._value = value

    @classmethod
    def parse(cls, text: object) -> ParamId:
        """The ParamId whose text form is ``text``; InvalidParamIdError (a ValueError) if none."""
        if not isinstance(text, str) or not _TEXT.fullmatch(text):
            raise InvalidParamIdError(
                f"a ParamId is 16 lowercase hex digits (e.g. '9f3c0a1b2c3d4e5f'); got {shown(text)}"
            )
        return cls(int(text, 16))

    @property
    def value(self) -> int:
        """The id as an unsigned 64-bit integer."""
        return self._value

    def __str__(self) -> str:
        return f"{self._value:016x}"

    def __repr__(self) -> str:
        return f"ParamId('{self}')"

    def __hash__(self) -> int:
        return hash(self._value)

    def __eq__(self, other: object) -> bool:
        return type(other) is ParamId and other._value == self._value

    def __lt__(self, other: ParamId) -> bool:
        if not isinstance(other, ParamId):
            return NotImplemented
        return self._value < other._value


def as_param_id(value: object) -> ParamId:
    """``value`` as a ParamId (its text form is parsed); InvalidParamIdError for anything else."""
    return value if isinstance(value, ParamId) else ParamId.parse(value)
