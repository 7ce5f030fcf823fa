"""The msrun launcher: results come back, a failing or killed worker ends the job within seconds
with that rank's error, nothing is left running, and bad arguments are refused up front."""
from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest

from mftk.engine.launch import LaunchSpec, build_msrun_command, launch
from mftk.engine.ports import claim_free_range, port_free
from mftk.errors import InputError, TrainingError


def _mftk_workers() -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "mftk.engine.launch" in cmd and str(os.getpid()) in _env_parent(p):
            out.append(p)
    return out


def _env_parent(p: psutil.Process) -> str:
    try:
        return p.environ().get("MFTK_TEST_PARENT", "")
    except (psutil.Error, OSError):
        return ""


@pytest.mark.slow
@pytest.mark.engine
def test_failing_rank_ends_job_fast_with_its_error(tmp_path):
    with pytest.raises(TrainingError) as info:
        launch("tests.engine.parallel.jobs:fail_on", {"rank_to_fail": 1, "message": "planted"},
               spec=LaunchSpec(nproc=2, log_dir=tmp_path), timeout_s=120,
               env={"MFTK_TEST_PARENT": str(os.getpid())})
    err = info.value
    assert err.message.startswith("worker 1 failed")
    assert "ValueError: planted on rank 1" in err.message
    assert "jobs.py" in err.message  # the traceback tail, not just the summary
    assert str(tmp_path / "worker_1.log") in err.hint
    assert (tmp_path / "worker_0.log").exists() and (tmp_path / "worker_1.log").exists()
    time.sleep(0.5)
    assert _mftk_workers() == []  # rank 0 was blocked in a collective: it must have been killed


@pytest.mark.slow
@pytest.mark.engine
def test_killed_worker_is_reported(tmp_path):
    """A worker that dies without a traceback (SIGKILL) is found through msrun's own report."""

    def killer():
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            log = tmp_path / "worker_1.log"
            if log.exists() and "MFTK_WORKER_START" in log.read_text(errors="replace"):
                pid = int(log.read_text().split("pid=", 1)[1].split()[0])
                time.sleep(1.0)
                os.kill(pid, signal.SIGKILL)
                return
            time.sleep(0.2)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    with pytest.raises(TrainingError, match=r"worker 1 failed.*exited with code -9"):
        launch("tests.engine.parallel.jobs:fail_on", {"rank_to_fail": -1},
               spec=LaunchSpec(nproc=2, log_dir=tmp_path), timeout_s=120,
               env={"MFTK_TEST_PARENT": str(os.getpid())})
    t.join()
    time.sleep(0.5)
    assert _mftk_workers() == []


def test_bad_target_and_shape_are_refused_before_starting(tmp_path):
    with pytest.raises(InputError, match="package.module:function"):
        launch("no_colon", spec=LaunchSpec(nproc=2, log_dir=tmp_path))
    with pytest.raises(InputError, match="node_rank=2"):
        launch("a:b", spec=LaunchSpec(nproc=2, nnodes=2, node_rank=2, master_port=20000, log_dir=tmp_path))
    with pytest.raises(InputError, match="--master-port"):
        launch("a:b", spec=LaunchSpec(nproc=2, nnodes=2, node_rank=1, log_dir=tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_free_port_leaves_room_for_msruns_worker_ports():
    with claim_free_range() as claim:  # held while checked: no other job on this machine can take it meanwhile
        assert all(port_free(claim.port + off) for off in (0, 1, 256, 512, 768))
        assert claim.port % 1024 == 0


def test_msrun_command_single_and_multi_node(tmp_path):
    single = build_msrun_command(LaunchSpec(nproc=4), 21504, tmp_path, "m:f", tmp_path / "p.json")
    assert single[single.index("--worker_num") + 1] == "4" and "--node_rank" not in single
    assert single[-8:] == ["python", "-m", "mftk.engine.launch", "worker", "--target", "m:f", "--payload",
                           str(tmp_path / "p.json")]
    multi = build_msrun_command(LaunchSpec(nproc=2, nnodes=2, node_rank=1, master_addr="10.0.0.1", master_port=21504),
                                21504, tmp_path, "m:f", tmp_path / "p.json")
    assert multi[multi.index("--worker_num") + 1] == "4" and multi[multi.index("--local_worker_num") + 1] == "2"
    assert multi[multi.index("--node_rank") + 1] == "1" and multi[multi.index("--master_addr") + 1] == "10.0.0.1"


def test_a_ranks_own_error_is_blamed_before_peers_found_dead_as_msrun_ends_the_job(tmp_path):
    # the case a busy machine produced: rank 1 raised, msrun ended rank 0 (found gone, no traceback) before its
    # log said whose exit came first. Rank 1's own exception is the cause; a collective that failed on a dead
    # peer is not, and a worker msrun reports exited first (not the one that raised) still is
    from mftk.engine.launch import _Watcher

    def watcher(errors, dead_ranks=(), dead_pid=None):
        w = _Watcher({0: tmp_path / "w0.log", 1: tmp_path / "w1.log"}, tmp_path / "msrun.log", follow_rank=0,
                     on_line=None)
        w.pids, w.errors, w.dead_ranks, w.dead_pid, w.dead_code = {100: 0, 101: 1}, dict(errors), set(dead_ranks), dead_pid, -9
        return w

    assert watcher({1: "ValueError: planted on rank 1"}, dead_ranks={0}).failure() == (1, "ValueError: planted on rank 1")
    assert watcher({1: "ValueError: planted on rank 1"}, dead_ranks={0}, dead_pid=101).failure()[0] == 1
    rank, reason = watcher({1: "RuntimeError: AllReduce failed: peer closed"}, dead_ranks={0}).failure()
    assert rank == 0 and "died" in reason
    rank, reason = watcher({1: "ValueError: planted on rank 1"}, dead_pid=100).failure()
    assert rank == 0 and "exited with code -9" in reason


@pytest.mark.slow
@pytest.mark.engine
def test_a_jobs_port_range_is_claimed_while_its_workers_run_and_freed_after(tmp_path, monkeypatch):
    """Another mftk job starting meanwhile on this machine cannot pick the same range (`engine.ports`)."""
    from mftk.engine.ports import LOCK_DIR_ENV, try_claim

    monkeypatch.setenv(LOCK_DIR_ENV, str(tmp_path / "claims"))
    result = launch("tests.engine.parallel.jobs:port_claim_held", {}, spec=LaunchSpec(nproc=2, log_dir=tmp_path / "l"),
                    timeout_s=120)
    assert [result.results[r] for r in (0, 1)] == [{"port": result.master_port, "held": True, "inherited": True}] * 2
    claim = try_claim(result.master_port)
    assert claim is not None and claim.fds  # released with the job
    claim.release()
