"""Exclusive ownership of an output path while a command writes it.

Two runs writing one output must never interleave: the second would append to (or rename over)
files the first is still producing, and both could exit 0 with a corrupt result. Every command
that writes an output (preprocess prefix, checkpoint ``save_path``, export directory) holds
``exclusive_output(path, what)`` for as long as it writes.

Mechanism: an ``flock`` on ``<path>.lock`` (works across processes and, on Linux, over NFS,
where it is mapped to POSIX record locks). The kernel drops the lock when its holder dies,
however it dies, so a lock file left behind by a killed run is stale by construction and is
taken over (`LockInfo.took_over_stale` names its former owner). The file's content names the
holder (pid, host, start time, what it writes) so that the refusal can say who to wait for.
On filesystems without ``flock`` support (``ENOLCK``/``EOPNOTSUPP``) the file itself is the lock,
created exclusively; a file whose holder is a dead process on this host is stale and replaced.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import time
from pathlib import Path
from typing import Iterator, NamedTuple

from mftk.errors import InputError

LOCK_SUFFIX = ".lock"
_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL}
_ATTEMPTS = 5  # re-tries when the lock file is replaced between open() and flock()


class Holder(NamedTuple):
    """Who holds (or held) a lock, as recorded in the lock file."""

    pid: int | None = None
    host: str = "?"
    started: str = "?"
    what: str = ""

    def describe(self) -> str:
        return f"pid {self.pid if self.pid is not None else '?'} on host {self.host}, started {self.started}"


class LockInfo(NamedTuple):
    """A held lock: its file, and the owner of the stale lock it replaced (if any)."""

    path: Path
    took_over_stale: Holder | None = None
    fd: int | None = None  # the flock'ed descriptor (None without flock): a child given it holds the lock too


def lock_path(path: str | os.PathLike) -> Path:
    """``<path>.lock``: next to the output, so every writer of that output finds it."""
    return Path(os.fspath(path) + LOCK_SUFFIX)


@contextlib.contextmanager
def exclusive_output(path: str | os.PathLike, what: str) -> Iterator[LockInfo]:
    """Hold the exclusive right to write ``path`` for the duration of the block.

    ``what`` says in words what is being written (``"mftk preprocess output"``); it appears in
    the error a concurrent run gets. Raises `InputError` (exit 2) naming the other process when
    the output is taken; the lock file is removed when the block ends, whatever the outcome.
    """
    target = lock_path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, stale = _acquire(target, path, what)
    except OSError as exc:
        raise InputError(message=f"{target}: cannot create the lock file ({exc.strerror or exc})",
                         path=str(target), hint="choose a writable output location") from None
    try:
        yield LockInfo(target, stale, fd)
    finally:
        _release(target, fd)


def read_holder(target: Path) -> Holder | None:
    """The holder recorded in a lock file, or None when it is missing or unreadable."""
    try:
        with open(target, "rb") as f:
            data = json.loads(f.read(4096) or b"null")
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    pid = data.get("pid")
    return Holder(pid if isinstance(pid, int) else None, str(data.get("host", "?")), str(data.get("started", "?")),
                  str(data.get("what", "")))


def _acquire(target: Path, path: str | os.PathLike, what: str) -> tuple[int | None, Holder | None]:
    for _ in range(_ATTEMPTS):
        fd, created = _open(target)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = read_holder(target)
            os.close(fd)
            raise _busy(path, target, holder, what) from None
        except OSError as exc:
            if exc.errno not in _NO_FLOCK:
                os.close(fd)
                raise
            if created:  # exclusive creation succeeded: the file is ours
                try:
                    _write_holder(fd, what)
                finally:
                    os.close(fd)
                return None, None
            os.close(fd)
            return None, _acquire_by_file(target, path, what)
        if not _same_file(fd, target):  # the holder removed the file as we opened it: take the new one
            os.close(fd)
            continue
        previous = read_holder(target)
        try:
            _write_holder(fd, what)
        except OSError:
            _release(target, fd)
            raise
        return fd, previous if previous is not None and previous.pid is not None else None
    raise InputError(message=f"{target}: the lock file keeps changing; another run is starting and stopping",
                     path=str(target), hint="retry in a moment")


def _acquire_by_file(target: Path, path: str | os.PathLike, what: str) -> Holder | None:
    """Fallback without flock: exclusive creation; a lock of a dead local process is stale."""
    stale = None
    for _ in range(_ATTEMPTS):
        try:
            fd = os.open(target, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            holder = read_holder(target)
            if holder is None or not _dead_here(holder):
                raise _busy(path, target, holder, what) from None
            stale = holder
            with contextlib.suppress(FileNotFoundError):
                target.unlink()
            continue
        try:
            _write_holder(fd, what)
        finally:
            os.close(fd)
        return stale
    raise InputError(message=f"{target}: could not take the lock file", path=str(target), hint="retry in a moment")


def _open(target: Path) -> tuple[int, bool]:
    """Open the lock file, creating it; also say whether this call created it."""
    while True:
        try:
            return os.open(target, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644), True
        except FileExistsError:
            pass
        try:
            return os.open(target, os.O_RDWR | os.O_CLOEXEC), False
        except FileNotFoundError:  # removed by its holder in between: try to create it again
            continue


def _release(target: Path, fd: int | None) -> None:
    # Unlink while still holding the lock, so a waiter that opened the old file re-checks and retries.
    if fd is None:
        holder = read_holder(target)
        if holder is not None and holder.pid == os.getpid() and holder.host == _host():
            with contextlib.suppress(OSError):
                target.unlink()
        return
    try:
        if _same_file(fd, target):
            target.unlink()
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_holder(fd: int, what: str) -> None:
    record = {"pid": os.getpid(), "host": _host(),
              "started": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime()), "what": what}
    data = (json.dumps(record) + "\n").encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    os.fsync(fd)


def _same_file(fd: int, target: Path) -> bool:
    try:
        st = os.stat(target)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def _dead_here(holder: Holder) -> bool:
    """True when the holder ran on this host and its pid no longer exists."""
    if holder.host != _host() or holder.pid is None:
        return False
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _busy(path: str | os.PathLike, target: Path, holder: Holder | None, what: str) -> InputError:
    who = holder.describe() if holder else "a process that did not record itself"
    doing = f" ({holder.what})" if holder and holder.what else ""
    return InputError(message=f"{os.fspath(path)}: another run is writing this output: {who}{doing}",
                      path=os.fspath(path),
                      hint=f"wait for it to finish, or give this {what} another output path; {target.name} "
                      "is released automatically when that process exits")


def _host() -> str:
    """This machine's name, as ``socket.gethostname()`` gives it (without importing socket)."""
    return os.uname().nodename
