"""A training job that owns its failures (issue 34): whatever kills the `mftk` parent or msrun takes every
process of the job with it while the save-path lock stays held; a stopped rank is found, named and its stack
dumped; `--max-restarts` brings a job that lost a worker and then hung back to the very bits of a run
that never failed. Real msrun jobs of the tiny Qwen3 (`--nproc 2`); each costs 30-150 s here.
"""
from __future__ import annotations

import errno
import fcntl
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from mftk.engine.launch import START_MARK
from tests.helpers.hostile import flat, kill_under, mftk, processes_mentioning, start_mftk, wait_for
from tests.helpers.tiny import tiny_raw, write_corpus

pytestmark = [pytest.mark.slow, pytest.mark.engine]
STEP = "{ step:["


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    d = tmp_path_factory.mktemp("faults")
    corpus = write_corpus(d / "corpus" / "tiny_text_document")
    raw = tiny_raw("qwen3_tiny.yaml", corpus, d / "ckpt", steps=10_000, gbs=2)
    raw["checkpoint"]["save_interleaved_steps"] = 10_000
    (d / "long.yaml").write_text(yaml.safe_dump(raw))
    raw = tiny_raw("qwen3_tiny.yaml", corpus, d / "ckpt_ref", steps=6, gbs=2)  # saves every 2 steps
    (d / "six.yaml").write_text(yaml.safe_dump(raw))
    return d


@pytest.fixture(autouse=True)
def _reap(tmp_path_factory):
    yield
    kill_under(str(tmp_path_factory.getbasetemp()))


def _lock_held(save_path: Path) -> bool:
    """True when another process holds the save path's flock (mftk.lock); never keeps it."""
    try:
        fd = os.open(str(save_path.resolve()) + ".lock", os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        assert exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
        return True
    finally:
        os.close(fd)
    return False


def _gone_with_lock_held(marker: str, save_path: Path, within: float = 10.0, parent: int | None = None) -> None:
    """Every process naming ``marker`` (but the ``parent``, which may report once its job is gone) ends within
    ``within`` s, and while any lives the lock is held."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        held = _lock_held(save_path)  # first the lock, then the processes: a lock let go early is caught
        alive = [a for a in processes_mentioning(marker) if not a.startswith(f"{parent}:")]
        if not alive:
            return
        assert held, f"the save path's lock was free while {alive} still ran"
        time.sleep(0.05)
    raise AssertionError(f"still alive {within} s later: {processes_mentioning(marker)}")


def _released(save_path: Path, within: float = 5.0) -> bool:
    """The lock is let go (a process that is exiting has lost its command line but may close its files later)."""
    deadline = time.monotonic() + within
    while _lock_held(save_path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _pid_of(log: Path) -> int:
    return int(log.read_text().split(f"{START_MARK} ", 1)[1].split("pid=", 1)[1].split()[0])


def _start_long(job: Path, name: str, *extra: str):
    logs = job / f"msrun_{name}"
    ckpt = job / f"ckpt_{name}"
    p = start_mftk("train", str(job / "long.yaml"), "--nproc", "2", "--output-dir", str(job / f"out_{name}"),
                   "--log-dir", str(logs), "--set", f"checkpoint.save_path={ckpt}", *extra)
    wait_for(logs / "worker_0.log", STEP, p)
    return p, logs, ckpt


def test_kill_9_of_the_parent_ends_every_process_of_the_job(job):
    p, logs, ckpt = _start_long(job, "k9p")
    assert _lock_held(ckpt) and len(processes_mentioning(str(logs))) >= 4  # msrun, scheduler, two workers
    p.kill()
    p.wait(timeout=30)
    _gone_with_lock_held(str(logs), ckpt)
    assert _released(ckpt)


def test_kill_9_of_msrun_ends_the_job_and_says_so(job):
    p, logs, ckpt = _start_long(job, "k9m")
    (msrun,) = [line.split(":", 1)[0] for line in processes_mentioning(str(logs)) if "launch msrun" in line]
    os.kill(int(msrun), signal.SIGKILL)
    _gone_with_lock_held(str(logs), ckpt, parent=p.pid)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 4 and "Traceback" not in err, err[-3000:]
    assert "the msrun launcher was killed (signal 9)" in flat(err)
    assert _released(ckpt)


@pytest.mark.parametrize("nproc, rank, layout", [(2, 1, ()), (4, 3, ("parallelism.pipeline_parallel=2",
                                                                        "parallelism.data_parallel_shard=1"))],
                         ids=["dp2", "pp2xdp2"])
def test_a_stopped_rank_is_found_named_and_its_stack_dumped(job, nproc, rank, layout):
    sets = [x for kv in layout for x in ("--set", kv)]
    logs = job / f"msrun_stop{nproc}"
    p = start_mftk("train", str(job / "long.yaml"), "--nproc", str(nproc), "--output-dir", str(job / f"out_stop{nproc}"),
                   "--log-dir", str(logs), "--set", f"checkpoint.save_path={job / f'ckpt_stop{nproc}'}",
                   "--hang-timeout", "20", *sets)
    wait_for(logs / f"worker_{rank}.log", STEP, p, count=2, timeout=400)
    os.kill(_pid_of(logs / f"worker_{rank}.log"), signal.SIGSTOP)
    out, err = p.communicate(timeout=120)
    text = flat(err)
    assert p.returncode == 4 and "Traceback" not in err, err[-3000:]
    # the watchdog's report; or, on a machine so busy that MindSpore's own ~30 s collective timeout came first,
    # the failed collective's, which names the stopped rank as well
    assert f"rank {rank} is stopped by a signal (SIGSTOP?)" in text, text[-1500:]
    assert ("waited for it in a collective" in text or "collective failed waiting for it" in text) and \
        text.count("is stopped by a signal") == 1
    if "hang detected" in text:  # the watchdog's own report names the timeout it used (no wall-clock bound here:
        assert "no progress for 20 s, the hang timeout" in text  # the rule's timing is test_watchdog's, by clock)
    for r in range(nproc):  # faulthandler's dump of every thread, in each worker's own log
        assert "most recent call first" in (logs / f"worker_{r}.log").read_text(errors="replace"), r
    assert processes_mentioning(str(logs)) == []


def _tensors(step_dir: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    out = {}
    for f in sorted(step_dir.glob("*.safetensors")):
        for name, value in load_file(str(f)).items():
            out[f"{f.name}:{name}"] = value
    return out


@pytest.mark.parametrize("nproc, dead, layout", [(2, 1, ()), (4, 3, ("parallelism.pipeline_parallel=2",
                                                                        "parallelism.data_parallel_shard=1"))],
                         ids=["dp2", "pp2xdp2"])
def test_max_restarts_recovers_a_death_then_a_hang_to_the_same_bits(job, nproc, dead, layout):
    """Rank ``dead`` exits as step 3 begins (resume from step 2), then rank 0 hangs at step 5 of the relaunch
    (resume from step 4): the job ends at step 6 with every tensor (weights and optimizer state) equal to the bit
    to those of the same job run without faults."""
    sets = [x for kv in layout for x in ("--set", kv)]
    ref_ckpt, ckpt = job / f"ckpt_ref{nproc}", job / f"ckpt_restarts{nproc}"
    ref = mftk("train", str(job / "six.yaml"), "--nproc", str(nproc), "--output-dir", str(job / f"out_ref{nproc}"),
               "--set", f"checkpoint.save_path={ref_ckpt}", *sets, timeout=600)
    assert ref.returncode == 0, ref.stderr[-3000:]
    from tests.helpers import hostile

    p = hostile.subprocess.Popen(
        [hostile.sys.executable, "-m", "mftk", "train", str(job / "six.yaml"), "--nproc", str(nproc),
         "--output-dir", str(job / f"out_restarts{nproc}"), "--set", f"checkpoint.save_path={ckpt}", *sets,
         "--max-restarts", "3", "--hang-timeout", "20"],
        stdout=hostile.subprocess.PIPE, stderr=hostile.subprocess.PIPE, text=True, cwd=hostile.ROOT,
        env={**hostile.ENV, "MFTK_FAULT": f"rank:{dead},step:3,kind:exit;rank:0,step:5,kind:hang,attempt:1"})
    out, err = p.communicate(timeout=1200)
    assert p.returncode == 0, (out[-2000:], err[-4000:])
    console = flat(out + err)
    said = [line for line in (out + err).splitlines() if "mftk restart" in line or "because:" in line]
    assert f"mftk restart 1/3: reason died, rank {dead}, step reached 2" in console, said
    assert "mftk restart 2/3: reason hang, rank 0, step reached 4" in console, said
    final_ref, final = ref_ckpt / "iteration_00000006", ckpt / "iteration_00000006"
    a, b = _tensors(final_ref), _tensors(final)
    assert sorted(a) == sorted(b) and any(k.startswith("checkpoint-opt") for k in a), sorted(a)[:8]
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].tobytes() == b[name].tobytes(), name
    log = job / f"out_restarts{nproc}" / "log" / "rank_0"
    info = (log / "info.log").read_text()
    assert "mftk restart 1/3: reason died" in info and "mftk restart 2/3: reason hang" in info
    import json

    records = [json.loads(x) for x in (log / "metrics.jsonl").read_text().splitlines() if '"event"' in x]
    assert [(r["reason"], r["ranks"], r["resumed_step"], r["steps_lost"]) for r in records] == [
        ("died", [dead], 2, 0), ("hang", [0], 4, 0)]
    parsed = mftk("parse-log", str(log / "metrics.jsonl"))
    assert parsed.returncode == 0, parsed.stderr[-2000:]
    assert f"#1: died of rank {dead} after step 2, resumed from step 2" in flat(parsed.stderr)
    assert "#2: hang of rank 0 after step 4, resumed from step 4" in flat(parsed.stderr)


def test_max_restarts_on_two_nodes_restarts_both_to_the_same_bits(job, node_port):
    """`--nnodes 2 --nproc 1` on this host, `--max-restarts 3` on each node: rank 1 (node 1) exits as step 3
    begins, then rank 0 (node 0) hangs at step 5 of the relaunch. Each node sees the fault (its own worker, or its
    collectives losing the other node), ends its part and relaunches; both meet on the attempt's port and resume
    the save path's same checkpoint (steps 2, then 4); the final checkpoint equals, to the bit, that of the
    uninterrupted job of the same two ranks on one node."""
    import json

    from tests.helpers import hostile

    ref_ckpt, ckpt = job / "ckpt_ref_nodes", job / "ckpt_restart_nodes"
    ref = mftk("train", str(job / "six.yaml"), "--nproc", "2", "--output-dir", str(job / "out_ref_nodes"),
               "--set", f"checkpoint.save_path={ref_ckpt}", timeout=600)
    assert ref.returncode == 0, ref.stderr[-3000:]
    port = str(node_port.port)
    env = {**hostile.ENV, **node_port.env, "MFTK_FAULT": "rank:1,step:3,kind:exit;rank:0,step:5,kind:hang,attempt:1"}
    nodes, consoles = [], [job / f"console_rn{i}.txt" for i in (0, 1)]
    for i in (0, 1):
        with open(consoles[i], "w") as console:  # files, not pipes: nothing blocks on a full pipe
            nodes.append(hostile.subprocess.Popen(
                [hostile.sys.executable, "-m", "mftk", "train", str(job / "six.yaml"), "--nproc", "1", "--nnodes",
                 "2", "--node-rank", str(i), "--master-addr", "127.0.0.1", "--master-port", port,
                 "--output-dir", str(job / f"out_rn{i}"), "--log-dir", str(job / f"msrun_rn{i}"),
                 "--set", f"checkpoint.save_path={ckpt}", "--max-restarts", "3", "--hang-timeout", "20"],
                stdout=console, stderr=hostile.subprocess.STDOUT, text=True, cwd=hostile.ROOT, env=env,
                pass_fds=node_port.fds))
    try:
        for p in nodes:
            p.wait(timeout=1200)
    finally:
        for p in nodes:
            if p.poll() is None:
                p.kill()
    texts = [c.read_text(errors="replace") for c in consoles]
    said = [[line for line in t.splitlines() if "mftk restart" in line or "because:" in line] for t in texts]
    assert [p.returncode for p in nodes] == [0, 0], (said, texts[0][-3000:], texts[1][-3000:])
    assert "mftk restart 1/3: reason died, rank 1, step reached 2" in flat(texts[1]), said
    assert "mftk restart 2/3: reason hang, rank 0, step reached 4" in flat(texts[0]), said
    for node, rank in ((0, 0), (1, 1)):  # each node logged both restarts, resuming the same steps as the other
        records = [json.loads(x) for x in (job / f"out_rn{node}" / "log" / f"rank_{rank}" / "metrics.jsonl")
                   .read_text().splitlines() if '"event"' in x]
        assert [(r["attempt"], r["resumed_step"]) for r in records] == [(1, 2), (2, 4)], (node, records)
    a, b = _tensors(ref_ckpt / "iteration_00000006"), _tensors(ckpt / "iteration_00000006")
    assert sorted(a) == sorted(b) and any(k.startswith("checkpoint-opt") for k in a), sorted(a)[:8]
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].tobytes() == b[name].tobytes(), name


def test_pipeline_console_follows_the_stage_that_logs_the_loss(job):
    """pp2 on two workers: rank 1 (the last stage) logs the loss; the console shows its lines, rank 0's
    info.log keeps the reference's `loss: N/A` line."""
    out = job / "out_pp"
    r = mftk("train", str(job / "six.yaml"), "--nproc", "2", "--output-dir", str(out), "--set",
             "parallelism.pipeline_parallel=2", "--set", "training.steps=2", "--set",
             f"checkpoint.save_path={job / 'ckpt_pp'}", timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    steps = [line for line in r.stdout.splitlines() if STEP in line]
    assert len(steps) == 2 and all("N/A" not in s and "loss:" in s for s in steps), steps
    assert "N/A" in (out / "log" / "rank_0" / "info.log").read_text()
    assert "last loss" in r.stderr + r.stdout and "N/A" not in (r.stderr + r.stdout).split("trained steps")[-1]


def test_kill_9_of_one_nodes_mftk_ends_both_nodes(job, node_port):
    """`--nnodes 2` on this host: node 1's `mftk` is killed; its workers go with it, and node 0's job, whose
    collectives now wait for a rank that is gone, ends (hang or failed collective, exit 4) instead of hanging."""
    port = str(node_port.port)
    common = ["train", str(job / "long.yaml"), "--nproc", "1", "--nnodes", "2", "--master-port", port,
              "--hang-timeout", "12", "--set", f"checkpoint.save_path={job / 'ckpt_nodes'}"]
    nodes = [start_mftk(*common, "--node-rank", str(i), "--output-dir", str(job / f"out_n{i}"),
                        "--log-dir", str(job / f"msrun_n{i}"), claim=node_port if i == 0 else None) for i in (0, 1)]
    try:
        wait_for(job / "msrun_n1" / "worker_1.log", STEP, nodes[1])
        nodes[1].kill()
        nodes[1].wait(timeout=30)
        _gone_with_lock_held(str(job / "msrun_n1"), job / "ckpt_nodes")  # node 0 holds the lock meanwhile too
        out, err = nodes[0].communicate(timeout=180)
    finally:
        for p in nodes:
            if p.poll() is None:
                p.kill()
    text = flat(err)
    assert nodes[0].returncode == 4 and "Traceback" not in err, err[-3000:]
    assert "hang detected" in text or "a peer rank stopped or died" in text, text[-2000:]
    assert processes_mentioning(str(job / "msrun_n0")) == [] and _released(job / "ckpt_nodes")
