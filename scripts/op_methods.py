"""Write Tensor's op-method declarations into core/autodiff/tensor.py from the op table.

The op table adds these methods when the ops register (core/autodiff/op_table.py); a
type checker does not run that, so tensor.py declares them under ``if TYPE_CHECKING:``.
Run this after adding an op or changing a registration or an op's signature::

    .venv/bin/python scripts/op_methods.py

tests/core/autodiff/test_op_table.py fails while the declarations differ from the table.
"""

from __future__ import annotations

import sys
from pathlib import Path

import gradvault.core  # noqa: F401  (importing the core registers every op)
from gradvault.core.autodiff import tensor
from gradvault.core.autodiff.op_table import DECLARATIONS_BEGIN, DECLARATIONS_END, op_table


def main() -> int:
    path = Path(tensor.__file__)
    text = path.read_text()
    if text.count(DECLARATIONS_BEGIN) != 1 or text.count(DECLARATIONS_END) != 1:
        print(
            f"{path}: expected the lines {DECLARATIONS_BEGIN.strip()!r} and "
            f"{DECLARATIONS_END.strip()!r} once each around the declarations",
            file=sys.stderr,
        )
        return 1
    head, rest = text.split(DECLARATIONS_BEGIN)
    _, tail = rest.split(DECLARATIONS_END)
    new = head + DECLARATIONS_BEGIN + op_table.method_declarations() + DECLARATIONS_END + tail
    if new == text:
        print(f"{path}: the op methods are up to date")
    else:
        path.write_text(new)
        print(f"{path}: the op methods written")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
