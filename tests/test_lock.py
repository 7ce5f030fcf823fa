"""mftk.lock: one writer per output, across threads of one process and across processes."""
from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mftk import lock as lockmod
from mftk.errors import InputError
from mftk.lock import exclusive_output, lock_path, read_holder

ROOT = Path(__file__).resolve().parents[1]

HOLDER = textwrap.dedent("""
    import sys
    from mftk.lock import exclusive_output
    with exclusive_output(sys.argv[1], "test output"):
        print("held", flush=True)
        sys.stdin.read()
""")


def _hold_in_child(path: Path) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert child.stdout.readline().strip() == "held"
    return child


def test_held_records_holder_and_is_removed_after(tmp_path):
    out = tmp_path / "out"
    with exclusive_output(out, "test output") as info:
        assert info.path == tmp_path / "out.lock" and info.took_over_stale is None
        record = json.loads(info.path.read_text())
        assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
        assert record["what"] == "test output" and record["started"]
    assert not lock_path(out).exists()


def test_second_writer_in_same_process_is_refused(tmp_path):
    out = tmp_path / "out"
    with exclusive_output(out, "test output"):
        with pytest.raises(InputError) as e:
            with exclusive_output(out, "test output"):
                pass
    assert f"pid {os.getpid()} on host {socket.gethostname()}, started " in e.value.message
    assert "another run is writing this output" in e.value.message and "wait for it" in e.value.hint
    assert not lock_path(out).exists()  # the refused attempt did not remove the holder's file early


def test_released_on_exception(tmp_path):
    with pytest.raises(RuntimeError):
        with exclusive_output(tmp_path / "o", "x"):
            raise RuntimeError
    with exclusive_output(tmp_path / "o", "x"):
        pass


def test_other_process_is_named(tmp_path):
    out = tmp_path / "out"
    child = _hold_in_child(out)
    try:
        with pytest.raises(InputError) as e:
            with exclusive_output(out, "test output"):
                pass
        assert f"pid {child.pid} on host " in e.value.message and "(test output)" in e.value.message
    finally:
        child.communicate("")
    assert child.returncode == 0 and not lock_path(out).exists()
    with exclusive_output(out, "test output"):  # free again once the holder exits
        pass


def test_lock_of_killed_process_is_stale_and_taken_over(tmp_path):
    out = tmp_path / "out"
    child = _hold_in_child(out)
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert lock_path(out).exists() and read_holder(lock_path(out)).pid == child.pid
    with exclusive_output(out, "test output") as info:
        assert info.took_over_stale is not None and info.took_over_stale.pid == child.pid
    assert not lock_path(out).exists()


def test_without_flock_support_the_file_is_the_lock(tmp_path, monkeypatch):
    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(lockmod.fcntl, "flock", no_flock)
    out = tmp_path / "out"
    with exclusive_output(out, "test output"):
        with pytest.raises(InputError, match=f"pid {os.getpid()} on host"):
            with exclusive_output(out, "test output"):
                pass
    assert not lock_path(out).exists()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that no longer exists on this host
    lock_path(out).write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "started": "then"}))
    with exclusive_output(out, "test output") as info:
        assert info.took_over_stale.pid == dead.pid
    lock_path(out).write_text(json.dumps({"pid": os.getppid(), "host": socket.gethostname(), "started": "now"}))
    with pytest.raises(InputError, match=f"pid {os.getppid()}"):  # alive: not stale
        with exclusive_output(out, "test output"):
            pass


def test_unwritable_place_is_an_input_error(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="cannot create the lock file"):
        with exclusive_output(tmp_path / "file" / "sub" / "out", "x"):
            pass
