"""``python -m bench``: every benchmark in one run; ratios against peers measured alongside."""

from __future__ import annotations

import platform
import sys
from datetime import UTC, datetime

from bench import mlp_step, record_stall, service_list, store_io, ui_first_paint

MODULES = [mlp_step, record_stall, store_io, service_list, ui_first_paint]


def main() -> None:
    print(
        f"# gradvault benchmarks, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
        f"{platform.machine()}, Python {sys.version.split()[0]}"
    )
    for module in MODULES:
        module.run()


if __name__ == "__main__":
    main()
