"""Stopping a job (issue 21, item 1): SIGTERM and Ctrl-C reach every msrun worker, the job saves and
exits 75 as documented, and nothing is left running.

Real msrun jobs, as few and as small as the cases allow (each costs 15–40 s here): `train --nproc 2`
stopped during start-up, `resume --nproc 2` stopped by Ctrl-C, a 2-node job stopped on node 0, the
quick-start stopped during its train stage, and a double Ctrl-C. Each checks the exit code, that no
traceback is printed, what the message names, the checkpoint on disk, and that no msrun, scheduler
or worker process outlives the command.
"""
from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import yaml

from mftk.ckpt.inspect import inspect_checkpoint
from tests.helpers.hostile import flat, kill_under, processes_mentioning, start_mftk, wait_for
from tests.helpers.tiny import tiny_raw, write_corpus

pytestmark = [pytest.mark.slow, pytest.mark.engine]
START = "MFTK_WORKER_START"
STEP = "{ step:["


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    d = tmp_path_factory.mktemp("signals")
    corpus = write_corpus(d / "corpus" / "tiny_text_document")
    raw = tiny_raw("qwen3_tiny.yaml", corpus, d / "ckpt", steps=10_000, gbs=2)
    raw["checkpoint"]["save_interleaved_steps"] = 10_000  # only the signal saves
    (d / "q.yaml").write_text(yaml.safe_dump(raw))
    return d


def _finish(proc, timeout: float = 180) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, err


@pytest.fixture(autouse=True)
def _reap(tmp_path_factory):
    """Whatever a failing test leaves running under the test dirs is killed (then the test fails on it)."""
    yield
    kill_under(str(tmp_path_factory.getbasetemp()))


def _no_leftovers(marker: str) -> None:
    deadline = time.monotonic() + 15
    while processes_mentioning(marker) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_mentioning(marker) == []


def _saved(err: str, signal_name: str) -> tuple[int, Path]:
    text = flat(err)
    assert "Traceback" not in err and f"{signal_name} received: the job stopped after step " in text, err[-3000:]
    step = int(text.split("the job stopped after step ", 1)[1].split(",")[0])
    path = Path(text.split("checkpoint saved to ", 1)[1].split()[0])
    assert path.name == f"iteration_{step:08d}" and "continue with: mftk resume" in text
    assert sorted(p.name for p in path.glob("*-model-*")) == [
        "checkpoint-model-0000000-0000002.safetensors", "checkpoint-model-0000001-0000002.safetensors"]
    assert inspect_checkpoint(path, verify=True).problems == []
    assert int((path.parent / "latest_checkpointed_iteration.txt").read_text()) == step
    return step, path


def test_sigterm_during_start_up_reaches_every_worker(job):
    """The signal comes as the workers start (before any has a handler of the trainer's): it is kept, the
    job runs its first step, saves it and exits 75."""
    logs = job / "msrun_a"
    p = start_mftk("train", str(job / "q.yaml"), "--nproc", "2", "--output-dir", str(job / "out_a"),
                   "--log-dir", str(logs))
    wait_for(logs / "worker_1.log", START, p)
    p.send_signal(signal.SIGTERM)
    code, _, err = _finish(p)
    assert code == 75, err[-3000:]
    step, path = _saved(err, "SIGTERM")
    assert step == 1 and path == job / "ckpt" / "iteration_00000001"
    _no_leftovers(str(logs))
    assert not (job / "ckpt.lock").exists()


def test_ctrl_c_under_msrun_saves_then_exits_75(job):
    """`resume --nproc 2` continuing that checkpoint; Ctrl-C (SIGINT to the command) once it trains."""
    logs = job / "msrun_b"
    p = start_mftk("resume", str(job / "q.yaml"), "--nproc", "2", "--output-dir", str(job / "out_b"),
                   "--log-dir", str(logs))
    wait_for(logs / "worker_0.log", STEP, p, count=2)
    p.send_signal(signal.SIGINT)
    code, out, err = _finish(p)
    assert code == 75, err[-3000:]
    step, _ = _saved(err, "SIGINT")
    assert step >= 3 and "step:[    2/10000]" in out  # it resumed after step 1 and went on
    _no_leftovers(str(logs))


def test_sigterm_to_node_0_of_a_two_node_job(job, node_port):
    """Two "nodes" on this host (one worker each): node 0's parent gets SIGTERM; both nodes stop and save."""
    port = str(node_port.port)
    common = ["train", str(job / "q.yaml"), "--nproc", "1", "--nnodes", "2", "--master-port", port,
              "--new-run", "--set", f"checkpoint.save_path={job / 'ckpt_nodes'}"]
    nodes = [start_mftk(*common, "--node-rank", str(i), "--output-dir", str(job / f"out_n{i}"),
                        "--log-dir", str(job / f"msrun_n{i}"), claim=node_port if i == 0 else None) for i in (0, 1)]
    try:
        wait_for(job / "msrun_n1" / "worker_1.log", STEP, nodes[1])
        nodes[0].send_signal(signal.SIGTERM)
        results = [_finish(p) for p in nodes]
    finally:
        for p in nodes:
            if p.poll() is None:
                p.kill()
    assert [r[0] for r in results] == [75, 75], [r[2][-2000:] for r in results]
    step, path = _saved(results[0][2], "SIGTERM")
    assert path.parent == job / "ckpt_nodes"
    assert f"stopped after step {step}" in flat(results[1][2])  # node 1 stopped at the same step
    for i in (0, 1):
        _no_leftovers(str(job / f"msrun_n{i}"))


def test_quickstart_passes_sigterm_to_its_train_stage(tmp_path):
    work = tmp_path / "qs"
    p = start_mftk("quickstart", "--workdir", str(work), "--nproc", "2", "--steps", "5000", "--max-chars", "20000",
                   "--vocab-size", "512")
    worker = work / "output" / "msrun_log" / "worker_0.log"
    wait_for(worker, STEP, p, timeout=300)
    p.send_signal(signal.SIGTERM)
    code, out, err = _finish(p)
    assert code == 75, err[-3000:]
    text = flat(err)
    assert "Traceback" not in err and "SIGTERM received: the job stopped after step" in text
    assert "stage 5/6 failed (exit code 75)" in text and "`mftk train` was stopped by a signal (exit code 75)" in text
    assert "6/6" not in out
    saved = sorted(work.rglob("iteration_*"))
    assert saved and inspect_checkpoint(saved[-1], verify=True).problems == []
    _no_leftovers(str(work))


def test_a_second_ctrl_c_stops_the_job_at_once(job):
    logs = job / "msrun_c"
    p = start_mftk("train", str(job / "q.yaml"), "--nproc", "2", "--output-dir", str(job / "out_c"),
                   "--log-dir", str(logs), "--new-run", "--set", f"checkpoint.save_path={job / 'ckpt_c'}")
    wait_for(logs / "worker_1.log", START, p)
    p.send_signal(signal.SIGINT)
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    code, _, err = _finish(p, timeout=120)  # the job's own 'interrupted' exit, not this deadline, ends it
    assert code == 130 and "interrupted" in err and "Traceback" not in err, err[-2000:]
    _no_leftovers(str(logs))
