"""Where the file system puts a local store's new folders: each snapshot apart.

A snapshot is a folder of its own (with a folder per large gradient), made in
``.staging/`` and renamed into ``snapshots/``. ext2, ext3 and ext4 place a new folder's
inode, and the files and blocks under it, in the block group of the folder that holds it,
unless that folder carries the "top of directory hierarchies" flag (``FS_TOPDIR_FL``,
``chattr +T``): then the group of each new folder in it is chosen afresh, as for a
folder made at the file system's root (the group with the fewest folders among those
with more free inodes and blocks than the mean, searched from a point drawn from the
folder's name): most often another group than the last one's. That is what a snapshot
is: a hierarchy unrelated to the one before it. So the store sets the flag on
``.staging/``.

Why it matters: on ext4 without a journal the kernel passes over every inode of a group
freed in the last minute (six, while its inode table block is dirty) before it hands out
a new one there, so a store that deletes snapshots (retention, or a bench that removes
what it wrote) makes each new snapshot's folders and files, without the flag, where the
last deleted one's were just freed, and pays for each new inode a walk over them
(docs/FORMAT.md, "Local I/O").

The flag is a hint and nothing depends on it: a file system without it (tmpfs, XFS,
btrfs answer ``ENOTTY``, ``EOPNOTSUPP`` or ``EINVAL``), a folder the process may not
change (``EPERM``), or a platform without the call leaves ``.staging/`` as it is.
"""

from __future__ import annotations

import array
import ctypes
import fcntl
import logging
import os
import sys

_log = logging.getLogger("gradvault.store")


def _ioctl_number(direction: int, number: int) -> int:
    """Linux's ``_IOR``/``_IOW('f', number, long)``: the inode-flags calls of linux/fs.h."""
    return direction << 30 | ctypes.sizeof(ctypes.c_long) << 16 | ord("f") << 8 | number


#: FS_IOC_GETFLAGS and FS_IOC_SETFLAGS (the kernel reads and writes an int through them)
GET_FLAGS = _ioctl_number(2, 1)
SET_FLAGS = _ioctl_number(1, 2)
#: FS_TOPDIR_FL: "top of directory hierarchies", chattr's ``T``
TOP_OF_HIERARCHIES = 0x00020000

_FOLDER_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)


def spread_subfolders(folder: str) -> bool:
    """Set ``FS_TOPDIR_FL`` on ``folder`` (kept if set already, its other flags as they
    are), so that the file system places each folder made in it apart from the others;
    False where the file system, the platform or the folder's owner refuses (a hint only:
    nothing else changes)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        fd = os.open(folder, _FOLDER_FLAGS)
    except OSError as error:
        _log.debug("not spreading the folders made in %s: %s", folder, error)
        return False
    try:
        flags = array.array("i", [0])
        fcntl.ioctl(fd, GET_FLAGS, flags, True)
        if flags[0] & TOP_OF_HIERARCHIES:
            return True
        flags[0] |= TOP_OF_HIERARCHIES
        fcntl.ioctl(fd, SET_FLAGS, flags, True)
    except OSError as error:
        _log.debug("not spreading the folders made in %s: %s", folder, error)
        return False
    finally:
        os.close(fd)
    return True
