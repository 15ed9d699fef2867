"""new_file_mode: the mode a file created now gets from the process's umask.

Downloads are written to a part file that ``mkstemp`` makes 0600 while it fills; once
whole it takes this mode (0644 under the usual umask 022), as curl's and wget's downloads
do, just before the rename. The client and the CLI both write such files.
"""

from __future__ import annotations

import os


def current_umask() -> int:
    """The process's umask, read without changing it where Linux shows it (``/proc``).

    Elsewhere it is set and put back at once: ``os.umask`` has no way only to read it.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def new_file_mode() -> int:
    """The permission bits ``open(..., "w")`` would give a new file here: 0o666 less the umask."""
    return 0o666 & ~current_umask()
