"""One `engram up` per data dir: an advisory lock on `<data dir>/engram-up.lock`.

The lock is `fcntl.flock` on an open file: the kernel drops it when the holder exits, however it
exits (SIGKILL included), so a crashed stack never leaves a stale lock behind. The holder writes
its pid into the file so a refused second start can name it. The file itself is never deleted:
unlinking a lock file lets a waiting opener lock the old inode while a newcomer locks a new one.
POSIX only (like the embedded servers engram starts).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_FILE = "engram-up.lock"


class DataDirLocked(RuntimeError):
    """Another live process holds the data dir's lock."""

    def __init__(self, data_dir: Path, pid: int | None) -> None:
        self.data_dir = data_dir
        self.pid = pid
        who = f"pid {pid}" if pid else "another process"
        super().__init__(
            f"{data_dir} is in use by a running engram (supervisor {who}); stop it first "
            f"(kill -TERM {pid or '<pid>'}) or give another --data-dir"
        )


def _read_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip() or 0) or None
    except (OSError, ValueError):
        return None


class DataDirLock:
    """Exclusive, non-blocking lock of one data dir, held until release() or process exit."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.path = data_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise DataDirLocked naming the holder's pid."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by children (PEP 446)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise DataDirLocked(self.data_dir, pid) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None

    def __enter__(self) -> DataDirLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_holder(data_dir: Path) -> int | None:
    """The pid holding data_dir's lock (0 if held by an unknown pid), or None when nobody holds it."""
    path = data_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_pid(fd) or 0
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
