"""Two mftk jobs on one machine never run on the same msrun port range (`engine.ports`): a range is claimed
with a lock that another process sees, for as long as the job's processes live."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from mftk.engine import ports
from mftk.errors import InputError, TrainingError

BASE = 40960  # the tests' own range: port_free is patched, so whether these ports are in use does not matter


@pytest.fixture(autouse=True)
def private_claims(tmp_path, monkeypatch):
    monkeypatch.setenv(ports.LOCK_DIR_ENV, str(tmp_path / "claims"))
    monkeypatch.setattr(ports, "port_free", lambda port: True)
    monkeypatch.setattr(ports, "check_master_port", lambda port: None)


def _other_job(call: str) -> subprocess.Popen:
    """Another process that claims a range (``call``), prints its port and holds the claim until stdin closes."""
    code = textwrap.dedent(f"""
        import sys
        from mftk.engine import ports
        ports.port_free = lambda port: True
        ports.check_master_port = lambda port: None
        claim = {call}
        print(claim.port, flush=True)
        sys.stdin.read()
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    assert line.strip().isdigit(), line
    p.port = int(line)
    return p


def _end(p: subprocess.Popen) -> None:
    p.stdin.close()
    p.wait(timeout=30)


def test_a_range_claimed_by_another_job_is_never_picked():
    other = _other_job(f"ports.claim_free_range({BASE}, {BASE + ports.RANGE})")  # one base: it takes it
    try:
        assert other.port == BASE
        with pytest.raises(TrainingError, match="no free port range"):
            ports.claim_free_range(BASE, BASE + ports.RANGE)
        with ports.claim_free_range(BASE, BASE + 2 * ports.RANGE) as mine:  # two bases: it gets the other
            assert mine.port == BASE + ports.RANGE
    finally:
        _end(other)
    with ports.claim_free_range(BASE, BASE + ports.RANGE) as mine:  # the other job is over: its range is free
        assert mine.port == BASE


def test_an_explicit_master_port_claimed_by_another_job_is_refused():
    other = _other_job(f"ports.claim_master_port({BASE})")
    try:
        with pytest.raises(InputError, match=f"--master-port {BASE} is claimed by another mftk job"):
            ports.claim_master_port(BASE)
    finally:
        _end(other)
    ports.claim_master_port(BASE).release()


def test_a_released_claim_frees_its_port():
    with ports.claim_free_range(BASE, BASE + ports.RANGE) as first:
        port = first.port
    claim = ports.try_claim(port)
    assert claim is not None and claim.fds and ports.try_claim(port) is None
    claim.release()
    assert claim.fds == () and ports.try_claim(port) is not None


def test_an_unusable_claim_directory_falls_back_to_the_free_check(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv(ports.LOCK_DIR_ENV, str(blocker / "claims"))  # cannot be made: under a file
    with ports.claim_free_range(BASE, BASE + ports.RANGE) as claim:
        assert claim.port == BASE and claim.fds == ()


def _node_0(env: dict[str, str], fds: tuple[int, ...] = ()) -> str:
    """A process that claims ``--master-port BASE`` twice (a job's two attempts) and prints what it got."""
    code = textwrap.dedent(f"""
        from mftk.engine import ports
        from mftk.errors import InputError
        ports.check_master_port = lambda port: None
        try:
            for attempt in (0, 1):
                with ports.claim_master_port({BASE}) as claim:
                    print(attempt, claim.inherited, bool(claim.fds))
        except InputError as exc:
            print("refused:", exc.message)
    """)
    return subprocess.run([sys.executable, "-c", code], env=env, pass_fds=fds, capture_output=True, text=True,
                          timeout=60, check=True).stdout


def test_a_claim_handed_to_node_0_is_taken_over_and_a_forged_one_is_not(tmp_path):
    """The test (a launcher) holds the claim while it starts node 0: handed down (``claim.env``/``fds``), node 0
    takes it over, for both attempts; without it, or with the variable naming another file's descriptor, node 0
    finds the port claimed by another job."""
    import os

    base_env = {**os.environ, ports.LOCK_DIR_ENV: str(tmp_path / "claims")}
    with ports.claim_master_port(BASE) as held, ports.try_claim(BASE + ports.RANGE) as other:
        assert held.env == {ports.CLAIM_ENV: f"{BASE}:{held.fd}"}
        assert _node_0({**base_env, **held.env}, held.fds).split("\n")[:2] == ["0 True True", "1 True True"]
        assert _node_0(base_env).startswith(f"refused: --master-port {BASE} is claimed by another mftk job")
        forged = {**base_env, ports.CLAIM_ENV: f"{BASE}:{other.fd}"}  # a descriptor, but of another port's file
        assert _node_0(forged, other.fds).startswith("refused:")
    assert _node_0(base_env).split("\n")[:2] == ["0 False True", "1 False True"]  # the holder is done: free
