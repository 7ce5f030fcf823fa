"""A ``--master-port`` already in use ends the job at once (exit 2, naming the port), before msrun starts."""
from __future__ import annotations

import socket

import pytest
import yaml

from mftk.engine.launch import LaunchSpec, launch
from mftk.engine.ports import claim_free_range
from mftk.errors import InputError


@pytest.fixture
def busy_port():
    """A port with a listener on it (as another job's scheduler would hold it)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))  # any free port the kernel gives
    s.listen()
    yield s.getsockname()[1]
    s.close()


def test_busy_master_port_is_refused_before_msrun_starts(tmp_path, busy_port):
    with pytest.raises(InputError) as e:
        launch("tests.engine.parallel.jobs:fail_on", {}, spec=LaunchSpec(nproc=2, master_port=busy_port,
                                                                        log_dir=tmp_path / "logs"))
    assert f"--master-port {busy_port} is already in use" in e.value.message
    assert not (tmp_path / "logs").exists()  # nothing was launched


def test_free_master_port_passes_the_check(busy_port):
    from mftk.engine.ports import check_master_port

    with claim_free_range() as claim:
        check_master_port(claim.port)  # no error
    with pytest.raises(InputError):
        check_master_port(busy_port)


@pytest.mark.engine
def test_train_with_busy_master_port_exits_2_naming_it(tmp_path, corpus, busy_port):
    from commands.app import app
    from tests.helpers.cli import runner
    from tests.helpers.tiny import tiny_raw

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(tiny_raw("qwen3_tiny.yaml", corpus, tmp_path / "ckpt")))
    r = runner.invoke(app, ["train", str(cfg), "--nproc", "2", "--master-port", str(busy_port),
                            "--output-dir", str(tmp_path / "out")])
    assert r.exit_code == 2, r.output
    assert f"--master-port {busy_port} is already in use" in r.stderr and "Traceback" not in r.output
    assert not (tmp_path / "out" / "msrun_log").exists()
