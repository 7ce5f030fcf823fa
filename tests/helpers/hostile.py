"""Shared pieces of the hostile-input suite (``tests/hostile/``): run mftk as a user would, and check
what every hostile case checks (the exit code, no traceback, what the message names)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

from mftk.engine.ports import PortClaim

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}

# A process that holds an output's lock (mftk.lock) until its stdin closes: the "other run".
HOLDER = textwrap.dedent("""
    import sys
    from mftk.lock import exclusive_output
    with exclusive_output(sys.argv[1], sys.argv[2]):
        print("held", flush=True)
        sys.stdin.read()
""")


def flat(text: str) -> str:
    """Whitespace collapsed: Rich wraps long messages at the terminal width."""
    return " ".join(text.split())


def mftk(*args: str, timeout: float = 300, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """``python -m mftk ARGS`` in a fresh process (a hang fails the test through ``timeout``)."""
    return subprocess.run([sys.executable, "-m", "mftk", *args], capture_output=True, text=True, cwd=cwd, env=ENV,
                          timeout=timeout)


def start_mftk(*args: str, cwd: Path = ROOT, new_session: bool = False, claim: PortClaim | None = None
               ) -> subprocess.Popen:
    """``python -m mftk ARGS`` started; ``claim``: a port claim handed to it (node 0 of a job on this host)."""
    return subprocess.Popen([sys.executable, "-m", "mftk", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=cwd, env={**ENV, **(claim.env if claim else {})},
                            pass_fds=claim.fds if claim else (), start_new_session=new_session)


def assert_clean_failure(r: subprocess.CompletedProcess, code: int, *names: str) -> str:
    """Exit ``code``, no traceback (nor a Rich markup error), and every one of ``names`` in the message."""
    out = r.stdout + r.stderr
    assert r.returncode == code, (r.returncode, out[-3000:])
    for bad in ("Traceback", "MarkupError", "RecursionError", "OverflowError"):
        assert bad not in out, out[-3000:]
    message = flat(r.stderr)
    for name in names:
        assert name in message, (name, message[-3000:])
    return message


def hold(path: Path, what: str) -> subprocess.Popen:
    """Start a process holding ``path``'s output lock; close its stdin (``release``) to let go."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), what], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=ROOT, env=ENV)
    assert holder.stdout.readline().strip() == "held"
    return holder


def release(holder: subprocess.Popen) -> None:
    holder.communicate("", timeout=30)


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that name ``text`` (a job's log dir): what a stop must not leave."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(p.info["cmdline"] or [])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if text in cmd and p.pid != os.getpid():
            found.append(f"{p.pid}: {cmd[:200]}")
    return found


def wait_for(path: Path, text: str, proc: subprocess.Popen, timeout: float = 240, count: int = 1) -> None:
    """Until ``path`` holds ``text`` ``count`` times; an AssertionError if ``proc`` exits first or time runs out
    (a generous deadline for something to happen, not a speed check)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text(errors="replace").count(text) >= count:
            return
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode} before {text!r} appeared: {proc.communicate()}")
        time.sleep(0.2)
    raise AssertionError(f"{text!r} never appeared in {path}")


def kill_under(base: str) -> None:
    """Kill every process (but this one) whose command line mentions ``base``: what a failing test left running."""
    for p in psutil.process_iter(["cmdline"]):
        try:
            if base in " ".join(p.info["cmdline"] or []) and p.pid != os.getpid():
                p.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
