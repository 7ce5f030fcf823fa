"""msrun's ports on this machine: a job's range is picked free and claimed by the job until it ends.

msrun's scheduler binds the master port P, and its workers use P+1, P+256, P+512 and P+768
(mindspore-cpu.md §4). Finding them free is not enough when two mftk jobs start on one machine at the same
moment (two 4-device jobs on an 8-device host, two test suites): both find the same range free, one
scheduler binds it, and the other job's workers register with the wrong scheduler ("Repeated registration
node: 0 to the scheduler"). So a range is also *claimed*: an exclusive ``flock`` on a file named for its
port, in a directory every user of the machine shares. The claim's descriptor is inherited by the msrun
launcher, its scheduler and workers (as the save path's lock is), so the range stays claimed until the job's
last process is gone, however it ends; the kernel drops a dead process's locks, so nothing is left stale.
A launcher that starts the nodes of one job on this host picks one port for all of them and hands its claim to
node 0 (`CLAIM_ENV`), so that no other job takes the port between the pick and node 0's start.
A process outside mftk can still take a port between the check and msrun's bind: only the check sees it.
"""
from __future__ import annotations

import errno
import fcntl
import os
import random
import socket
import tempfile
from pathlib import Path

import attrs

from mftk.errors import InputError, TrainingError

PORT_OFFSETS = (0, 1, 256, 512, 768)  # scheduler + the worker ports msrun derives (mindspore-cpu.md §4)
RANGE = 1024  # picked bases are this far apart, so two picked ranges never overlap
LOCK_DIR_ENV = "MFTK_PORT_LOCK_DIR"  # where the claim files live (default: <tmp>/mftk-ports, shared by all users)
CLAIM_ENV = "MFTK_PORT_CLAIM"  # "<port>:<fd>": a claim the starting process holds, inherited as descriptor <fd>


@attrs.define
class PortClaim:
    """A claimed port range; ``fd`` holds the lock (None where the claim directory is unusable). An ``inherited``
    claim's descriptor is the starting process's hand-over: it stays open for this process's life, since a
    second attempt of the job on the same port needs it again."""

    port: int
    fd: int | None = None
    inherited: bool = False

    @property
    def fds(self) -> tuple[int, ...]:
        """What the job's processes inherit to keep the claim (`launch`'s ``keep_fds``)."""
        return () if self.fd is None else (self.fd,)

    def release(self) -> None:
        if self.fd is not None and not self.inherited:
            os.close(self.fd)
        self.fd = None

    @property
    def env(self) -> dict[str, str]:
        """What hands this claim to a process started with `fds` (`inherited_claim` reads it there)."""
        return {} if self.fd is None else {CLAIM_ENV: f"{self.port}:{self.fd}"}

    def __enter__(self) -> PortClaim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def claim_dir() -> Path | None:
    """The machine-wide claim directory (sticky and world-writable, like /tmp); None when it cannot be made."""
    d = Path(os.environ.get(LOCK_DIR_ENV) or Path(tempfile.gettempdir()) / "mftk-ports")
    try:
        d.mkdir(mode=0o1777, exist_ok=True)
        if d.stat().st_uid == os.getuid() and d.stat().st_mode & 0o1777 != 0o1777:
            d.chmod(0o1777)  # mkdir's mode is cut by the umask; other users' jobs must create files here too
    except OSError:
        return None
    return d


def _claim_file(port: int) -> Path | None:
    d = claim_dir()
    return None if d is None else d / f"{port}.lock"


def try_claim(port: int) -> PortClaim | None:
    """Claim ``port``'s range for this job; None when another mftk job on this machine holds it."""
    path = _claim_file(port)
    if path is None:
        return PortClaim(port)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)  # flock needs no write access
    except PermissionError:  # a claim file this user cannot read (another user's, mode 0600): treated as held
        return None
    except OSError:
        return PortClaim(port)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        return PortClaim(port)
    os.set_inheritable(fd, False)  # passed on explicitly (pass_fds), never by accident
    return PortClaim(port, fd)


def inherited_claim(port: int) -> PortClaim | None:
    """The claim on ``port`` that the process which started this one handed down (`CLAIM_ENV`), or None: the
    descriptor must be this port's claim file (same file, not just the same number) and hold its lock."""
    held, _, fd = os.environ.get(CLAIM_ENV, "").partition(":")
    if held != str(port) or not fd.isdigit() or (path := _claim_file(port)) is None:
        return None
    try:
        if not os.path.samestat(os.fstat(int(fd)), os.stat(path)):
            return None
        fcntl.flock(int(fd), fcntl.LOCK_EX | fcntl.LOCK_NB)  # already held through this descriptor: a no-op
    except OSError:
        return None
    return PortClaim(port, int(fd), inherited=True)


def claim_free_range(lo: int = 10240, hi: int = 60000, tries: int = 64) -> PortClaim:
    """A claimed base port P with P, P+1, P+256, P+512 and P+768 all free, drawn at random ``RANGE`` apart."""
    bases = list(range(lo, hi - RANGE + 1, RANGE))
    random.SystemRandom().shuffle(bases)  # not the global generator: a seeded run (ms.set_seed) would pick the same
    for base in bases[:tries]:
        claim = try_claim(base)
        if claim is None:
            continue
        if all(port_free(base + off) for off in PORT_OFFSETS):
            return claim
        claim.release()
    raise TrainingError(message="no free port range for msrun found", hint="pass --master-port explicitly")


def claim_master_port(port: int) -> PortClaim:
    """``--master-port`` on the node that runs the scheduler: refused (`InputError`, exit 2) when a listener or
    another mftk job on this machine holds it, instead of msrun's scheduler failing minutes later."""
    check_master_port(port)
    claim = inherited_claim(port) or try_claim(port)
    if claim is None:
        raise InputError(message=f"--master-port {port} is claimed by another mftk job on this machine",
                         hint="pass another --master-port, or leave it out on one node (a free one is picked)")
    return claim


def check_master_port(port: int) -> None:
    """A port held by a listener (on any address) is refused; one in TIME_WAIT from an earlier job is not. The
    test binds every address with SO_REUSEADDR, as a listening server would."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError as exc:
            raise InputError(message=f"--master-port {port} is already in use on this machine "
                             f"({exc.strerror or exc})",
                             hint=f"pass another --master-port, or leave it out on one node (a free one is picked); "
                             f"`ss -ltnp 'sport = :{port}'` shows the process holding it") from None


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
