"""One-process pieces of a job that owns its failures (issue 34): the fault injector's switch, the hang
watchdog's rules (who is blamed, which timeout), the heartbeat file, restart records and the YAML key."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import attrs
import pytest

from mftk.engine import faults
from mftk.engine.heartbeat import Beat, heartbeat_path, read_heartbeat
from mftk.engine.watchdog import DEFAULT_MIN_S, STARTUP_MIN_S, Watchdog
from mftk.errors import ConfigError, InputError, JobFault
from mftk.logs.restarts import Restart, describe, read_restarts, write_restart
from mftk.logs.format import parse_metrics_record


def test_fault_switch_parses_and_refuses_typos():
    got = faults.parse("rank:1,step:3,kind:exit; rank:0,step:5,kind:hang,attempt:1")
    assert got == [faults.Fault(1, 3, "exit", 0), faults.Fault(0, 5, "hang", 1)]
    for bad in ("rank:1,step:3,kind:explode", "rank:1,step:3", "rank:x,step:3,kind:exit", "rank:1,step:3,kind:exit,when:now"):
        with pytest.raises(InputError, match="MFTK_FAULT"):
            faults.parse(bad)


def test_fault_fires_only_on_its_rank_step_and_attempt():
    fs = faults.parse("rank:1,step:3,kind:raise,attempt:1")
    faults.Injector(fs, rank=1, attempt=0).before_step(3)  # another attempt: nothing
    faults.Injector(fs, rank=0, attempt=1).before_step(3)  # another rank: nothing
    inj = faults.Injector(fs, rank=1, attempt=1)
    inj.before_step(2)
    with pytest.raises(RuntimeError, match="injected failure on rank 1 at step 3"):
        inj.before_step(3)


def test_fault_exit_kills_the_process_with_code_3():
    code = ("from mftk.engine.faults import Injector, parse; "
            "Injector(parse('rank:0,step:1,kind:exit'), 0, 0).before_step(1); print('survived')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert r.returncode == 3 and "survived" not in r.stdout and "MFTK_FAULT firing" in r.stdout


def _beat(d, rank, step, phase, collectives=0, done=None):
    path = heartbeat_path(d, rank)
    path.write_text(json.dumps({"pid": 1, "step": step, "phase": phase, "collectives": collectives, "saves": 0,
                                "steps_done": step if done is None else done, "time": time.time()}))


def test_watchdog_blames_the_rank_not_waiting_in_a_collective(tmp_path):
    dog = Watchdog(tmp_path, [0, 1], timeout_s=10.0, started=0.0)
    _beat(tmp_path, 0, 4, "step", 40)
    _beat(tmp_path, 1, 4, "step", 40)
    assert dog.poll(1.0, set()) == []
    _beat(tmp_path, 0, 4, "collective", 41)  # rank 0 entered the next collective; rank 1 never did
    assert dog.poll(2.0, set()) == []
    assert dog.poll(11.5, set()) == [1]  # 10.5 s without change for rank 1, 9.5 s for rank 0
    assert dog.poll(12.5, set()) == [0, 1]
    fault = dog.hang_fault([0, 1], {0: "running", 1: "running"}, 12.5, {0: tmp_path / "w0", 1: tmp_path / "w1"})
    assert isinstance(fault, JobFault) and fault.kind == "hang" and fault.ranks == (1,)
    assert "rank 1 stopped making progress: last finished step 4" in fault.message
    assert "rank 0 waited for it in a collective" in fault.message and fault.step == 4
    d2 = tmp_path / "second"
    d2.mkdir()
    dog2 = Watchdog(d2, [0, 1], timeout_s=10.0, started=0.0)
    _beat(d2, 0, 4, "collective", 41)
    dog2.poll(0.5, set())  # rank 0's wait in a collective reached the parent first ...
    _beat(d2, 1, 4, "step", 40)
    dog2.poll(1.0, set())  # ... rank 1 (the one about to stop) was seen last at 1.0
    assert dog2.poll(10.8, set()) == [0]  # the waiting rank crossed the limit first ...
    assert dog2.hang_fault([0], {0: "running", 1: "running"}, 10.8, {}).ranks == (1,)  # ... the blame is rank 1's
    stopped = dog.hang_fault([0, 1], {0: "running", 1: "stopped"}, 12.5, {})
    assert stopped.ranks == (1,) and "rank 1 is stopped by a signal" in stopped.message


def test_watchdog_default_timeout_follows_the_measured_steps(tmp_path):
    dog = Watchdog(tmp_path, [0], timeout_s=None, started=0.0)
    assert dog.timeout_s() == DEFAULT_MIN_S
    _beat(tmp_path, 0, 0, "start-up")
    dog.poll(0.0, set())
    assert dog.poll(DEFAULT_MIN_S + 1, set()) == []  # before the first step: never under STARTUP_MIN_S
    assert dog.poll(STARTUP_MIN_S - 1, set()) == []
    _beat(tmp_path, 0, 7, "step", done=0)  # resumed at step 7: its first step is still start-up
    dog.poll(50.0, set())
    assert dog.poll(50.0 + DEFAULT_MIN_S + 1, set()) == [] and dog.startup_s is None
    _beat(tmp_path, 0, 1, "step")
    dog.poll(100.0, set())  # start-up took 100 s: the timeout is at least 200 s
    _beat(tmp_path, 0, 2, "step")
    dog.poll(130.0, set())  # a 30 s step: 10 x 30 = 300 s
    assert dog.startup_s == 100.0 and dog.slowest_step_s == 30.0 and dog.timeout_s() == 300.0
    assert dog.poll(429.0, set()) == [] and dog.poll(431.0, set()) == [0]
    assert dog.poll(431.0, {0}) == []  # a rank that reported done is not watched


def test_heartbeat_writes_progress_and_the_parent_reads_it(tmp_path):
    beat = Beat()
    beat.path = heartbeat_path(tmp_path, 3)
    beat.step_done(7)  # written at once
    assert read_heartbeat(beat.path)["step"] == 7
    prev = beat.enter_collective()
    beat.write()
    rec = read_heartbeat(beat.path)
    assert rec["phase"] == "collective" and rec["collectives"] == 1
    beat.leave_collective(prev)
    assert beat.phase == "step"
    assert read_heartbeat(tmp_path / "missing.json") is None


def test_restart_records_go_to_info_log_and_metrics_and_are_no_steps(tmp_path):
    r = Restart(attempt=1, max_restarts=3, reason="died", ranks=(1,), step_reached=5,
                resumed_from=str(tmp_path / "ckpt" / "iteration_00000004"), resumed_step=4, steps_lost=1,
                seconds_lost=12.5, message="worker 1 failed")
    d = tmp_path / "log" / "rank_0"
    write_restart(r, [d])
    info = (d / "info.log").read_text()
    assert "[WARNING]" in info and "mftk restart 1/3: reason died, rank 1, step reached 5" in info
    line = (d / "metrics.jsonl").read_text().splitlines()[0]
    assert parse_metrics_record(line) is None  # parse-log's step readers pass it by
    (rec,) = read_restarts([d / "info.log"])
    assert rec["reason"] == "died" and rec["steps_lost"] == 1 and rec["ranks"] == [1]
    assert read_restarts([tmp_path]) == [rec]
    assert describe(rec) == "#1: died of rank 1 after step 5, resumed from step 4 (1 steps, 12 s lost)"


def test_each_restart_of_a_multi_node_job_meets_on_a_port_of_its_own():
    """Attempt a of an `--nnodes 2` job: scheduler on master port + 2a (never the previous attempt's scheduler,
    which may still be alive on node 0), and workers that wait for it past the slower node's hang detection."""
    from mftk.engine.launch import LaunchSpec
    from mftk.engine.workers import attempt_spec

    spec = LaunchSpec(nproc=1, nnodes=2, node_rank=1, master_port=20480, hang_timeout_s=20.0)
    assert attempt_spec(spec, 0) == spec
    assert [attempt_spec(spec, a).master_port for a in (1, 2, 3)] == [20482, 20484, 20486]
    assert attempt_spec(spec, 1).cluster_time_out_s == 120 + 40
    assert attempt_spec(attrs.evolve(spec, hang_timeout_s=None), 1).cluster_time_out_s == 120 + 2 * STARTUP_MIN_S
    single = LaunchSpec(nproc=2)  # one node: a free port is picked for every launch
    assert attempt_spec(single, 2) == single


def test_hang_timeout_key_is_read_and_checked():
    from mftk.config.load import load_data
    from tests.helpers.tiny import tiny_raw

    raw = tiny_raw("qwen3_tiny.yaml", "corpus", __import__("pathlib").Path("/tmp/x/ckpt"))
    raw["mftk"] = {"hang_timeout_s": 90}
    one = load_data(raw, check_files=False)
    assert one.config.mftk.hang_timeout_s == 90
    assert any(p.path == "mftk.hang_timeout_s" and "no effect in a one-process run" in p.message for p in one.notes)
    two = load_data(raw, check_files=False, world_size=2)
    assert not any(p.path == "mftk.hang_timeout_s" for p in two.notes)
    raw["mftk"] = {"hang_timeout_s": 0}
    with pytest.raises(ConfigError) as info:
        load_data(raw, check_files=False)
    assert any(p.path == "mftk.hang_timeout_s" for p in info.value.problems)


def test_the_console_follows_the_last_pipeline_stage():
    """Ranks are laid out pipeline-outermost (derive.Layout.rank_coords): the last stage starts at (pp-1)·world/pp."""
    from types import SimpleNamespace

    from mftk.derive import layout_from_config
    from mftk.engine.workers import loss_rank

    for pp, world, expected in ((1, 2, 0), (2, 2, 1), (2, 4, 2), (4, 8, 6)):
        par = SimpleNamespace(tensor_parallel=1, pipeline_parallel=pp, context_parallel=1, data_parallel_shard=1,
                              expert_parallel=1, pipeline_parallel_interleave_num=1)
        assert loss_rank(SimpleNamespace(parallelism=par), world) == expected, (pp, world)
        layout = layout_from_config(par, world)
        assert layout.rank_coords(expected)["pp"] == pp - 1
        assert expected == 0 or layout.rank_coords(expected - 1)["pp"] == pp - 2


@pytest.mark.slow
def test_injected_nan_stops_a_one_process_run_at_its_step(tmp_path):
    import yaml

    from tests.helpers.hostile import ENV, ROOT, flat
    from tests.helpers.tiny import tiny_raw, write_corpus

    corpus = write_corpus(tmp_path / "corpus" / "tiny_text_document")
    (tmp_path / "q.yaml").write_text(yaml.safe_dump(tiny_raw("qwen3_tiny.yaml", corpus, tmp_path / "ckpt", steps=4)))
    r = subprocess.run([sys.executable, "-m", "mftk", "train", str(tmp_path / "q.yaml"), "--output-dir",
                        str(tmp_path / "out")], capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={**ENV, "MFTK_FAULT": "rank:0,step:2,kind:nan"})
    assert r.returncode == 4 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "is not finite at step 2" in flat(r.stderr)
    assert "TEST-ONLY FAULT INJECTION is active: rank 0 will nan at step 2" in r.stdout


def test_a_failed_collective_is_told_from_the_users_errors():
    from mftk.engine.watchdog import is_collective_failure

    for text in ("error in the forward/backward pass: AllReduce failed.", "AllGather failed.",
                 "RuntimeError: Broadcast failed", "ReduceScatter failed."):
        assert is_collective_failure(text), text
    for text in ("loss nan / grad_norm nan is not finite at step 3", "cannot read /data/x.bin: failed",
                 "save failed: disk full"):
        assert not is_collective_failure(text), text


@pytest.mark.parametrize("args, said", [(("--max-restarts", "2"), "--max-restarts need a multi-process job"),
                                        (("--hang-timeout", "30"), "--hang-timeout need a multi-process job"),
                                        (("--nproc", "2", "--no-join", "--max-restarts", "1"), "not --no-join")])
def test_fault_options_are_refused_where_they_would_do_nothing(tmp_path, args, said):
    from tests.helpers.hostile import assert_clean_failure, mftk

    (tmp_path / "q.yaml").write_text("model: {}\n")  # never read: the options are checked first
    r = mftk("train", str(tmp_path / "q.yaml"), *args)
    assert_clean_failure(r, 2, said)
