"""`mftk train/resume --nproc 2` through msrun: the same losses and grad norms as one process with the same
global batch, per-rank checkpoints with metadata.json, bit-exact resume, resharding 2 → 1 and 1 → 2
(the latter as a simulated 2-node job), and a killed worker ending the job fast.

Each msrun job costs 20–35 s here, so every job runs once (module fixtures) and several tests read it; the
DeepSeek-V3 and balanced dp2 runs share one (`SharedJobs`).
The single-process references run in-process.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.helpers.msrun import SharedJobs, column, metrics, run_single
from tests.helpers.cli import runner

from commands.app import app
from tests.helpers.tiny import tiny_raw, write_corpus

pytestmark = [pytest.mark.slow, pytest.mark.engine]
ROOT = Path(__file__).resolve().parents[2]
REL = 1e-5


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("dist")
    corpus = write_corpus(d / "corpus" / "tiny_text_document")
    q = tiny_raw("qwen3_tiny.yaml", corpus, d / "ckpt_dp", steps=4, gbs=4)  # data_parallel_shard -1: FSDP over 2
    (d / "q.yaml").write_text(yaml.safe_dump(q))
    ds = tiny_raw("deepseek_v3_tiny.yaml", corpus, d / "ckpt_ds", steps=3, gbs=4)
    ds["parallelism"]["data_parallel_shard"] = 1  # pure DP: 2 replicas
    ds["checkpoint"]["enable_save"] = False
    (d / "ds.yaml").write_text(yaml.safe_dump(ds))
    bal = tiny_raw("qwen3_tiny.yaml", corpus, d / "ckpt_bal", steps=3, gbs=8)
    bal["train_dataset"]["balance_enabled"] = True
    bal["train_dataset"]["dataloader"]["config"]["create_compressed_eod_mask"] = True
    bal["parallelism"]["data_parallel_shard"] = 1
    bal["checkpoint"]["enable_save"] = False
    (d / "bal.yaml").write_text(yaml.safe_dump(bal))
    return {"dir": d, "q": q, "ds": ds, "bal": bal}


@pytest.fixture(scope="module")
def shared(work):
    """The DeepSeek-V3 dp2 and the balanced dp2 runs in one shared msrun job (each worker runs `mftk train
    --nproc 2`'s body per run); the CLI's own part is checked on the FSDP run."""
    d, jobs = work["dir"], SharedJobs(work["dir"])
    return lambda: jobs.results("2", 2, lambda: [{"config": str(d / "ds.yaml"), "output_dir": str(d / "out_ds2")},
                                                 {"config": str(d / "bal.yaml"), "output_dir": str(d / "out_bal")}])


@pytest.fixture(scope="module")
def single_q(work):
    d = work["dir"]
    return run_single(work["q"], d / "out_single", f"checkpoint.save_path={d / 'ckpt_single'}")


@pytest.fixture(scope="module")
def fsdp_q(work):
    d = work["dir"]
    r = runner.invoke(app, ["train", str(d / "q.yaml"), "--nproc", "2", "--output-dir", str(d / "out_dp")])
    assert r.exit_code == 0, r.output
    return r


def test_fsdp2_matches_single_process(work, single_q, fsdp_q):
    out = work["dir"] / "out_dp"
    m = metrics(out)
    assert [r["step"] for r in m] == [1, 2, 3, 4]
    np.testing.assert_allclose(column(m, "loss"), single_q.losses, rtol=REL)
    np.testing.assert_allclose(column(m, "grad_norm"), single_q.grad_norms, rtol=REL)
    assert len(metrics(out, rank=1)) == 4  # every rank logs under log/rank_<r>
    assert "Got parallelism settings: data_parallel=2(dp_shard[2] * dp_replicate[1])" in fsdp_q.stdout
    assert sum("{ step:[" in line for line in fsdp_q.stdout.splitlines()) == 4  # rank 0's lines, echoed once
    assert (out / "msrun_log" / "worker_0.log").is_file() and (out / "msrun_log" / "worker_1.log").is_file()


def test_multi_process_checkpoint_layout(work, fsdp_q):
    step = work["dir"] / "ckpt_dp" / "iteration_00000004"
    names = sorted(p.name for p in step.iterdir())
    assert names == ["checkpoint-model-0000000-0000002.safetensors", "checkpoint-model-0000001-0000002.safetensors",
                     "checkpoint-opt-0000000-0000002.safetensors", "checkpoint-opt-0000001-0000002.safetensors",
                     "common.json", "metadata.json", "mftk-config.json", "mftk-state-0000000-0000002.json",
                     "mftk-state-0000001-0000002.json"]
    meta = json.loads((step / "metadata.json").read_text())["state_dict_metadata"]
    emb = meta["embedding.word_embeddings.weight"]
    assert emb["global_shape"] == [256, 64] and emb["axis_fragmentations"] == [2, 1]
    assert [c["local_shape"] for c in emb["chunk"]] == [[128, 64], [128, 64]]
    assert meta["adam_m.embedding.word_embeddings.weight"]["axis_fragmentations"] == [2, 1]  # optimizer sharded too
    assert meta["global_step"]["axis_fragmentations"] == [1]
    r = runner.invoke(app, ["inspect-ckpt", str(step), "--verify"])
    assert r.exit_code == 0, r.output


@pytest.fixture(scope="module")
def resumed_2(work, fsdp_q):
    d = work["dir"]
    r = runner.invoke(app, ["resume", str(d / "q.yaml"), "--from", str(d / "ckpt_dp" / "iteration_00000002"),
                            "--nproc", "2", "--output-dir", str(d / "out_resume2"),
                            "--set", f"checkpoint.save_path={d / 'ckpt_resume2'}"])
    assert r.exit_code == 0, r.output
    return metrics(d / "out_resume2")


def test_resume_with_two_processes_is_bit_exact(work, resumed_2):
    full = metrics(work["dir"] / "out_dp")
    assert [r["step"] for r in resumed_2] == [3, 4]
    assert column(resumed_2, "loss").tolist() == column(full[2:], "loss").tolist()
    assert column(resumed_2, "grad_norm").tolist() == column(full[2:], "grad_norm").tolist()


def test_balanced_resume_reads_each_shard_once_and_is_bit_exact(work, resumed_2):
    """Scenario 4: `load_balanced: true` gives the unbalanced resume's losses bit for bit, each rank reading
    about half of the checkpoint's bytes from disk (the rest arrives by broadcast)."""
    import re

    d = work["dir"]
    r = runner.invoke(app, ["resume", str(d / "q.yaml"), "--from", str(d / "ckpt_dp" / "iteration_00000002"),
                            "--nproc", "2", "--output-dir", str(d / "out_balanced"),
                            "--set", f"checkpoint.save_path={d / 'ckpt_balanced'}",
                            "--set", "checkpoint.load_balanced=true"])
    assert r.exit_code == 0, r.output
    m = metrics(d / "out_balanced")
    assert [x["step"] for x in m] == [3, 4]
    assert column(m, "loss").tolist() == column(resumed_2, "loss").tolist()
    assert column(m, "grad_norm").tolist() == column(resumed_2, "grad_norm").tolist()
    read, totals = [], set()
    for rank in (0, 1):
        text = (d / "out_balanced" / "log" / f"rank_{rank}" / "info.log").read_text()
        found = re.findall(rf"Balanced load: rank {rank} read .*?\((\d+) of (\d+) bytes", text)
        assert len(found) == 1, text[-2000:]
        read.append(int(found[0][0]))
        totals.add(int(found[0][1]))
    (total,) = totals
    step = d / "ckpt_dp" / "iteration_00000002"
    meta = json.loads((step / "metadata.json").read_text())["state_dict_metadata"]
    assert sum(read) == total == sum(4 * int(np.prod(t["global_shape"])) for n, t in meta.items()
                                     if n != "global_step") + 8  # fp32 tensors once each + int64 global_step
    assert all(0.4 * total <= b <= 0.6 * total for b in read), read


def test_reshard_two_processes_to_one(work, single_q, fsdp_q):
    d = work["dir"]
    res = run_single(work["q"], d / "out_resume1", f"checkpoint.save_path={d / 'ckpt_resume1'}",
                     resume_from=d / "ckpt_dp" / "iteration_00000002")
    assert res.resume.saved_world == 2 and res.resume.world == 1
    assert any("Resharding" in n for n in res.resume.notes)
    np.testing.assert_allclose(res.losses, single_q.losses[2:], rtol=REL)
    np.testing.assert_allclose(res.grad_norms, single_q.grad_norms[2:], rtol=REL)


def test_deepseek_dp2_syncs_moe_losses_and_expert_bias(work, shared):
    d = work["dir"]
    single = run_single(work["ds"], d / "out_ds1")
    shared()
    assert "dp_shard[1] * dp_replicate[2]" in (d / "out_ds2" / "log" / "rank_0" / "info.log").read_text()
    dp, one = metrics(d / "out_ds2"), metrics(d / "out_ds1")
    assert len(dp) == 3  # step 3 is the first whose routing depends on the synced expert-bias update
    for key in ("loss", "grad_norm", "load_balancing_loss", "mtp_1_loss"):
        np.testing.assert_allclose(column(dp, key), column(one, key), rtol=REL, err_msg=key)
    np.testing.assert_allclose(column(dp, "loss"), single.losses, rtol=REL)


def _mftk(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mftk", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def test_two_nodes_resume_a_single_process_checkpoint(work, single_q, node_port):
    """Two `--nnodes 2` invocations form one 2-worker job; it reshards a 1-process checkpoint to 2."""
    d = work["dir"]
    port = node_port.port
    common = ["resume", str(d / "q.yaml"), "--from", str(d / "ckpt_single" / "iteration_00000002"), "--nproc", "1",
              "--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", str(port), "--output-dir",
              str(d / "out_nodes"), "--set", f"checkpoint.save_path={d / 'ckpt_nodes'}"]
    nodes = [_mftk(*common, "--node-rank", str(i), "--log-dir", str(d / f"msrun_node{i}"),
                   env={**os.environ, **node_port.env}, pass_fds=node_port.fds) for i in (0, 1)]
    outs = [p.communicate(timeout=240) for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], outs
    assert (d / "msrun_node0" / "worker_0.log").is_file() and (d / "msrun_node1" / "worker_1.log").is_file()
    m = metrics(d / "out_nodes")
    assert "Resharding: saved by 1 process, loading into 2" in outs[0][0]
    np.testing.assert_allclose(column(m, "loss"), single_q.losses[2:], rtol=REL)
    np.testing.assert_allclose(column(m, "grad_norm"), single_q.grad_norms[2:], rtol=REL)
    assert sorted(p.name for p in (d / "ckpt_nodes" / "iteration_00000004").glob("*-model-*")) == [
        "checkpoint-model-0000000-0000002.safetensors", "checkpoint-model-0000001-0000002.safetensors"]


def test_killed_worker_ends_the_job_with_its_rank(work):
    d = work["dir"]
    log_dir = d / "msrun_kill"
    p = _mftk("train", str(d / "q.yaml"), "--nproc", "2", "--output-dir", str(d / "out_kill"), "--log-dir",
              str(log_dir), "--set", "training.steps=500", "--set", "checkpoint.enable_save=false")
    try:
        deadline, pid = time.monotonic() + 150, None
        while time.monotonic() < deadline and pid is None:
            log = log_dir / "worker_1.log"
            text = log.read_text(errors="replace") if log.exists() else ""
            if "{ step:[" in text:
                pid = int(text.split("MFTK_WORKER_START rank=1 pid=", 1)[1].split()[0])
            time.sleep(0.3)
        assert pid is not None, "worker 1 never reached a step"
        os.kill(pid, signal.SIGKILL)
        _, err = p.communicate(timeout=120)  # ended by the failure report (exit 4), not by this deadline
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 4, err
    assert "worker 1 failed" in err and "exited with code -9" in err


def test_balanced_dp2_moves_micro_batches_between_ranks_and_keeps_the_losses(work, shared):
    """train_dataset.balance_enabled at dp 2: each step's micro-batches are redistributed, the step's gradient
    (mean over all of them) is the one-process run's."""
    d, raw = work["dir"], work["bal"]
    shared()
    one = run_single(dict(raw, train_dataset={**raw["train_dataset"], "balance_enabled": False}), d / "out_bal1")
    got = metrics(d / "out_bal")
    np.testing.assert_allclose(column(got, "loss"), one.losses, rtol=REL)
    np.testing.assert_allclose(column(got, "grad_norm"), one.grad_norms, rtol=REL)
